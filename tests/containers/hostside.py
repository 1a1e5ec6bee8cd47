"""What the container fault tests run on the host, and how they wait for and judge a run.

The projector, the controller, a site agent and one pilot run as host processes against
the containers, configured only through the operator's settings (``service_env``).
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import sys
import tempfile
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
from nats.js import JetStreamContext

from lodestream.agents.site.settings import SiteSettings
from lodestream.eventlog import EventLog, ensure_streams, jetstream
from lodestream.natsconn import connect
from lodestream.schemas.topology import SITE_CONSUMERS
from lodestream.settings import NatsSettings
from tests.chaos.conftest import CHAOS_APP
from tests.chaos.test_chaos import FINAL, app_known, consumer_exists
from tests.chaos.verify import (
    Log,
    check,
    compare_with_rebuild,
    final_states,
    read_log,
)
from tests.chaos.workload import APP, Wave
from tests.fixtures.containers import ContainerCluster, PostgresContainer
from tests.support.builders import site_registered
from tests.support.chaos import Child
from tests.support.processes import TEST_HEARTBEAT_TTL_S, service_env
from tests.support.projection import wait_for_position
from tests.support.site import make_site_dir

# The fault tests are part of `make test` wherever a Docker engine answers (the fixtures say
# why they are skipped otherwise). They are slow: each starts its own cluster and Postgres.
# They run alone: a leader election that other tests' load stretches past the heartbeat TTL
# gets the pilot's session expired, which is the right verdict, and not what they test.
FAULT_TEST_MARKS = [pytest.mark.slow, pytest.mark.alone]
FINAL_EVENT_TYPES = frozenset({"job.finished", "job.failed", "job.killed"})
SITE, OWNER = "alpha", "ada"


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


@dataclass
class Run:
    """A started run: the control-plane connection, the host's processes, the site."""

    js: JetStreamContext
    host: HostSide
    dsn: str
    site: SiteSettings
    logs: Path


@dataclass(frozen=True)
class Target:
    """Where the host's processes go: a NATS deployment and a Postgres database."""

    nats: NatsSettings
    websocket_url: str  # the site's nats.url
    ca_file: Path
    seed_file: Path  # the site's key
    dsn: str

    @classmethod
    def of_cluster(cls, cluster: ContainerCluster, postgres: PostgresContainer) -> Target:
        return cls(cluster.settings(), cluster.websocket_url, cluster.ca_file,
                   cluster.seed_files[SITE], postgres.url)  # fmt: skip


@contextlib.asynccontextmanager
async def running(
    cluster: ContainerCluster | Target,
    postgres: PostgresContainer | None,
    tmp_path: Path,
    *,
    heartbeat_ttl_s: int = round(TEST_HEARTBEAT_TTL_S),
    launcher: Mapping[str, object] | None = None,
) -> AsyncIterator[Run]:
    """Streams, the site registered, the services, agent and pilot started on the host;
    everything the host started is stopped on the way out. ``heartbeat_ttl_s``: the pilots'
    session TTL, which the stream and the controller agree on; ``launcher``: the pilot's
    settings beyond the tests' defaults."""
    if isinstance(cluster, Target):
        target = cluster
    else:
        assert postgres is not None
        target = Target.of_cluster(cluster, postgres)
    dsn = target.dsn
    nats = target.nats.model_copy(update={"heartbeat_ttl_s": float(heartbeat_ttl_s)})
    pilot: dict[str, Any] = {"idle_ttl_s": 3600, "heartbeat_ttl_s": heartbeat_ttl_s}
    site = make_site_dir(
        tmp_path / "site", SITE, wss_url=target.websocket_url, ca_file=target.ca_file,
        seed_file=target.seed_file, processing={"retry_budget": 50},
        **(pilot | dict(launcher or {})),
    )  # fmt: skip
    shutil.copy(CHAOS_APP, site.apps_dir / CHAOS_APP.name)
    logs = tmp_path / "logs"
    logs.mkdir()
    env = service_env(nats, dsn) | {"LODE_NATS__HEARTBEAT_TTL_S": str(float(heartbeat_ttl_s))}
    host = HostSide.create(env, site.directory, logs)
    nc = await connect(nats.model_copy(update={"name": "container-fault-test"}))
    try:
        js = jetstream(nc)
        await ensure_streams(js, nats.stream_replicas, heartbeat_ttl_s=heartbeat_ttl_s)
        await EventLog(js).append(site_registered(SITE, OWNER), expect=0)
        await start(js, host, dsn)
        yield Run(js, host, dsn, site, logs)
    finally:
        await asyncio.to_thread(host.stop)
        await nc.close()


async def judge(run: Run, ids: list[uuid.UUID], waves: list[Wave]) -> tuple[Log, list[str]]:
    """Stop the site, let the projector catch up, and check the log and the read model:
    every job final, none lost, a second start only after a lease expiry, read = rebuild."""
    problems = run.host.exited()
    # The pilot says goodbye (session.closed); then the projector catches up and stops.
    await asyncio.to_thread(run.host.stop, "pilot", "agent", "controller")
    log = await read_log(run.js)
    await wait_for_position(run.dsn, log.last_seq, timeout_s=60)
    await asyncio.to_thread(run.host.stop, "projector")
    problems += await check(log, run.dsn, ids, waves, run.site.data_dir)
    problems += await compare_with_rebuild(run.js, run.dsn, timeout_s=60)
    return log, problems
