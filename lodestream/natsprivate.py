"""Every piece of nats-py's private interior that lodestream uses, named in one place.

nats-py has no public way to do what the hot paths need: write many ``HPUB`` commands in
one go (:mod:`lodestream.eventlog.jetstream`), take a pull consumer's deliveries as bytes
before a message is built (:mod:`lodestream.eventlog.rawpull`), read a subscription's
queue directly (:mod:`lodestream.eventlog.pull`), put our websocket transport in place of
its own (:mod:`lodestream.natsconn`), or finish closing a transport it left open
(:mod:`lodestream.agents.site.connect`). Code elsewhere calls the functions below instead
of touching an underscore name of nats-py; the two subclasses that override nats-py's
methods (``TolerantClient``, ``JetStream``) and the transport that reads its queue list
what they rely on in :data:`OVERRIDDEN` and :data:`INHERITED`.

pyproject.toml pins nats-py to one minor version. ``tests/unit/test_natsprivate.py``
checks every name here against the installed nats-py, parameters included, so an upgrade
that moves one fails there, naming it, instead of in a consumer at run time.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, Final

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.aio.transport import WebSocketTransport
from nats.js import JetStreamContext

ProcessMsg = Callable[..., Coroutine[Any, Any, None]]
"""The connection's delivery of one ``MSG``/``HMSG``: (sid, subject, reply, data, headers).
nats-py types the headers as bytes, but passes None for a message without any."""

# The methods called here, with the parameters we pass (checked by name and order).
CALLED: Final[dict[tuple[type, str], tuple[str, ...]]] = {
    (Client, "_send_command"): ("self", "cmd", "priority"),
    (Client, "_flush_pending"): ("self", "force_flush"),
    (Client, "_process_msg"): ("self", "sid", "subject", "reply", "data", "headers"),
}
# Methods our subclasses override, with the parameters nats-py calls them with.
OVERRIDDEN: Final[dict[tuple[type, str], tuple[str, ...]]] = {
    (Client, "_parse_header_lines"): ("raw",),
    (Client, "_build_message"): ("self", "sid", "subject", "reply", "data", "headers"),
    (Client, "_connect_to_server"): ("self", "s"),
    (JetStreamContext, "_handle_async_reply"): ("self", "msg"),
    (JetStreamContext, "_init_async_reply"): ("self",),
    (WebSocketTransport, "drain"): ("self",),
}
# Instance attributes read or written, here and by those subclasses.
INHERITED: Final[dict[type, tuple[str, ...]]] = {
    Client: (
        "_transport",
        "_flush_queue",
        "_max_pending_size",
        "_inbox_prefix",
        "_subs",
        "msg_class",
        "options",
        "stats",
    ),
    JetStreamContext: (
        "_nc",
        "_prefix",
        "_async_reply_prefix",
        "_publish_async_futures",
        "_publish_async_pending_semaphore",
        "_publish_async_completed_event",
    ),
    WebSocketTransport: ("_pending", "_ws"),
    Subscription: ("_id", "_pending_queue"),
}


def connection_of(js: JetStreamContext) -> Client:
    """The connection a JetStream context publishes and subscribes on."""
    nc: Client = js._nc
    return nc


def api_prefix(js: JetStreamContext) -> str:
    """The context's JetStream API prefix: ``$JS.API``, or ``$JS.<domain>.API``."""
    return str(js._prefix)


def inbox_prefix(nc: Client) -> bytearray:
    """The prefix of the connection's inboxes (its async reply subjects start with it)."""
    prefix: bytearray = nc._inbox_prefix
    return prefix


def transport_of(nc: Client) -> Any:
    """The connection's transport, None before its first connect."""
    return nc._transport


def subscription_id(sub: Subscription) -> int:
    """The sid the server's deliveries for ``sub`` carry."""
    sid: int = sub._id
    return sid


def subscription(nc: Client, sid: int) -> Subscription | None:
    """The connection's live subscription of ``sid``, if any."""
    found: Subscription | None = nc._subs.get(sid)
    return found


def pending_queue(sub: Subscription) -> asyncio.Queue[Msg]:
    """The queue nats-py puts ``sub``'s messages in, read directly by a pull consumer."""
    queue: asyncio.Queue[Msg] = sub._pending_queue
    return queue


def would_overflow(nc: Client, size: int) -> bool:
    """Whether ``size`` more bytes would pass the buffer nats-py keeps while reconnecting."""
    return not nc.is_connected and nc.pending_data_size + size > nc._max_pending_size


async def write(nc: Client, chunk: bytes) -> None:
    """Write protocol commands as they are, flushing at once unless a flush is queued."""
    await nc._send_command(chunk)
    if nc._flush_queue is not None and nc._flush_queue.empty():
        await nc._flush_pending()


def delivery_of(nc: Client) -> ProcessMsg:
    """What the connection's parser calls for every ``MSG`` and ``HMSG`` it reads."""
    deliver: ProcessMsg = nc._process_msg
    return deliver


def replace_delivery(nc: Client, process_msg: ProcessMsg) -> None:
    """Have the parser call ``process_msg`` instead, on this connection only."""
    nc.__dict__["_process_msg"] = process_msg


def restore_delivery(nc: Client) -> None:
    """Give the connection its own delivery back."""
    nc.__dict__.pop("_process_msg", None)
