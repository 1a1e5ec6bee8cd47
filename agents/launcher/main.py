"""Wiring for ``lode launcher``: site settings and apps in, one pilot session out."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from lodestream.agents.launcher.config import PilotConfig, PilotParts
from lodestream.agents.launcher.decide import PilotBatch, batch_verdict
from lodestream.agents.launcher.diffusion import Diffusion, build, caches_reachable
from lodestream.agents.launcher.launcher import Launcher, LauncherReport
from lodestream.agents.launcher.peers import PeerCaches
from lodestream.agents.launcher.plan import PilotPlan, plan_pilot
from lodestream.agents.launcher.probe import probe_world, refusal_reason
from lodestream.agents.launcher.report import ExitReason
from lodestream.agents.launcher.session import LauncherSession
from lodestream.agents.launcher.tags import describe
from lodestream.agents.launcher.warm import WarmPool
from lodestream.agents.site.apps import ApplicationDefinition, load_apps, to_app_model
from lodestream.agents.site.connect import connect_site_patiently, credential_watch, disconnect
from lodestream.agents.site.scheduler.pilot_end import pilot_end_path, write_pilot_end
from lodestream.agents.site.settings import JobMode, SiteSettings, load_site_settings
from lodestream.eventlog.jetstream import jetstream
from lodestream.eventlog.outbox import Outbox
from lodestream.platform_adapters.compute.machine import Machine
from lodestream.platform_adapters.compute.walltime import seconds_left
from lodestream.platform_adapters.errors import DiscoveryError
from lodestream.platform_adapters.launchers.local import LocalLauncher
from lodestream.platform_adapters.launchers.mpi import MpiLauncher
from lodestream.platform_adapters.schedulers.environment import own_job_id
from lodestream.schemas.resources import SchedulerState

log = logging.getLogger(__name__)

DRAIN_MARGIN_S: Final = 30.0  # Slurm's default KillWait: as long as a scheduler waits to kill
DRAIN_MARGIN_FRACTION: Final = 0.1  # a short pilot gives up less of its time


async def run(
    site_dir: Path,
    *,
    wall_time_min: float,
    stop: asyncio.Event | None = None,
    mode: JobMode | None = None,
    plan: PilotPlan | None = None,
    batch_job_id: uuid.UUID | None = None,
    filter_tags: Mapping[str, str] | None = None,
) -> LauncherReport:
    """Run one pilot session of the site in ``site_dir`` until it ends (idle, wall time,
    ``stop``): as ``plan`` says, or as its settings say (``mode`` overrides theirs). With
    ``filter_tags`` it runs only jobs whose tags include them all (:mod:`.tags`).

    Raises :class:`~lodestream.agents.launcher.errors.PilotRefused` before connecting if
    this machine cannot run it, and
    :class:`~lodestream.agents.site.credential.CredentialRevoked` once NATS has refused the
    site's credential for good: its tasks are killed, as nothing can be reported."""
    settings = load_site_settings(site_dir)  # errors here are the user's to fix: let them show
    apps = load_apps(settings.apps_dir)
    cfg = settings.launcher
    if plan is None:
        plan = plan_pilot(settings, mode=mode)
    nodes = list(plan.nodes)
    mpi_broken = await asyncio.to_thread(_probe, settings, plan)
    wall_s = await asyncio.to_thread(_wall_time_s, plan.machine, wall_time_min)
    # The batch job's clock starts now; the pilot drains a little before it runs out.
    deadline = time.monotonic() + wall_s - drain_margin_s(wall_s)
    if stop is None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
    link = _Link()
    watch = credential_watch(settings)
    watch.on_revoked = stop.set
    nc = await connect_site_patiently(
        settings, "launcher", stop=stop, deadline=deadline, watch=watch,
        disconnected_cb=link.disconnected, reconnected_cb=link.reconnected,
        # A link that died without a word (no RST) is noticed after 3 unanswered pings:
        # within the heartbeat TTL, not nats-py's default of minutes, so the reconnect
        # can still save the session.
        ping_interval=max(1, cfg.heartbeat_ttl_s // 4),
    )  # fmt: skip
    if nc is None:
        if watch.revoked:
            raise watch.error()
        reason = ExitReason.STOPPED if stop.is_set() else ExitReason.WALL_TIME
        log.warning("launcher exits before reaching NATS (%s)", reason)
        return LauncherReport(exit_reason=reason)
    try:
        # A leaf-node site reaches the hub's JetStream through its domain, and keeps in the
        # leaf's own (no domain) what the hub cannot take during a cut.
        js = jetstream(nc, domain=settings.nats.hub_domain)
        outbox = Outbox(jetstream(nc)) if settings.nats.hub_domain else None
        left_min = (deadline - time.monotonic()) / 60  # connecting may have taken a while
        session = LauncherSession(
            js, settings.site, heartbeat_ttl_s=cfg.heartbeat_ttl_s, wall_time_min=left_min,
            batch_job_id=batch_job_id,
        )  # fmt: skip
        batch = None
        if batch_job_id is not None:  # started by the site's scheduler module for that job
            kind = settings.scheduler.type
            batch = PilotBatch(batch_job_id, kind, own_job_id(kind, os.environ))
        pilot = PilotConfig(
            site=settings.site, nodes=tuple(nodes), data_dir=settings.data_dir,
            idle_ttl_s=cfg.idle_ttl_s, max_fetch=cfg.max_fetch, prefetch=cfg.prefetch,
            base_env=plan.base_env,
            mode=plan.mode, site_shape=plan.site_shape, batch=batch,
            filter_tags=dict(filter_tags or {}), mpi_broken=mpi_broken,
        )  # fmt: skip
        parts = PilotParts(
            apps=apps, app_launcher=plan.app_launcher, warm=_warm_pool(settings, plan),
            diffusion=_diffusion(settings, plan, session, apps), outbox=outbox,
        )  # fmt: skip
        launcher = Launcher(js, session, pilot, parts, nc=nc)
        link.on_reconnect = launcher.reconnected
        watch.on_revoked = lambda: _revoke(launcher, stop)
        log.info("launcher %s: %s mode, %d nodes, %d apps, app launcher %s, tag filter %s",
                 session.id, plan.mode, len(nodes), len(apps), plan.app_launcher.name,
                 describe(filter_tags or {}))  # fmt: skip
        report = await launcher.run(stop)
        log.info("launcher %s exits (%s): %s", session.id, report.exit_reason, report)
        if batch_job_id is not None:
            leave_verdict(settings, batch_job_id, report.exit_reason, session.remaining_min() * 60)
    finally:
        link.closing = True
        await disconnect(nc)
    if watch.revoked:
        raise watch.error()
    return report


def _diffusion(
    settings: SiteSettings,
    plan: PilotPlan,
    session: LauncherSession,
    apps: dict[str, type[ApplicationDefinition]],
) -> Diffusion | None:
    """The pilot's node caches and data-aware dispatch, if the site turns them on and this
    pilot can fill its nodes' caches (:func:`caches_reachable`)."""
    cfg = settings.launcher
    if cfg.cache_bytes <= 0:
        return None
    if not caches_reachable(plan.machine.scheduler, len(plan.nodes), plan.mpi4py_workers):
        log.warning("launcher: node caches are off: this pilot cannot fill its %d nodes' "
                    "caches from its own process (machine %s)", len(plan.nodes),
                    plan.machine.name)  # fmt: skip
        return None
    return build(
        cache_root=settings.site_path(cfg.cache_dir) / str(session.id),
        capacity=cfg.cache_bytes, nodes=[n.hostname for n in plan.nodes],
        peers=PeerCaches(settings.site, lambda: session.id, cfg.heartbeat_ttl_s),
        apps={name: to_app_model(cls, settings.site) for name, cls in apps.items()},
        data_dir=settings.data_dir, max_deliveries=cfg.cache_defer_deliveries,
        advertise=session.wake,
    )  # fmt: skip


def _warm_pool(settings: SiteSettings, plan: PilotPlan) -> WarmPool | None:
    """Warm Python workers, one per slot, where this pilot runs its jobs on its own host."""
    cfg = settings.launcher.python_workers
    if not cfg.enabled or plan.mpi4py_workers or not isinstance(plan.app_launcher, LocalLauncher):
        return None
    slots = sum(max(len(n.cpu_ids), 1) for n in plan.nodes)
    return WarmPool(settings.apps_dir, cfg, env=plan.base_env, cwd=settings.data_dir, size=slots)


def _probe(settings: SiteSettings, plan: PilotPlan) -> str | None:
    """An mpi-mode pilot's 2-rank probe of its launcher's MPI world
    (:mod:`~lodestream.agents.launcher.probe`): why MPI jobs must be refused, or None."""
    launcher = plan.app_launcher
    if plan.mode != "mpi" or not isinstance(launcher, MpiLauncher):
        return None
    workdir = settings.log_dir / f"mpi-probe-{uuid.uuid4()}"
    why = probe_world(launcher, plan.nodes, workdir, plan.base_env)
    if why is None:
        return None
    reason = refusal_reason(launcher, why)
    log.error("launcher: %s", reason)
    return reason


def _revoke(launcher: Launcher, stop: asyncio.Event) -> None:
    launcher.revoked()  # first, so that stopping kills the tasks instead of draining them
    stop.set()


def leave_verdict(
    settings: SiteSettings, batch_job_id: uuid.UUID, reason: ExitReason, remaining_s: float
) -> None:
    """Tell the site agent that this pilot ended its batch job at its wall time: it exits 0
    ahead of the scheduler's kill, and the scheduler records a completed job
    (:mod:`lodestream.agents.site.scheduler.pilot_end`)."""
    if batch_verdict(reason, remaining_s) != SchedulerState.WALLTIME_EXPIRED:
        return
    path = pilot_end_path(settings.site_path(settings.scheduler.script_dir), batch_job_id)
    try:
        write_pilot_end(path, SchedulerState.WALLTIME_EXPIRED)
    except OSError as exc:  # the batch job is then recorded as the scheduler says
        log.warning("launcher: cannot leave the batch job's end in %s: %s", path, exc)


def drain_margin_s(wall_s: float) -> float:
    """How long before its wall time runs out the pilot stops leasing and drains.

    The scheduler signals the batch job at its wall time and kills it a few seconds later
    (Slurm's ``KillWait``, 30 s by default, 2 s in the tests). Draining exactly then races
    that kill: a pilot slowed by a busy node could be killed before it reports the tasks it
    stopped, and they would wait for its session to expire instead of being timed out at
    once. Draining ahead leaves time to stop the tasks and append their results.
    """
    return min(DRAIN_MARGIN_S, wall_s * DRAIN_MARGIN_FRACTION)


def _wall_time_s(machine: Machine, wall_time_min: float) -> float:
    """The pilot's wall time: what it was given, or less if the scheduler says so."""
    given = wall_time_min * 60
    try:
        left = seconds_left(machine.scheduler)
    except DiscoveryError as exc:
        log.warning("launcher: no time left from the %s scheduler (%s); using the %g min given",
                    machine.scheduler, exc, wall_time_min)  # fmt: skip
        return given
    return given if left is None else min(given, left)


@dataclass(slots=True)
class _Link:
    """The connection's callbacks: log an outage, and tell the pilot when NATS is back."""

    on_reconnect: Callable[[], None] | None = None
    closing: bool = False

    async def disconnected(self) -> None:
        if not self.closing:
            log.warning("launcher: disconnected from NATS; reconnecting (running tasks go on)")

    async def reconnected(self) -> None:
        log.info("launcher: reconnected to NATS")
        if self.on_reconnect is not None:
            self.on_reconnect()
