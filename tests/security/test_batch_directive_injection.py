"""Issue 29, finding 2, from outside: a batch-job option value cannot add Slurm directives.

The audit's exploit: a site that lets requests set ``comment`` and ``mail-user``, and one user's
token. ``lode queue submit -o 'comment=x --export=ALL,BASH_ENV=$(touch${IFS}FILE)'`` rendered
``#SBATCH --comment=x --export=ALL,BASH_ENV=$(...)``; sbatch read ``--export`` from the line and
bash ran the command when the pilot started. Here a real Slurm (tests/fixtures/slurm.py) and a
whole stack: the API refuses the request (422, naming the option) and appends nothing, and a
request forged onto the log past the API is refused by the site agent (``submit_failed``) before
any script is written. Neither run the payload.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from lodestream.client.errors import ApiError
from lodestream.eventlog import EventLog
from lodestream.infra.postgres.server import EmbeddedPostgres
from lodestream.schemas.batch import request_batch_job
from lodestream.schemas.events.batch import BatchRequestData
from tests.fixtures.slurm import SlurmCluster
from tests.security.attack import control_connection, stored
from tests.support.slurm_site import (
    OWNER,
    SITE,
    SlurmSite,
    running_slurm_site,
    until,
)

ALLOWED = ("comment", "mail-user")


def payload(marker: Path) -> str:
    return f"x --export=ALL,BASH_ENV=$(touch${{IFS}}{marker})"


@pytest.fixture(scope="module")
def slurm_site(
    slurm_cluster: SlurmCluster,
    tmp_path_factory: pytest.TempPathFactory,
    postgres_server: EmbeddedPostgres,
) -> Iterator[SlurmSite]:
    root = tmp_path_factory.mktemp("directive-injection")
    with running_slurm_site(slurm_cluster, root, postgres_server,
                            scheduler={"request_options": list(ALLOWED)}) as site:  # fmt: skip
        yield site


@pytest.fixture
def site(slurm_site: SlurmSite) -> Iterator[SlurmSite]:
    yield slurm_site
    slurm_site.slurm.cancel_all()


def batch_refused(site: SlurmSite, batch: str) -> dict[str, Any] | None:
    """The batch job once it is ``submit_failed``; None before (not yet projected, or not yet
    decided). Any other end fails at once: the request was acted on."""
    try:
        job = site.client.get_batch_job(batch)
    except ApiError as exc:
        if exc.status == 404:
            return None
        raise
    assert job["state"] in {"requested", "submit_failed"}, job
    return job if job["state"] == "submit_failed" else None


async def batch_events(site: SlurmSite) -> list[str]:
    async with control_connection(site.stack) as js:
        return [m.subject for m in await stored(js, [f"evt.{SITE}.batch.>"])]


def test_the_api_refuses_an_option_value_that_would_add_directives(
    site: SlurmSite, tmp_path: Path
) -> None:
    marker = tmp_path / "pwned"
    before = asyncio.run(batch_events(site))
    headers = site.stack.auth(OWNER)
    with httpx.Client(base_url=site.stack.api_url, headers=headers, timeout=30) as api:
        for option in ALLOWED:
            body = {"num_nodes": 1, "wall_time_min": 5, "options": {option: payload(marker)}}
            refused = api.post(f"/sites/{SITE}/batch-jobs", json=body)
            assert refused.status_code == 422, refused.text
            message = refused.json()["error"]["message"]
            assert f"options.{option}: cannot reach the scheduler as one word" in message
            assert "' ' is not one of letters, digits" in message
    # The audit's own command line is refused the same way, in the user's terminal.
    cli = subprocess.run(
        [sys.executable, "-m", "lodestream.client.cli.main", "queue", "submit", "--site", SITE,
         "--wall-time-min", "5", "-o", f"comment={payload(marker)}"],
        env=site.env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert cli.returncode != 0
    assert "options.comment" in cli.stdout + cli.stderr

    assert asyncio.run(batch_events(site)) == before  # nothing appended
    assert site.client.list_batch_jobs(SITE) == []
    assert site.slurm.active_jobs() == []
    assert not marker.exists()


def test_the_site_agent_refuses_such_a_request_forged_onto_the_log(
    site: SlurmSite, tmp_path: Path
) -> None:
    marker = tmp_path / "pwned"
    # The event's own schema still reads what older APIs accepted: the agent must refuse it.
    data = BatchRequestData(num_nodes=1, wall_time_min=5, job_mode="serial",
                            options={"comment": payload(marker)})  # fmt: skip
    event = request_batch_job(SITE, data, actor=f"user:{OWNER}")

    async def forge() -> None:
        async with control_connection(site.stack) as js:
            await EventLog(js).append(event, expect=0)

    asyncio.run(forge())
    batch = str(event.aggregate_id)
    failed = until("the agent refused the request", lambda: batch_refused(site, batch), site)
    assert failed["reason"].startswith("option comment 'x --export=ALL,BASH_ENV=$(touch")
    assert "' ' is not one of letters, digits" in failed["reason"]
    assert failed["scheduler_id"] is None
    assert not (site.site_dir / "batch" / f"pilot-{batch}.sh").exists()
    assert site.slurm.active_jobs() == []
    assert not marker.exists()
