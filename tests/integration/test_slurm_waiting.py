"""Why a pilot or a job waits, told where the user looks, on the real test cluster (issue 31).

A batch job Slurm holds carries Slurm's pending reason (``lode queue ls``'s "waiting for",
checked against ``squeue``), recorded once per change; a job a pilot of a shared partition can
never run (one CPU per node) gets one ``job.placement_refused`` in its history and says so
in ``lode job show``, and a pilot asked for whole nodes (``-o exclusive=``) runs it.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

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


@pytest.fixture(scope="module")
def slurm_site(
    slurm_cluster: SlurmCluster,
    tmp_path_factory: pytest.TempPathFactory,
    postgres_server: EmbeddedPostgres,
) -> Iterator[SlurmSite]:
    root = tmp_path_factory.mktemp("slurm-waiting")
    with running_slurm_site(slurm_cluster, root, postgres_server,
                            scheduler={"request_options": ["exclusive"]}) as site:  # fmt: skip
        yield site


@pytest.fixture
def site(slurm_site: SlurmSite) -> Iterator[SlurmSite]:
    yield slurm_site
    slurm_site.slurm.cancel_all()


def squeue_reason(site: SlurmSite, scheduler_id: str) -> str:
    for job in site.slurm.squeue_json()["jobs"]:
        if str(job["job_id"]) == scheduler_id:
            return str(job.get("state_reason") or "")
    return ""


def test_a_pilot_slurm_holds_shows_slurms_pending_reason(site: SlurmSite) -> None:
    batch = site.submit_pilot("--num-nodes", "5", "--wall-time-min", "5")  # the partition has 3

    def agreeing() -> dict[str, object] | None:
        job = batch_in(site, batch, "queued")
        # The independent source: what squeue says of the same job now. Slurm 22.05 says
        # PartitionConfig first, then PartitionNodeLimit: each change reaches the batch job.
        if job and job["reason"] and job["reason"] == squeue_reason(site, job["scheduler_id"]):
            return job
        return None

    held = until("the batch job's reason is squeue's", agreeing, site)
    assert held["reason"] in {"PartitionConfig", "PartitionNodeLimit"}
    site.env["COLUMNS"] = "400"  # the table whole, not cut to a terminal's width
    listed = site.lode("queue", "ls", "--site", SITE)
    assert "PartitionConfig" in listed or "PartitionNodeLimit" in listed
    time.sleep(3)  # six syncs more: the batch job still says what squeue says
    until("the batch job's reason is squeue's still", agreeing, site)


def job_history(site: SlurmSite, job: str) -> list[dict[str, object]]:
    return list(site.client.job_events(job))


def test_a_job_no_pilot_can_run_says_why_once_and_a_whole_node_pilot_runs_it(
    site: SlurmSite,
) -> None:
    [job] = [j["id"] for j in site.client.submit_jobs([
        {"site": SITE, "app": "hello", "workdir": "wide/1", "parameters": {"who": "w"},
         "threads_per_rank": 2},
    ])["jobs"]]  # fmt: skip
    site.submit_pilot("--wall-time-min", "5")  # a shared node: one CPU

    refused = until("the pilot refused the job on record",
                    lambda: [e for e in job_history(site, job)
                             if e["type"] == "job.placement_refused"], site)  # fmt: skip
    shown = site.client.get_job(job)
    assert shown["state"] == "PREPROCESSED"
    assert "needs 2 cpus" in shown["last_error"]
    assert "no pilot takes it" in " ".join(site.lode("job", "show", job).split())
    time.sleep(12)  # the pilot is offered it again (every 5 s) and refuses it again
    again = [e for e in job_history(site, job) if e["type"] == "job.placement_refused"]
    assert len(again) == len(refused) == 1

    site.submit_pilot("--wall-time-min", "5", "-o", "exclusive=")
    until("a whole-node pilot ran it", lambda: jobs_in(site, [job], "JOB_FINISHED"), site)
    assert site.client.get_job(job)["last_error"] is None
