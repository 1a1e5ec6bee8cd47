"""One way to open a NATS connection, so every process reconnects and reports alike."""

from __future__ import annotations

import logging
import ssl
from typing import Any

import nats
from nats.aio.client import Client

from lodestream.settings import NatsSettings

log = logging.getLogger(__name__)


def client_tls(ca_file: str | None) -> ssl.SSLContext | None:
    if ca_file is None:
        return None
    context = ssl.create_default_context(cafile=ca_file)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    return context


async def connect(settings: NatsSettings, **overrides: Any) -> Client:
    """Connect with endless reconnects: a service outlives any NATS outage."""

    async def on_error(exc: Exception) -> None:
        log.warning("nats: %s", exc)

    options: dict[str, Any] = {
        "servers": [settings.url],
        "name": settings.name,
        "inbox_prefix": settings.inbox_prefix,
        "max_reconnect_attempts": -1,
        "reconnect_time_wait": 0.5,
        "error_cb": on_error,
    }
    if settings.user is not None:
        options["user"] = settings.user
        options["password"] = settings.password.get_secret_value() if settings.password else None
    if settings.nkey_seed_file is not None:
        options["nkeys_seed"] = str(settings.nkey_seed_file)
    tls = client_tls(str(settings.ca_file) if settings.ca_file else None)
    if tls is not None:
        options["tls"] = tls
    options.update(overrides)
    client: Client = await nats.connect(**options)
    return client
