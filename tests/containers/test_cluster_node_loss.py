"""A 3-node JetStream cluster loses the leader of EVENTS mid-run (issue 16).

The projector, the controller, a site agent and a local pilot run on the host against
the cluster's nodes in containers (R3 streams) and a Postgres container, configured as
an operator configures an external cluster. While ~200 jobs are submitted and run, the
node leading EVENTS is SIGKILLed (``docker kill --signal KILL``) and stays dead. Every
job must end final, none lost, none run twice unless a lease expiry on the log says why,
and the read model must equal a rebuild. How long appends stalled is printed.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import sys
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest
from nats.js import JetStreamContext

from lodestream.eventlog import EventLog, ensure_streams, jetstream
from lodestream.natsconn import connect
from lodestream.schemas.subjects import EVENTS_STREAM
from lodestream.schemas.topology import SITE_CONSUMERS
from tests.chaos.conftest import CHAOS_APP
from tests.chaos.test_chaos import FINAL, app_known, consumer_exists
from tests.chaos.verify import Log, check, compare_with_rebuild, final_states, read_log, summary
from tests.chaos.workload import APP, submit_waves, workload
from tests.containers.stall import StallProbe
from tests.fixtures.containers import ContainerCluster, PostgresContainer
from tests.support.builders import site_registered
from tests.support.chaos import ChaosPlan, Child
from tests.support.processes import TEST_HEARTBEAT_TTL_S, service_env
from tests.support.projection import wait_for_position
from tests.support.site import make_site_dir

# Not yet part of `make test` (CI). 1 run in 3 left chained children in AWAITING_PARENTS (or
# CREATED): the controller acked a cause whose append was answered "no responders" during the
# election (issue 16, fixed; tests/integration/test_controller_lost_append.py). A pilot that
# opened its session during the election could exit "session refused": its retry pauses
# outlasted the heartbeat TTL and the controller expired the session before it was opened
# (fixed: it beats while it retries, and renews a session expired before it opened;
# tests/integration/test_launcher_open_election.py). Whether the pilot opens before or
# during the election is down to timing here. `make cluster-faults` runs it.
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        os.environ.get("LODE_CLUSTER_FAULTS") != "1",
        reason="set LODE_CLUSTER_FAULTS=1 (make cluster-faults): not yet reliable, see the module",
    ),
]
FINAL_EVENT_TYPES = frozenset({"job.finished", "job.failed", "job.killed"})
SITE, OWNER = "alpha", "ada"
PLAN = ChaosPlan(jobs=200, run_s=(0.1, 0.3), pilots=1)
WAVES = 10
WAVE_SPACING_S = 0.5
KILL_AFTER_S = 2.0  # into the submission: jobs are being created, leased and run


@pytest.mark.timeout(300)
async def test_losing_the_events_leader_loses_no_job_and_runs_none_twice(
    nats_cluster: ContainerCluster, postgres_container: PostgresContainer, tmp_path: Path
) -> None:
    dsn = postgres_container.url
    nats = nats_cluster.settings()
    site = make_site_dir(
        tmp_path / "site", SITE, wss_url=nats_cluster.websocket_url,
        ca_file=nats_cluster.ca_file, seed_file=nats_cluster.seed_files[SITE],
        processing={"retry_budget": 50}, idle_ttl_s=3600,
    )  # fmt: skip
    shutil.copy(CHAOS_APP, site.apps_dir / CHAOS_APP.name)
    logs = tmp_path / "logs"
    logs.mkdir()
    host = HostSide.create(service_env(nats, dsn), site.directory, logs)
    waves = workload(PLAN, SITE, OWNER, waves=WAVES)
    ids = [job.aggregate_id for wave in waves for job in wave.jobs]
    nc = await connect(nats.model_copy(update={"name": "node-loss-test"}))
    stop_probe = asyncio.Event()
    try:
        js = jetstream(nc)
        await ensure_streams(js, nats.stream_replicas, heartbeat_ttl_s=TEST_HEARTBEAT_TTL_S)
        await EventLog(js).append(site_registered(SITE, OWNER), expect=0)
        await start(js, host, dsn)
        probe = StallProbe(js, SITE)
        probing = asyncio.create_task(probe.run(stop_probe))
        submitter = asyncio.create_task(submit_waves(js, waves, WAVE_SPACING_S, timeout_s=120))
        await asyncio.sleep(KILL_AFTER_S)
        info = await js.stream_info(EVENTS_STREAM)
        assert info.cluster is not None
        leader = info.cluster.leader
        assert leader in nats_cluster.nodes
        killed_at = time.monotonic()
        await asyncio.to_thread(nats_cluster.nodes[leader].kill, nats_cluster.engine)
        submitted = await submitter
        states = await until_final(dsn, ids, timeout_s=180)
        stop_probe.set()
        await probing
        problems = host.exited()
        # The pilot says goodbye (session.closed); then the projector catches up and stops.
        await asyncio.to_thread(host.stop, "pilot", "agent", "controller")
        log = await read_log(js)
        await wait_for_position(dsn, log.last_seq, timeout_s=60)
        await asyncio.to_thread(host.stop, "projector")
        problems += await check(log, dsn, ids, waves, site.data_dir)
        problems += await compare_with_rebuild(js, dsn, timeout_s=60)
        if problems:
            keep_evidence(log, ids, states, logs)
        after = (await js.stream_info(EVENTS_STREAM)).cluster
        print(summary(log, ids, waves, site.data_dir, rounds=1))
        print(controller_retries(host))
        print(
            f"states {dict(states)}; killed {leader} (the EVENTS leader), new leader "
            f"{after.leader if after else None}; appends stalled "
            f"{probe.longest_gap_after(killed_at):.2f} s (longest gap between answered probes "
            f"after the kill; {probe.unanswered} probes unanswered); the submitter retried "
            f"{submitted.retries} appends, {len(submitted.landed_unacknowledged)} had landed "
            "unacknowledged"
        )
    finally:
        stop_probe.set()
        await asyncio.to_thread(host.stop)
        await nc.close()
    assert not problems, "\n".join(problems)


def controller_retries(host: HostSide) -> str:
    """The controller's batches left for redelivery (NATS or Postgres away), as it logged them."""
    path = host.children["controller"].log_path
    lines = [line for line in path.read_text(errors="replace").splitlines() if "retry" in line]
    shown = "\n".join(f"  {line}" for line in lines[:20])
    return f"controller: {len(lines)} batches left for redelivery\n{shown}"


def keep_evidence(log: Log, ids: list[uuid.UUID], states: Counter[str], logs: Path) -> None:
    """Keep every service log and the event history of each job not final, outside tmp_path."""
    kept = Path(tempfile.mkdtemp(prefix="lode-node-loss-"))
    shutil.copytree(logs, kept / "logs")
    stuck = [job for job in ids if not any(e.event.type in FINAL_EVENT_TYPES
                                           for e in log.jobs.get(job, []))]  # fmt: skip
    with (kept / "stuck.txt").open("w") as out:
        for job in stuck:
            out.write(f"job {job}\n{log.history(job)}\n")
            parents = {
                p for e in log.jobs.get(job, []) for p in getattr(e.event.data, "parent_ids", ())
            }
            for parent in sorted(parents):
                out.write(f" parent {parent}\n{log.history(parent)}\n")
    print(f"evidence kept in {kept} ({len(stuck)} jobs not final; states {dict(states)})")


@dataclass
class HostSide:
    """What runs on the host: projector, controller, the site agent and one pilot."""

    children: dict[str, Child]

    @classmethod
    def create(cls, env: dict[str, str], site_dir: Path, logs: Path) -> HostSide:
        cli = [sys.executable, "-m", "lodestream.client.cli.main"]
        argv = {
            "projector": [sys.executable, "-m", "lodestream.services.projector"],
            "controller": [sys.executable, "-m", "lodestream.services.controller"],
            "agent": [*cli, "site", "start", str(site_dir)],
            "pilot": [*cli, "launcher", "--site", str(site_dir), "--wall-time-min", "120"],
        }
        return cls({name: Child(name, command, env, logs) for name, command in argv.items()})

    def stop(self, *names: str) -> None:
        for name in names or tuple(reversed(self.children)):
            self.children[name].stop()

    def exited(self) -> list[str]:
        """What ended without being stopped: a finding (each child's log tail)."""
        return [f"{name} exited:\n{child.log_tail()}"
                for name, child in self.children.items() if child.exited]  # fmt: skip


async def start(js: JetStreamContext, host: HostSide, dsn: str) -> None:
    """Services, the site's consumers, the agent (and its app), then the pilot."""
    host.children["projector"].start()
    host.children["controller"].start()
    async with asyncio.timeout(60):
        for consumer in (feed.durable(SITE) for feed in SITE_CONSUMERS):
            while not await consumer_exists(js, consumer):
                await asyncio.sleep(0.1)
    host.children["agent"].start()
    async with asyncio.timeout(60):
        while not await app_known(dsn, APP):
            await asyncio.sleep(0.1)
    host.children["pilot"].start()


async def until_final(dsn: str, ids: list[uuid.UUID], timeout_s: float) -> Counter[str]:
    """The jobs' states once all are final, or after ``timeout_s`` (the checks say which not)."""
    states: Counter[str] = Counter()
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(timeout_s):
            while sum(n for s, n in states.items() if s in FINAL) < len(ids):
                await asyncio.sleep(0.5)
                with contextlib.suppress(psycopg.OperationalError):
                    states = await final_states(dsn, ids)
    return states
