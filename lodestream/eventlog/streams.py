"""The two streams, created or updated idempotently (ARCHITECTURE.md §3)."""

from __future__ import annotations

from nats.js import JetStreamContext
from nats.js.api import RetentionPolicy, StorageType, StreamConfig
from nats.js.errors import APIError, NotFoundError

from lodestream.eventlog.errors import StreamConfigError
from schemas.subjects import EVENTS_STREAM, EVENTS_SUBJECTS, HB_STREAM, HB_SUBJECTS

# Longer than any client retry loop, so a retried append is always recognised.
DUPLICATE_WINDOW_S = 300.0
# Delete markers only need to live long enough for the controller and projector to see them.
HB_MARKER_TTL_S = 3600.0


def events_config(replicas: int = 1) -> StreamConfig:
    return StreamConfig(
        name=EVENTS_STREAM,
        description="lodestream: every state change of every aggregate (source of truth)",
        subjects=[EVENTS_SUBJECTS],
        retention=RetentionPolicy.LIMITS,
        storage=StorageType.FILE,
        max_age=0,
        num_replicas=replicas,
        duplicate_window=DUPLICATE_WINDOW_S,
        deny_delete=True,
        deny_purge=True,
        allow_direct=True,
    )


def heartbeat_config(replicas: int = 1) -> StreamConfig:
    return StreamConfig(
        name=HB_STREAM,
        description="lodestream: launcher heartbeats; the server's TTL timer detects dead pilots",
        subjects=[HB_SUBJECTS],
        retention=RetentionPolicy.LIMITS,
        storage=StorageType.FILE,
        max_msgs_per_subject=1,
        num_replicas=replicas,
        allow_msg_ttl=True,
        subject_delete_marker_ttl=HB_MARKER_TTL_S,
        allow_direct=True,
    )


async def ensure_streams(js: JetStreamContext, replicas: int = 1) -> None:
    """Create EVENTS and HB, or update them to the wanted settings. Safe to call at every start."""
    for config in (events_config(replicas), heartbeat_config(replicas)):
        await _ensure(js, config)


async def _ensure(js: JetStreamContext, config: StreamConfig) -> None:
    assert config.name is not None
    try:
        await js.stream_info(config.name)
    except NotFoundError:
        try:
            await js.add_stream(config)
        except APIError as exc:
            raise StreamConfigError(f"cannot create stream {config.name}: {exc}") from exc
        return
    try:
        await js.update_stream(config)
    except APIError as exc:
        raise StreamConfigError(f"cannot update stream {config.name}: {exc}") from exc
