"""The site's transfer locations: a backend for each, and their declaration to the control plane.

``settings.yml``'s ``transfers.locations`` maps a name to a URL; the URL's scheme picks the
backend (:func:`lodestream.platform_adapters.transfers.registry.backend_for`). Backends are
built on first use, once: one that cannot be built (Globus never logged in, rsync missing) is
remembered with its reason, and every item for that location fails with it instead of waiting.

:func:`declare_locations` appends ``site.locations_set`` with the whole set, so the api can
refuse a job naming a location the site does not have; an agent restarted with the set the log
already holds appends nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from nats.js.errors import NotFoundError

from lodestream.agents.site.settings import RsyncLocationSettings, SiteSettings
from lodestream.eventlog import EventLog
from lodestream.platform_adapters.errors import PlatformError
from lodestream.platform_adapters.transfers.base import TransferBackend
from lodestream.schemas.errors import Untrusted
from lodestream.schemas.events import SiteLocationsSet
from lodestream.schemas.events.site import SiteLocationsData
from lodestream.schemas.ids import derived_id
from lodestream.schemas.subjects import EVENTS_STREAM, event_subject
from lodestream.schemas.trust import check_own_site, event_from_message

log = logging.getLogger(__name__)

BackendBuilder = Callable[[str, str, SiteSettings], TransferBackend]
"""(location name, its URL, the site's settings) → the backend that moves data there."""


def default_builder(name: str, url: str, settings: SiteSettings) -> TransferBackend:
    """The backend of ``url``'s scheme, with the options of ``settings`` that it takes."""
    cfg = settings.transfers
    if url.startswith("globus:"):
        # One client for the site's stored tokens; the remote collection comes with each batch.
        from lodestream.platform_adapters.transfers.globus import GlobusBackend  # noqa: PLC0415

        return GlobusBackend.from_site_tokens(
            settings.directory, client_id=cfg.globus_client_id,
            site_collection=cfg.globus_collection, sync_level=cfg.globus_sync_level,
            site_root=cfg.globus_site_root,
        )  # fmt: skip
    from lodestream.platform_adapters.transfers.registry import backend_for  # noqa: PLC0415

    # Each location keeps its own task records: a task id is one backend's to answer for.
    state_dir = settings.site_path(cfg.state_dir) / name
    # As many tasks at once as the module may have in flight: it spreads batches over them.
    workers = cfg.max_concurrent
    if url.startswith("rsync:"):
        identity = settings.site_path(cfg.ssh_identity) if cfg.ssh_identity else None
        own = cfg.rsync.get(name) or RsyncLocationSettings()
        return backend_for(
            url, state_dir=state_dir, identity_file=identity, ssh_options=cfg.ssh_options,
            rsync_options=own.rsync_options, io_timeout_s=own.io_timeout_s,
            connect_timeout_s=own.connect_timeout_s, control_persist_s=own.control_persist_s,
            control_dir=settings.site_path(cfg.state_dir) / "ssh", max_workers=workers,
        )  # fmt: skip
    return backend_for(url, state_dir=state_dir, link=cfg.link, max_workers=workers)


class Backends:
    """One backend per location, built when first needed."""

    def __init__(self, settings: SiteSettings, build: BackendBuilder | None = None) -> None:
        self._settings = settings
        self._build = build or default_builder
        self._built: dict[str, TransferBackend] = {}
        self._problems: dict[str, str] = {}

    def url(self, location: str) -> str:
        return self._settings.transfers.locations[location]

    def problem(self, location: str) -> str | None:
        """Why no item can move through ``location`` (None: it has a working backend)."""
        locations = self._settings.transfers.locations
        if location not in locations:
            known = ", ".join(sorted(locations)) or "none"
            return (f"site {self._settings.site!r} has no transfer location {location!r} "
                    f"(its locations: {known})")  # fmt: skip
        if location not in self._built and location not in self._problems:
            try:
                self._built[location] = self._build(location, locations[location], self._settings)
            except (PlatformError, ValueError, OSError) as exc:
                self._problems[location] = f"transfer location {location!r}: {exc}"
                log.error("transfers: %s", self._problems[location])  # noqa: TRY400 - said all
        return self._problems.get(location)

    def spreading(self) -> frozenset[str]:
        """The built locations whose backends gain from more tasks (``spreads``)."""
        return frozenset(name for name, backend in self._built.items() if backend.spreads)

    def poll_every_s(self, location: str) -> float:
        """How soon to ask again after a task of ``location``: its backend's own pace where it
        declares one (``TransferBackend.poll_every_s``), never slower than the site's
        ``poll_interval_s``, which is also the pace of a backend not built yet and of every
        backend under ``simulated_task_latency_s`` (a measurement of a wide-area service's
        cost per task, which must not be polled as if it were local)."""
        cfg = self._settings.transfers
        backend = self._built.get(location)
        own = backend.poll_every_s if backend is not None else None
        if own is None or cfg.simulated_task_latency_s > 0:
            return cfg.poll_interval_s
        return min(own, cfg.poll_interval_s)

    def get(self, location: str) -> TransferBackend:
        """The location's backend; call :meth:`problem` first."""
        return self._built[location]

    def close(self) -> None:
        """Stop the backends' worker threads; a copy cut short resumes at the next start."""
        for backend in self._built.values():
            close = getattr(backend, "close", None)
            if callable(close):
                close(wait=False)


async def declare_locations(js: Any, settings: SiteSettings) -> bool:
    """Append the site's transfer locations unless the log's newest set is the same; True if
    appended."""
    site = settings.site
    aggregate = derived_id("site", site)
    locations = dict(settings.transfers.locations)
    try:
        stored = await js.get_msg(
            EVENTS_STREAM, subject=event_subject(site, SiteLocationsSet.event_type, aggregate),
            direct=True,
        )  # fmt: skip
        newest = check_own_site(event_from_message(stored.subject or "", stored.data or b""), site)
        if isinstance(newest, SiteLocationsSet) and newest.data.locations == locations:
            return False
    except NotFoundError:
        pass
    except Untrusted as exc:
        log.warning("transfers: the log's newest locations are not to be trusted: %s", exc)
    event = SiteLocationsSet.create(
        site=site, aggregate_id=aggregate, actor=f"site:{site}",
        data=SiteLocationsData(locations=locations),
    )  # fmt: skip
    await EventLog(js).append(event, expect=None)
    return True
