"""One way to open a NATS connection, so every process reconnects and reports alike."""

from __future__ import annotations

import contextlib
import logging
import re
import ssl
import time
from collections.abc import Callable
from typing import Any

from nats.aio.client import Client, Srv
from nats.aio.transport import WebSocketTransport

from lodestream.settings import NatsSettings

log = logging.getLogger(__name__)
ERROR_LOG_INTERVAL_S = 60.0

# str.isspace()'s characters: for a str pattern, \s is Py_UNICODE_ISSPACE, as isspace is.
_SPACE = re.compile(r"\s")


class CoalescingWebSocketTransport(WebSocketTransport):
    """A websocket transport that sends everything pending as one frame.

    nats-py's own sends each queued protocol command (every PUB of a flush) as a frame of
    its own: for a pilot that appends many events at once, the frame header, the client's
    mask (a copy of the payload) and a TLS record per command are most of what publishing
    costs. nats-server reads a websocket's frames as one byte stream, so commands may share
    a frame; their order is kept.
    """

    async def drain(self) -> None:
        chunks: list[bytes] = []
        while not self._pending.empty():
            chunks.append(self._pending.get_nowait())
        if chunks:
            assert self._ws is not None, "drain before connect"
            await self._ws.send_bytes(chunks[0] if len(chunks) == 1 else b"".join(chunks))


class TolerantClient(Client):
    """A client whose read loop survives a subject that is not UTF-8, and sends each flush
    over a websocket as one frame (:class:`CoalescingWebSocketTransport`).

    nats-server accepts any bytes in a subject token (``*`` matches them), so a site may
    publish ``evt.<site>.job.\\xff.started`` on its own subjects and the stream stores it.
    nats-py decodes every delivered subject strictly; the error ends its read loop without a
    disconnect, and the consumer silently stops for every site. Decoded with replacement
    characters instead, such a subject reaches our consumers, fails the shared rule and is
    quarantined like any other malformed message.
    """

    @staticmethod
    def _parse_header_lines(raw: bytes) -> dict[str, str]:
        """nats-py's header parser, with its test for whitespace in a name done by ``re``.

        nats-py tests each character of each header name with a generator expression: for
        the four headers every stored event carries, a third of the controller's CPU per
        event (cProfile, lifecycle benchmark). Same result for any input
        (``tests/unit/test_natsconn_headers.py`` checks it against nats-py's own).
        """
        out: dict[str, str] = {}
        for line in raw.split(b"\r\n"):
            if not line:
                continue
            name, sep, value = line.partition(b":")
            if not sep:
                continue
            try:
                key = name.strip().decode("ascii")
            except UnicodeDecodeError:
                continue
            if _SPACE.search(key):
                continue
            out[key] = value.strip().decode("utf-8", "replace")
        return out

    def _build_message(
        self, sid: int, subject: bytes, reply: bytes, data: bytes, headers: dict[str, str] | None
    ) -> Any:
        return self.msg_class(
            subject=subject.decode(errors="replace"),
            reply=reply.decode(errors="replace"),
            data=data,
            headers=headers,
            _client=self,
            _sid=sid,
        )

    async def _connect_to_server(self, s: Srv) -> None:
        # nats-py creates its transport here on the first connect and keeps it for good:
        # put ours in its place first (reconnects reuse it).
        if self._transport is None and s.uri.scheme in ("ws", "wss"):
            self._transport = CoalescingWebSocketTransport(
                ws_headers=self.options["ws_connection_headers"]
            )
        await super()._connect_to_server(s)


def client_tls(ca_file: str | None) -> ssl.SSLContext | None:
    if ca_file is None:
        return None
    context = ssl.create_default_context(cafile=ca_file)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    return context


def server_urls(url: str) -> list[str]:
    """The servers of a NATS URL setting: one URL, or several separated by commas.

    A cluster whose nodes do not advertise reachable addresses (``no_advertise``, NAT,
    published container ports) is reached through the list; a client tries each in turn.
    """
    urls = [part.strip() for part in url.split(",") if part.strip()]
    if not urls:
        raise ValueError("the NATS URL setting is empty")
    return urls


async def connect(
    settings: NatsSettings, *, on_error: Callable[[Exception], None] | None = None, **overrides: Any
) -> Client:
    """Connect with endless reconnects: a service outlives any NATS outage.

    ``on_error`` is told every error the connection reports (a refused credential, a failed
    reconnect, …) before it is logged.
    """

    last: dict[str, float] = {}

    async def report(exc: Exception) -> None:
        if on_error is not None:
            on_error(exc)
        # During an outage every reconnect attempt fails the same way, twice a second per
        # client: say it once a minute.
        what = f"{type(exc).__name__}: {exc}"
        now = time.monotonic()
        if now - last.get(what, -ERROR_LOG_INTERVAL_S) >= ERROR_LOG_INTERVAL_S:
            last[what] = now
            log.warning("nats: %s", what)

    options: dict[str, Any] = {
        "servers": server_urls(settings.url),
        "name": settings.name,
        "inbox_prefix": settings.inbox_prefix,
        "max_reconnect_attempts": -1,
        "reconnect_time_wait": 0.5,
        "error_cb": report,
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
    client = TolerantClient()
    try:
        await client.connect(**options)
    except BaseException:
        # A first connect that fails leaves nats-py's transport (an aiohttp session for
        # wss) open; a caller that retries would leak one per try.
        with contextlib.suppress(Exception):
            await client.close()
        raise
    return client
