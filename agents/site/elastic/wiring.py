"""Which scheduler the elastic queue asks for backfill windows: the site machine's."""

from __future__ import annotations

from lodestream.agents.site.settings import SiteSettings, SiteSettingsError
from lodestream.platform_adapters.compute.machine import load_machine
from lodestream.platform_adapters.errors import InvalidMachine, UnknownBackend
from lodestream.platform_adapters.schedulers.base import Scheduler
from lodestream.platform_adapters.schedulers.registry import get_scheduler


def backfill_scheduler(settings: SiteSettings) -> Scheduler | None:
    """The adapter of the site machine's scheduler when the elastic queue uses backfill.

    None when it does not (the queue then never asks a scheduler anything). A scheduler that
    cannot tell backfill windows is a settings error, said at start rather than every period.
    """
    elastic = settings.elastic
    if not (elastic.enabled and elastic.use_backfill):
        return None
    try:
        machine = load_machine(settings.launcher.machine, base=settings.directory)
        scheduler = None if machine.scheduler == "local" else get_scheduler(machine.scheduler)
    except (InvalidMachine, UnknownBackend) as exc:
        raise SiteSettingsError(f"elastic.use_backfill: {exc}") from exc
    if scheduler is None or not scheduler.capabilities.backfill:
        raise SiteSettingsError(
            f"elastic.use_backfill: the {machine.scheduler} scheduler of machine "
            f"{machine.name!r} cannot tell backfill windows; set use_backfill: false"
        )
    return scheduler
