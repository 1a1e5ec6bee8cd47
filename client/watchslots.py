"""Claiming a consumer for one site's feed under the monitoring key's names, never another's.

The key may use only :data:`~lodestream.infra.nats.monitor.SLOTS` consumer names
(:func:`~lodestream.infra.nats.monitor.consumer_names`), shared by all its watchers. A
JetStream create is idempotent: a create whose config equals an existing consumer's returns
that consumer, at *its* position. So every create here carries a description no other
create has (a random token): it makes a new consumer or is refused as "already exists",
and never attaches to another watch's consumer or to one a crashed watch left behind. The
answer is checked as well: our description, nothing delivered yet.

Leftovers go by themselves (the consumer's ``inactive_threshold``), but a credential
whose names are all taken would otherwise wait for that. When every name is taken, the
consumers nobody reads are reclaimed: no pull request waiting, at two looks
:data:`RECLAIM_LOOK_S` apart, and nothing delivered in between; the one idle longest first.
A crashed watch's consumers are such at once (the server drops a dead connection's pull
requests). So is a live watch whose caller has not iterated for seconds: it resumes where
it was, with a notice, as after any break. If none is idle, the watch is refused with a
:class:`~lodestream.client.errors.WatchError` that says so.
"""

from __future__ import annotations

import asyncio
import json
import re
import secrets
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

from lodestream.client.errors import WatchError
from lodestream.infra.nats.monitor import create_subject
from lodestream.schemas.subjects import EVENTS_STREAM

RECLAIM_LOOK_S: Final = 1.5  # longer than a healthy watch's pull request is ever absent
_EXISTS: Final = frozenset({10013, 10105, 10148})  # name in use, with another config
_NOT_FOUND: Final = 10014

Api = Callable[[str, bytes], Awaitable[dict[str, Any]]]


@dataclass(frozen=True, slots=True)
class Claimed:
    """A consumer made for one feed: its name, the stream sequence it starts after, and how
    many of the site's events it holds from there."""

    name: str
    floor: int
    pending: int


async def claim(api: Api, names: Sequence[str], site: str, config: Mapping[str, Any]) -> Claimed:
    """Create a consumer for ``site`` under a free name of ``names``, reclaiming an idle one
    if every name is taken; :class:`WatchError` if none can be had."""
    for _ in range(2):
        for name in names:
            claimed = await _create(api, name, site, config)
            if claimed is not None:
                return claimed
        if not await _reclaim(api, names):
            break
    raise WatchError(
        f"cannot watch site {site!r}: all {len(names)} watcher slots of this credential are "
        "held by watchers that are reading (one slot per site of each watch): stop one, or "
        "watch fewer sites at once"
    )


async def _create(api: Api, name: str, site: str, config: Mapping[str, Any]) -> Claimed | None:
    description = f"lode watch {secrets.token_hex(8)}"
    body = {"stream_name": EVENTS_STREAM, "action": "create",
            "config": {**config, "name": name, "description": description}}  # fmt: skip
    answer = await api(create_subject(name, site), json.dumps(body).encode())
    error = answer.get("error")
    if error is not None:
        if error.get("err_code") in _EXISTS:
            return None
        raise WatchError(f"cannot watch site {site!r}: {error.get('description')}")
    delivered = answer.get("delivered", {})
    if (
        answer.get("config", {}).get("description") != description
        or int(delivered.get("consumer_seq", 0)) != 0
    ):
        return None  # not the consumer this create asked for: leave it to its owner
    return Claimed(name, int(delivered.get("stream_seq", 0)), int(answer.get("num_pending", 0)))


async def _reclaim(api: Api, names: Sequence[str]) -> bool:
    """Delete the consumer idle longest of ``names``; True if a name may now be free."""
    first = await _idle(api, names)
    if first is None:
        return True  # one went away meanwhile
    if not first:
        return False
    await asyncio.sleep(RECLAIM_LOOK_S)
    second = await _idle(api, list(first))
    if second is None:
        return True
    still = [info for name, info in second.items() if _delivered(info) == _delivered(first[name])]
    if not still:
        return False
    oldest = min(still, key=_last_active)
    await api(f"$JS.API.CONSUMER.DELETE.{EVENTS_STREAM}.{oldest['name']}", b"")
    return True


async def _idle(api: Api, names: Sequence[str]) -> dict[str, dict[str, Any]] | None:
    """The consumers of ``names`` with no pull request waiting; None if one is gone."""
    idle = {}
    for name in names:
        info = await api(f"$JS.API.CONSUMER.INFO.{EVENTS_STREAM}.{name}", b"")
        error = info.get("error")
        if error is not None:
            if error.get("err_code") == _NOT_FOUND:
                return None
            raise WatchError(f"cannot look at consumer {name}: {error.get('description')}")
        if int(info.get("num_waiting", 0)) == 0:
            idle[name] = info
    return idle


def _delivered(info: Mapping[str, Any]) -> int:
    return int(info.get("delivered", {}).get("stream_seq", 0))


def _last_active(info: Mapping[str, Any]) -> datetime:
    text = str(info.get("delivered", {}).get("last_active") or info.get("created") or "")
    # The server writes nanoseconds; Python reads at most microseconds.
    try:
        return datetime.fromisoformat(re.sub(r"(\.\d{6})\d+", r"\1", text))
    except ValueError:
        return datetime.min.replace(tzinfo=UTC)
