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
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest

from lodestream.client.config import ClientConfig
from lodestream.client.sdk import LodeClient
from lodestream.infra.postgres.server import EmbeddedPostgres
from tests.fixtures.slurm import SlurmCluster
from tests.support.site import make_site_dir
from tests.support.stack import Stack, kill_strays, running_stack, terminate

SITE, OWNER = "alpha", "ada"
SLOW_FIRST = '''
from lodestream.agents.site.apps import ApplicationDefinition


class SlowFirst(ApplicationDefinition):
    """Outlasts its first pilot; done at once on its next attempt."""

    name = "slowfirst"
    command_template = (
        'if [ "$LODE_JOB_ATTEMPT" -lt 2 ]; then sleep {{ seconds }}; fi; echo done > done.txt'
    )
'''


@dataclass
class SlurmSite:
    stack: Stack
    slurm: SlurmCluster
    site_dir: Path
    client: LodeClient
    env: dict[str, str]  # for `lode` commands: the API and the user's token

    def lode(self, *args: str) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "lodestream.client.cli.main", *args], env=self.env,
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert done.returncode == 0, f"lode {' '.join(args)}: {done.stdout}{done.stderr}"
        return done.stdout

    def queue_ls(self) -> dict[str, dict[str, Any]]:
        return {job["id"]: job for job in json.loads(self.lode("queue", "ls", "--json"))}

    def submit_pilot(self, *options: str) -> str:
        out = self.lode("queue", "submit", "--site", SITE, *options)
        return out.split()[0]

    def pilot_output(self) -> str:
        logs = sorted((self.site_dir / "batch").glob("pilot-*.*.*"))
        agent = self.stack.log_text("site-agent")[-3000:]
        return "\n".join([*(p.read_text()[-2000:] for p in logs), "--- agent", agent])


def until(what: str, check: Callable[[], Any], site: SlurmSite, timeout_s: float = 90) -> Any:
    deadline = time.monotonic() + timeout_s
    while not (found := check()):
        if time.monotonic() > deadline:
            pytest.fail(f"{what} within {timeout_s:g} s\n{site.pilot_output()}")
        time.sleep(0.2)
    return found


def batch_in(site: SlurmSite, batch: str, *states: str) -> dict[str, Any] | None:
    job = site.client.get_batch_job(batch)
    return job if job["state"] in states else None


def jobs_in(site: SlurmSite, ids: list[str], state: str) -> bool:
    return all(site.client.get_job(i)["state"] == state for i in ids)


@pytest.fixture(scope="module")
def slurm_site(
    slurm_cluster: SlurmCluster,
    tmp_path_factory: pytest.TempPathFactory,
    postgres_server: EmbeddedPostgres,
) -> Iterator[SlurmSite]:
    root = tmp_path_factory.mktemp("slurm-pilots")
    with running_stack(root / "stack", postgres_server) as stack:
        settings = make_site_dir(
            root / "sites", SITE, wss_url=stack.websocket_url, ca_file=stack.ca_file,
            seed_file=stack.seed_files[SITE],
            scheduler={"type": "slurm", "queue": "debug", "sync_interval_s": 0.5,
                       "jobcomp_path": str(slurm_cluster.jobcomp_path)},
            machine="generic-slurm", virtual_nodes=1, cores_per_node=None, idle_ttl_s=3,
        )  # fmt: skip
        (settings.apps_dir / "slowfirst.py").write_text(SLOW_FIRST)
        # The agent runs Slurm's commands: it needs the cluster's SLURM_CONF, and its pilots
        # (started by sbatch with the submitting environment) inherit it.
        with stack.log_path("site-agent").open("ab") as log:
            agent = subprocess.Popen(
                [sys.executable, "-m", "lodestream.client.cli.main", "site", "start",
                 str(settings.directory)],
                env=slurm_cluster.env, stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip
        token = stack.auth(OWNER)["Authorization"].removeprefix("Bearer ")
        client = LodeClient(ClientConfig(stack.api_url, token))
        env = {**os.environ, "LODE_API_URL": stack.api_url, "LODE_TOKEN": token}
        site = SlurmSite(stack, slurm_cluster, settings.directory, client, env)
        try:
            until("the agent registered the apps",
                  lambda: {"hello", "slowfirst"} <= {a["name"] for a in client.list_apps(SITE)},
                  site)  # fmt: skip
            yield site
        finally:
            client.close()
            terminate(agent)
            slurm_cluster.cancel_all()
            kill_strays(root)


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
    assert ended["scheduler_state"] in {"finished", "walltime_expired"}

    second = site.submit_pilot("--wall-time-min", "5")
    until("the next pilot ran the job", lambda: jobs_in(site, [job], "JOB_FINISHED"), site)
    started = [e["data"]["session_id"] for e in site.client.job_events(job)
               if e["type"] == "job.started"]  # fmt: skip
    assert len(started) == 2
    with psycopg.connect(site.stack.database_url) as conn, contextlib.closing(conn.cursor()) as c:
        c.execute("SELECT batch_job_id FROM rm.sessions WHERE id = ANY(%s::uuid[])", (started,))
        assert {str(row[0]) for row in c.fetchall()} == {first, second}
