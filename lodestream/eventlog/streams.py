"""The streams, created or updated idempotently (docs/architecture.md §2)."""

from __future__ import annotations

import asyncio

from nats.errors import TimeoutError as NatsTimeoutError
from nats.js import JetStreamContext
from nats.js.api import RetentionPolicy, StorageType, StreamConfig, StreamSource
from nats.js.errors import APIError, NotFoundError

from lodestream.eventlog.errors import StreamConfigError
from lodestream.schemas.subjects import (
    EVENTS_STREAM,
    EVENTS_SUBJECTS,
    HB_IN_STREAM,
    HB_STREAM,
    HB_SUBJECTS,
)

# Longer than any client retry loop, so a retried append is always recognised.
DUPLICATE_WINDOW_S = 300.0
# Delete markers only need to live long enough for the controller and projector to see them.
HB_MARKER_TTL_S = 3600.0
# How long a launcher may stay silent before the server declares it gone.
HEARTBEAT_TTL_S = 10.0
# HBIN only has to hold a heartbeat until HB has sourced it.
HB_IN_MAX_AGE_S = 600.0
ENSURE_ATTEMPTS = 4


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


def heartbeat_inbox_config(replicas: int = 1) -> StreamConfig:
    """``HBIN``: where launchers publish. It refuses every control header a site could abuse.

    Subject delete markers force rollups on (nats-server turns ``allow_rollup_hdrs`` on for
    any stream that has them), and a ``Nats-Rollup: all`` from one site would wipe every
    site's heartbeats. So sites never write the stream that has the markers: they write
    here, where rollups and per-message TTLs are refused, and ``HB`` sources from here.
    """
    return StreamConfig(
        name=HB_IN_STREAM,
        description="lodestream: heartbeats as launchers publish them (no control headers)",
        subjects=[HB_SUBJECTS],
        retention=RetentionPolicy.LIMITS,
        storage=StorageType.FILE,
        max_msgs_per_subject=1,
        max_age=HB_IN_MAX_AGE_S,
        num_replicas=replicas,
        allow_rollup_hdrs=False,
        allow_msg_ttl=False,
        deny_delete=True,
        deny_purge=True,
    )


def heartbeat_config(replicas: int = 1, ttl_s: float = HEARTBEAT_TTL_S) -> StreamConfig:
    """``HB``: the last heartbeat of each session, removed ``ttl_s`` after it was written.

    The server's own timer removes it and leaves a delete marker: that is how a dead
    launcher is detected. It has no subjects of its own; only what ``HBIN`` holds gets in.
    """
    return StreamConfig(
        name=HB_STREAM,
        description="lodestream: launcher heartbeats; the server's age timer detects dead pilots",
        subjects=[],
        sources=[StreamSource(name=HB_IN_STREAM)],
        retention=RetentionPolicy.LIMITS,
        storage=StorageType.FILE,
        max_msgs_per_subject=1,
        max_age=ttl_s,
        num_replicas=replicas,
        # Kept on for streams created before HBIN existed (it cannot be turned off); only
        # sourced messages enter HB, and HBIN refuses the header.
        allow_msg_ttl=True,
        subject_delete_marker_ttl=HB_MARKER_TTL_S,
        allow_direct=True,
    )


async def ensure_streams(
    js: JetStreamContext, replicas: int = 1, *, heartbeat_ttl_s: float = HEARTBEAT_TTL_S
) -> None:
    """Create EVENTS, HB and HBIN, or update them to the wanted settings. Safe at every start.

    HB goes first: a stream created before HBIN existed still holds ``hb.>``, and HBIN
    can only claim those subjects once HB has let them go.
    """
    for config in (
        events_config(replicas),
        heartbeat_config(replicas, heartbeat_ttl_s),
        heartbeat_inbox_config(replicas),
    ):
        await _ensure(js, config)


async def _ensure(js: JetStreamContext, config: StreamConfig) -> None:
    # In a cluster, a stream being created or a meta leader being elected may leave a
    # request unanswered for a moment; creating and updating are idempotent, so ask again.
    for attempt in range(1, ENSURE_ATTEMPTS + 1):
        try:
            await _ensure_once(js, config)
        except NatsTimeoutError:
            if attempt == ENSURE_ATTEMPTS:
                raise
            await asyncio.sleep(0.5 * attempt)
        else:
            return


async def _ensure_once(js: JetStreamContext, config: StreamConfig) -> None:
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
