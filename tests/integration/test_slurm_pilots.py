"""Pilots as Slurm batch jobs, end to end, on the real test cluster (tests/fixtures/slurm.py).

A whole stack (api, projector, controller as processes), a site whose agent runs as
``lode site start`` with ``scheduler: {type: slurm}``, and the user's side through ``lode
queue`` and the SDK. The site agent submits pilots with ``sbatch``; a pilot inside a 3-node
allocation (machine ``generic-slurm``: nodes from ``SLURM_JOB_NODELIST``, tasks started with
``srun``) runs the site's serial jobs; ``squeue`` states become batch-job events; ``lode queue
rm`` is an ``scancel``; a rejected script is a ``batch.submit_failed`` in Slurm's words; and
(slow) a pilot whose batch job reaches its one-minute wall time times its job out with the
cause named, for the next pilot to run again.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import psycopg
import pytest

from lodestream.infra.postgres.server import EmbeddedPostgres
from tests.fixtures.slurm import SlurmCluster
from tests.support.slurm_site import (
    SITE,
    SlurmSite,
    batch_in,
    jobs_in,
    running_slurm_site,
    until,
)

SLOW_FIRST = '''
from lodestream.agents.site.apps import ApplicationDefinition


class SlowFirst(ApplicationDefinition):
    """Outlasts its first pilot; done at once on its next attempt."""

    name = "slowfirst"
    command_template = (
        'if [ "$LODE_JOB_ATTEMPT" -lt 2 ]; then sleep {{ seconds }}; fi; echo done > done.txt'
    )
'''


@pytest.fixture(scope="module")
def slurm_site(
    slurm_cluster: SlurmCluster,
    tmp_path_factory: pytest.TempPathFactory,
    postgres_server: EmbeddedPostgres,
) -> Iterator[SlurmSite]:
    root = tmp_path_factory.mktemp("slurm-pilots")
    with running_slurm_site(slurm_cluster, root, postgres_server,
                            apps={"slowfirst.py": SLOW_FIRST},
                            app_names=("hello", "slowfirst")) as site:  # fmt: skip
        yield site


@pytest.fixture
def site(slurm_site: SlurmSite) -> Iterator[SlurmSite]:
    yield slurm_site
    slurm_site.slurm.cancel_all()


def test_a_pilot_in_a_three_node_slurm_allocation_runs_the_sites_serial_jobs(
    site: SlurmSite,
) -> None:
    submitted = site.client.submit_jobs([
        {"site": SITE, "app": "hello", "workdir": f"three/{i}", "parameters": {"who": str(i)}}
        for i in range(6)
    ])  # fmt: skip
    jobs = [j["id"] for j in submitted["jobs"]]
    batch = site.submit_pilot("--num-nodes", "3", "--wall-time-min", "5")

    running = until("the pilot's batch job runs", lambda: batch_in(site, batch, "running"), site)
    assert running["scheduler"] == "slurm"
    scheduler_id = running["scheduler_id"]
    assert site.slurm.job_state(int(scheduler_id)) in {"RUNNING", "COMPLETING", "COMPLETED"}
    until("the jobs finished", lambda: jobs_in(site, jobs, "JOB_FINISHED"), site)
    ended = until("the idle pilot ended its batch job",
                  lambda: batch_in(site, batch, "finished"), site)  # fmt: skip
    assert (ended["exit_code"], ended["scheduler_state"]) == (0, "finished")
    assert site.slurm.jobcomp()[scheduler_id]["JobState"] == "COMPLETED"
    listed = site.queue_ls()[batch]
    assert (listed["state"], listed["scheduler_id"], listed["num_nodes"]) == (
        "finished", scheduler_id, 3,
    )  # fmt: skip

    with psycopg.connect(site.stack.database_url) as conn:
        [(nodes,)] = conn.execute(
            "SELECT nodes FROM rm.sessions WHERE batch_job_id = %s", (batch,)
        ).fetchall()
        placed = conn.execute(
            "SELECT DISTINCT p->>'hostname' FROM rm.job_events e, "
            "jsonb_array_elements(e.data->'placement') p "
            "WHERE e.type = 'job.started' AND e.job_id = ANY(%s::uuid[])", (jobs,),
        ).fetchall()  # fmt: skip
    assert sorted(n["hostname"] for n in nodes) == ["n1", "n2", "n3"]
    assert {row[0] for row in placed} <= {"n1", "n2", "n3"}
    assert (site.site_dir / "data" / "three" / "5" / "greeting.txt").read_text() == "hello 5\n"


def test_lode_queue_rm_cancels_the_slurm_job(site: SlurmSite) -> None:
    batch = site.submit_pilot("--wall-time-min", "5")
    running = until("the pilot's batch job runs", lambda: batch_in(site, batch, "running"), site)

    assert site.lode("queue", "rm", batch).strip() == f"{batch}: deletion_requested"

    ended = until("the deleted batch job ended", lambda: batch_in(site, batch, "finished"), site)
    assert ended["scheduler_state"] == "cancelled"
    state = site.slurm.job_state(int(running["scheduler_id"]))
    assert state is not None
    assert state.startswith("CANCELLED")


def test_a_script_slurm_refuses_is_a_submit_failure_in_slurms_words(site: SlurmSite) -> None:
    batch = site.submit_pilot("--queue", "nosuchqueue", "--wall-time-min", "5")

    failed = until("the refusal was recorded",
                   lambda: batch_in(site, batch, "submit_failed"), site)  # fmt: skip
    assert "invalid partition specified" in failed["reason"].lower()
    listed = site.queue_ls()[batch]
    assert listed["state"] == "submit_failed"
    assert listed["scheduler_id"] is None


@pytest.mark.slow
def test_a_pilot_at_its_wall_time_times_its_job_out_and_the_next_pilot_reruns_it(
    site: SlurmSite,
) -> None:
    [job] = [j["id"] for j in site.client.submit_jobs([
        {"site": SITE, "app": "slowfirst", "workdir": "slow", "parameters": {"seconds": "600"}}
    ])["jobs"]]  # fmt: skip
    first = site.submit_pilot("--wall-time-min", "1")
    # The control: a plain job with the same one-minute wall time, which this cluster's Slurm
    # ends TIMEOUT (checked at the end). Submitted here so that its wait is the pilot's: a
    # test of its own spent another 60-70 s on the same minute.
    control = site.slurm.sbatch("#!/bin/bash\nexec sleep 600\n", time=1, output="/dev/null")
    running = until("the pilot's batch job runs", lambda: batch_in(site, first, "running"), site)
    until("the pilot started the job", lambda: jobs_in(site, [job], "RUNNING"), site)

    until("the wall time drained the job",
          lambda: site.client.get_job(job)["state"] in {"RESTART_READY", "RUN_TIMEOUT"}, site,
          timeout_s=150)  # fmt: skip
    events = site.client.job_events(job)
    [timed_out] = [e for e in events if e["type"] == "job.run_timed_out"]
    cause = timed_out["data"]["cause"]
    assert cause[0].endswith("drained: wall time reached") or cause[0].endswith("drained: stopped")
    assert cause[1] == f"batch job {first} (slurm {running['scheduler_id']}): walltime_expired"
    ended = until("the batch job ended", lambda: batch_in(site, first, "finished"), site)
    # The batch job says what the job's cause says, whether the pilot drained ahead of
    # Slurm's kill (Slurm: COMPLETED, exit 0) or Slurm's kill came first (TIMEOUT).
    assert ended["scheduler_state"] == "walltime_expired"
    slurm_state = site.slurm.jobcomp()[running["scheduler_id"]]["JobState"]
    assert slurm_state in {"COMPLETED", "TIMEOUT"}
    if slurm_state == "COMPLETED":
        assert ended["reason"].endswith("; its pilot drained at its wall time"), ended

    second = site.submit_pilot("--wall-time-min", "5")
    until("the next pilot ran the job", lambda: jobs_in(site, [job], "JOB_FINISHED"), site)
    started = [e["data"]["session_id"] for e in site.client.job_events(job)
               if e["type"] == "job.started"]  # fmt: skip
    assert len(started) == 2
    with psycopg.connect(site.stack.database_url) as conn, contextlib.closing(conn.cursor()) as c:
        c.execute("SELECT batch_job_id FROM rm.sessions WHERE id = ANY(%s::uuid[])", (started,))
        assert {str(row[0]) for row in c.fetchall()} == {first, second}

    # Slurm itself ends a job at this wall time: what the pilot drained ahead of.
    assert site.slurm.wait_state(control, {"TIMEOUT"}, timeout=150) == "TIMEOUT"
    record = site.slurm.jobcomp()[str(control)]
    assert record["JobState"] == "TIMEOUT"
    assert record["TimeLimit"] == "1"
