"""The site's scheduler adapter, built from ``settings.yml``'s ``scheduler`` section."""

from __future__ import annotations

from typing import Any

from lodestream.agents.site.settings import SiteSettings, SiteSettingsError
from lodestream.platform_adapters.schedulers import Scheduler, get_scheduler


def build_scheduler(settings: SiteSettings) -> Scheduler:
    """The adapter ``scheduler.type`` names, with its settings; a wrong one is a clear error."""
    cfg = settings.scheduler
    options: dict[str, Any] = dict(cfg.adapter)
    if cfg.type == "local":
        options |= {"seconds_per_minute": cfg.seconds_per_minute}
        args: tuple[Any, ...] = (settings.site_path(cfg.state_dir),)
    else:
        options |= {"timeout_s": cfg.timeout_s}
        args = ()
    if cfg.type == "slurm" and cfg.jobcomp_path is not None:
        options["jobcomp_path"] = settings.site_path(cfg.jobcomp_path)
    try:
        return get_scheduler(cfg.type, *args, **options)
    except TypeError as exc:  # an adapter setting the backend does not take
        raise SiteSettingsError(f"scheduler.adapter: {exc}") from exc
