"""The site agent: publishes the site's apps (again whenever a file of ``apps/`` changes,
:mod:`lodestream.agents.site.appwatch`) and transfer locations, then works
``process-<site>`` (hooks, cleaner), ``sched-<site>`` (pilot batch jobs,
:mod:`lodestream.agents.site.scheduler`) and ``xfer-<site>`` (data staging,
:mod:`lodestream.agents.site.transfers`) until stopped.

With ``elastic.enabled`` it also runs the site's elastic queue (``agents/site/elastic/``)
beside it, every ``elastic.period_s``.

It connects only outbound (wss, the site's nkey) and rides out NATS outages
with the client's endless reconnects; unacknowledged work is redelivered.
A delivery the shared rule refuses (:mod:`lodestream.schemas.trust`) is terminated, so it is
never redelivered, logged with the reason and counted in ``skipped``; no message
stops the agent.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import nats.errors
from nats.aio.msg import Msg
from nats.js import JetStreamContext

from lodestream.agents.site.apps import ApplicationDefinition
from lodestream.agents.site.appwatch import AppWatcher
from lodestream.agents.site.elastic import ElasticQueue, ScalerLog
from lodestream.agents.site.processing import Processing
from lodestream.agents.site.registry import AppPublisher
from lodestream.agents.site.retries import RetryRules
from lodestream.agents.site.scheduler import PilotScheduler, build_scheduler
from lodestream.agents.site.settings import SiteSettings
from lodestream.agents.site.transfers import TransferModule
from lodestream.agents.site.transfers.locations import BackendBuilder, declare_locations
from lodestream.eventlog import EventLog
from lodestream.eventlog.kernel import ACK, DeliveryCounts, Settle, deliver_one
from lodestream.eventlog.pull import PullLoop, pull_consumer
from lodestream.platform_adapters.schedulers import Scheduler
from lodestream.schemas.topology import PROCESS

log = logging.getLogger(__name__)


class SiteAgent:
    def __init__(
        self,
        js: JetStreamContext,
        settings: SiteSettings,
        apps: dict[str, type[ApplicationDefinition]],
        retries: RetryRules | None = None,
        *,
        scheduler: Scheduler | None = None,
        transfer_backends: BackendBuilder | None = None,
    ) -> None:
        self._js = js
        self._settings = settings
        self._apps = apps
        event_log = EventLog(js)
        self.publisher = AppPublisher(
            event_log, settings.site, settings.log_dir / "published-apps.json"
        )
        self.app_watch = AppWatcher(settings.apps_dir, apps, self.publisher)
        self.processing = Processing(
            event_log, site=settings.site, apps=apps, data_dir=settings.data_dir,
            retries=retries or RetryRules.build(settings.processing, apps),
        )  # fmt: skip
        scheduler = scheduler or build_scheduler(settings)
        self.pilots = PilotScheduler(js, settings, scheduler)
        self.transfers = TransferModule(js, settings, build=transfer_backends)
        self.elastic = (
            ElasticQueue(ScalerLog(js, settings.site), settings.site, settings.elastic, scheduler)
            if settings.elastic.enabled
            else None
        )
        self.deliveries = DeliveryCounts()  # of process-<site>: refused, retried, failed

    async def run(self, stop: asyncio.Event) -> None:
        changes = await self.publisher.publish(self._apps)
        for name, action in changes.items():
            log.info("app %s %s", name, action)
        if await declare_locations(self._js, self._settings):
            log.info(
                "transfer locations: %s", ", ".join(self._settings.transfers.locations) or "none"
            )
        sub = await pull_consumer(self._js, PROCESS.stream, PROCESS.durable(self._settings.site))
        pulling = PullLoop(sub, name="site agent", batch=64, timeout_s=0.5)
        workers = asyncio.Semaphore(self._settings.processing.workers)
        pending: set[asyncio.Task[None]] = set()
        elastic = asyncio.create_task(self.elastic.run(stop)) if self.elastic else None

        async def dispatch(msgs: list[Msg]) -> None:
            for msg in msgs:
                await workers.acquire()  # at most ``workers`` hooks at once; the rest in order
                task = asyncio.create_task(self._work(msg, workers))
                pending.add(task)
                task.add_done_callback(pending.discard)

        pilots = asyncio.create_task(self.pilots.run(stop))
        transfers = asyncio.create_task(self.transfers.run(stop))
        app_watch = asyncio.create_task(self.app_watch.run(stop))
        try:
            await pulling.run(dispatch, stop)
        finally:
            if elastic is not None:
                if not stop.is_set():  # the pull loop failed: the queue would go on alone
                    elastic.cancel()
                await asyncio.gather(elastic, return_exceptions=True)
            if not stop.is_set():
                app_watch.cancel()
            await asyncio.gather(pilots, transfers, app_watch, return_exceptions=True)
            if pending:
                await asyncio.gather(*pending, return_exceptions=True)
            with contextlib.suppress(nats.errors.Error):
                await sub.stop()
            log.info("site agent stops: %d outcomes appended, deliveries: %s",
                     self.processing.handled, self.deliveries)  # fmt: skip

    @property
    def skipped(self) -> int:
        """Deliveries the shared rule refused (terminated, never redelivered)."""
        return self.deliveries.refused

    async def _work(self, msg: Any, workers: asyncio.Semaphore) -> None:
        try:
            await deliver_one(self._process, msg, "site agent", retry_s=PROCESS.retry_s,
                              counts=self.deliveries)  # fmt: skip
        finally:
            workers.release()

    async def _process(self, msg: Any) -> Settle:
        await self.processing.handle(msg)
        return ACK
