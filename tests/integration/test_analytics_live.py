"""Analytics of a real run, read from the live stream.

A stack (nats-server, Postgres, projector, controller, api) and a real pilot of site
``alpha`` (two virtual nodes) run eight short sleeper jobs and one that fails; then:

* the summary is computed from ``EVENTS`` over the control plane's connection;
* ``lode analytics summary --json`` computes it again as a user does, over wss with the
  user's monitoring credential;
* ``lode analytics export`` copies the log the same way, and ``summary --from-file`` of the
  copy gives exactly the figures of the live read, as does ``summary --control-plane``.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any, Final

import pytest

from lodestream.client.analytics.figures.latency import StageTable
from lodestream.client.analytics.figures.pilot import PilotOverhead
from lodestream.client.analytics.load import load_stream
from lodestream.client.analytics.selection import Selection
from lodestream.client.analytics.summary import Summary, summarize
from lodestream.client.credential import MonitorCredential
from lodestream.infra.postgres.server import EmbeddedPostgres
from lodestream.natsconn import connect
from lodestream.services.embedded.credentials import CredentialSync
from tests.security.attack import api_client
from tests.support.processes import TEST_HEARTBEAT_TTL_S, terminate
from tests.support.stack import SITE_OWNERS, Stack, running_stack

pytestmark = pytest.mark.slow

ADA: Final = SITE_OWNERS["alpha"]
SLEEPERS: Final = 8
WAIT_S: Final = 90.0


async def run_workload(stack: Stack) -> None:
    async with api_client(stack) as api:
        jobs = [await api.submit(ADA, "alpha", wait=False, app="sleeper",
                                 parameters={"seconds": "0.3"}, tags={"n": str(n)})
                for n in range(SLEEPERS)]  # fmt: skip
        failing = await api.submit(ADA, "alpha", app="fails", parameters={"why": "disk full"})
        pilot = stack.pilot("alpha", "pilot-analytics")
        try:
            for job in jobs:
                await api.wait_state(ADA, job, "JOB_FINISHED", timeout_s=WAIT_S)
            # No site agent runs here to decide on a retry: the failed run stays RUN_ERROR.
            await api.wait_state(ADA, failing, "RUN_ERROR", timeout_s=WAIT_S)
        finally:
            terminate(pilot)  # the pilot closes its session on the way out


async def control_plane_summary(stack: Stack) -> Summary:
    """The summary once the site's log has settled: the pilot's session ended, and nothing
    more came for twice the heartbeat TTL (the controller may still note the expiry of the
    session's last heartbeat), so every read below sees the same log."""
    nc = await connect(stack.nats_settings())
    try:
        async with asyncio.timeout(WAIT_S):
            last: int | None = -1
            while True:
                loaded = await load_stream(nc, Selection.of(sites=["alpha"]))
                sessions = loaded.timelines.sessions.values()
                ended = bool(sessions) and all(s.ended_at is not None for s in sessions)
                if ended and loaded.intake.last_seq == last:
                    return summarize(loaded)
                last = loaded.intake.last_seq if ended else -1
                await asyncio.sleep(2 * TEST_HEARTBEAT_TTL_S)
    finally:
        await nc.close()


def monitoring_credential(stack: Stack, path: Path) -> None:
    """Ada's credential, registered with the API and applied to nats-server."""
    import httpx  # noqa: PLC0415

    credential = MonitorCredential.new(stack.websocket_url, stack.ca_file)
    response = httpx.put(f"{stack.api_url}/users/me/monitoring-key", headers=stack.auth(ADA),
                         json={"public_key": credential.public_key}, timeout=30)  # fmt: skip
    assert response.status_code == 200, response.text
    credential.save(path)
    sync = CredentialSync(stack.nats, stack.database_url, stack.control_user,
                          stack.control_password)  # fmt: skip
    assert sync.sync_once()


def lode(stack: Stack, *args: str) -> str:
    env = {**os.environ, "LODE_API_URL": stack.api_url, "LODE_TOKEN": stack.tokens[ADA],
           # What --control-plane reads (an operator's settings, as for `lode projector`).
           "NATS_URL": stack.client_url, "LODE_NATS__USER": stack.control_user,
           "LODE_NATS__PASSWORD": stack.control_password}  # fmt: skip
    argv = [sys.executable, "-m", "lodestream.client.cli.main", "analytics", *args]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    return done.stdout


def test_the_summary_of_a_real_run_from_the_live_stream(
    tmp_path: Path, postgres_server: EmbeddedPostgres
) -> None:
    with running_stack(tmp_path / "stack", postgres_server) as stack:
        asyncio.run(run_workload(stack))
        summary = asyncio.run(control_plane_summary(stack))
        credential = tmp_path / "monitor.json"
        monitoring_credential(stack, credential)
        common = ["--credential", str(credential), "--state-dir", str(tmp_path / ".lode")]
        live: dict[str, Any] = json.loads(lode(stack, "summary", "--json", *common))
        copy = tmp_path / "copy.jsonl"
        lode(stack, "export", "--out", str(copy), *common)
        copied: dict[str, Any] = json.loads(lode(stack, "summary", "--json",
                                                 "--from-file", str(copy)))  # fmt: skip
        # A copy of one app's jobs: the failing one, each of its events, the sessions whole.
        only = tmp_path / "fails.jsonl"
        lode(stack, "export", "--out", str(only), "--app", "fails", *common)
        only_fails: dict[str, Any] = json.loads(lode(stack, "summary", "--json",
                                                     "--from-file", str(only)))  # fmt: skip
        live_fails: dict[str, Any] = json.loads(lode(stack, "summary", "--json", "--app",
                                                     "fails", *common))  # fmt: skip
        operator: dict[str, Any] = json.loads(lode(stack, "summary", "--json", "--control-plane",
                                                   "--site", "alpha", "--state-dir",
                                                   str(tmp_path / ".lode")))  # fmt: skip

    # What the run was, as the control plane's replay folds it.
    assert summary.jobs_by_state == {"JOB_FINISHED": SLEEPERS, "RUN_ERROR": 1}
    assert summary.intake.skipped == 0
    assert summary.sessions == 1
    stages = summary.stages
    assert isinstance(stages, StageTable)
    assert stages.finished_jobs == SLEEPERS
    run = stages.row("run").spread
    assert run is not None
    assert run.n == SLEEPERS
    assert run.min >= 0.3  # a run spans at least its sleep
    assert stages.row("stage in").skipped == SLEEPERS  # sleeper has no staging
    pilot = summary.pilot
    assert isinstance(pilot, PilotOverhead)
    assert pilot.runs == SLEEPERS + 1
    # The pilot records its own stamps (RunResultData.profile): every run is measured by them.
    for step in ("lease → start", "spawn → start", "run end → reported"):
        assert pilot.row(step).stamped == SLEEPERS + 1, step
    u = summary.utilization
    assert u.provisioned_node_s > 0
    assert 0 < u.busy_node_s <= u.provisioned_node_s
    (failure,) = summary.failures
    assert failure.type == "job.run_errored"
    assert failure.return_codes == (3,)
    assert "disk full" in failure.example
    assert isinstance(summary.little, tuple)
    (little,) = summary.little
    assert (little.site, little.jobs, little.completed) == ("alpha", SLEEPERS + 1, SLEEPERS)

    # The user's command reads the same events through the monitoring credential...
    assert live["jobs_by_state"] == summary.jobs_by_state
    assert live["sessions"] == 1
    assert [r["n"] for r in live["stages"]["rows"]] == [
        0 if r.spread is None else r.spread.n for r in stages.rows
    ]
    assert live["read"]["refused_by_shared_rule"] == 0
    assert uuid.UUID(live["failures"][0]["example_job"])
    # ...a copy of the log folds into exactly the same figures...
    assert copied == live
    # ...a copy of one app's jobs folds as the live read of that app does...
    assert only_fails["jobs_by_state"] == {"RUN_ERROR": 1}
    assert {k: v for k, v in only_fails.items() if k not in ("selection", "read")} == {
        k: v for k, v in live_fails.items() if k not in ("selection", "read")
    }
    # ...and so does an operator's read of EVENTS (the same site's events, the same fold).
    assert {k: v for k, v in operator.items() if k != "selection"} == {
        k: v for k, v in live.items() if k != "selection"
    }
