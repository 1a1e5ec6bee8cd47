"""A loopback TCP relay that a test can cut: one client loses NATS while the server runs on.

Stopping nats-server cuts everyone off, the control plane included, so nothing can happen
on the log meanwhile. Put between a site process and the server's listener (TLS and the
websocket pass through untouched), a :class:`CutProxy` cuts that process off alone:
:meth:`cut` closes its connections and refuses new ones, :meth:`restore` listens again on
the same port.

``delay_s`` holds every chunk that long in each direction, in order, as a long link would
(a round trip then costs twice ``delay_s`` more).
"""

from __future__ import annotations

import asyncio
import contextlib
from types import TracebackType
from typing import Self

from tests.fixtures.ports import free_port

_CHUNK = 1 << 16


class CutProxy:
    def __init__(self, target_port: int, host: str = "127.0.0.1", *, delay_s: float = 0.0) -> None:
        self.host = host
        self.target_port = target_port
        self.delay_s = delay_s
        self.port = free_port(host)
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._pumps: set[asyncio.Task[None]] = set()

    async def __aenter__(self) -> Self:
        await self.restore()
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.cut()

    async def restore(self) -> None:
        """Accept and relay connections (again)."""
        if self._server is None:
            self._server = await asyncio.start_server(
                self._relay, self.host, self.port, reuse_address=True
            )

    async def cut(self) -> None:
        """Refuse new connections and drop every open one, as a network cut would."""
        if self._server is not None:
            self._server.close()
            self._server = None
        for writer in list(self._writers):
            writer.close()
        for pump in list(self._pumps):
            pump.cancel()
        await asyncio.gather(*self._pumps, return_exceptions=True)

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(self.host, self.target_port)
        except OSError:
            writer.close()
            return
        self._writers |= {writer, up_writer}
        pump = self._pump if self.delay_s <= 0 else self._delayed_pump
        pumps = [
            asyncio.create_task(pump(reader, up_writer)),
            asyncio.create_task(pump(up_reader, writer)),
        ]
        self._pumps.update(pumps)
        await asyncio.gather(*pumps, return_exceptions=True)
        self._pumps.difference_update(pumps)
        for end in (writer, up_writer):
            end.close()
            self._writers.discard(end)

    @staticmethod
    async def _pump(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError):
            while data := await source.read(_CHUNK):
                sink.write(data)
                await sink.drain()
        sink.close()

    async def _delayed_pump(self, source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
        """:meth:`_pump`, each chunk written ``delay_s`` after it was read (reading goes on
        meanwhile: latency, not a narrower pipe)."""
        loop = asyncio.get_running_loop()
        held: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def write() -> None:
            while True:
                due, data = await held.get()
                if not data:
                    return
                await asyncio.sleep(max(0.0, due - loop.time()))
                sink.write(data)
                await sink.drain()

        writer = asyncio.create_task(write())
        try:
            with contextlib.suppress(OSError):
                while data := await source.read(_CHUNK):
                    held.put_nowait((loop.time() + self.delay_s, data))
            held.put_nowait((loop.time() + self.delay_s, b""))
            with contextlib.suppress(OSError):
                await writer
        finally:
            writer.cancel()
            sink.close()
