"""The warm workers' wire format: length-prefixed JSON objects on a Unix stream socket.

A frame is a 4-byte big-endian length and that many bytes of UTF-8 JSON (an object). The
pilot's fork request to the template carries the new worker's end of its socket pair as
``SCM_RIGHTS`` ancillary data; nothing else passes descriptors.
"""

from __future__ import annotations

import json
import socket
import struct
from typing import Any, Final

_HEADER: Final = struct.Struct(">I")
MAX_FRAME: Final = 16 * 1024 * 1024


class FrameError(Exception):
    """The peer sent something that is not a frame (it is then treated as gone)."""


def encode(doc: dict[str, Any]) -> bytes:
    body = json.dumps(doc, separators=(",", ":")).encode()
    return _HEADER.pack(len(body)) + body


def send(sock: socket.socket, doc: dict[str, Any], fds: list[int] | None = None) -> None:
    """Send one frame (blocking, on a non-blocking socket too), with ``fds`` if given."""
    data = encode(doc)
    blocking = sock.getblocking()
    if not blocking:
        sock.setblocking(True)
    try:
        if fds:
            sent = socket.send_fds(sock, [data], fds)
            data = data[sent:]
        if data:
            sock.sendall(data)
    finally:
        if not blocking:
            sock.setblocking(False)


def recv(sock: socket.socket) -> dict[str, Any] | None:
    """Receive one frame, blocking; None at end of stream."""
    header = _recv_exactly(sock, _HEADER.size)
    if header is None:
        return None
    (size,) = _HEADER.unpack(header)
    if size > MAX_FRAME:
        raise FrameError(f"frame of {size} bytes")
    body = _recv_exactly(sock, size)
    if body is None:
        raise FrameError("stream ended inside a frame")
    return decode(body)


def recv_with_fd(sock: socket.socket) -> tuple[dict[str, Any], int | None] | None:
    """Receive one request and the descriptor sent with it, if any; None at end of stream.

    The sender waits for an answer to each request, so a read never holds the next one.
    """
    data, fds, _, _ = socket.recv_fds(sock, 65536, 1)
    if not data:
        return None
    if len(data) < _HEADER.size:
        more = _recv_exactly(sock, _HEADER.size - len(data))
        if more is None:
            raise FrameError("stream ended inside a frame")
        data += more
    (size,) = _HEADER.unpack_from(data)
    rest = _HEADER.size + size - len(data)
    if rest > 0:
        more = _recv_exactly(sock, rest)
        if more is None:
            raise FrameError("stream ended inside a frame")
        data += more
    return decode(data[_HEADER.size :]), (fds[0] if fds else None)


def decode(body: bytes) -> dict[str, Any]:
    try:
        doc = json.loads(body)
    except ValueError as exc:
        raise FrameError(f"not JSON: {exc}") from exc
    if not isinstance(doc, dict):
        raise FrameError("a frame must hold a JSON object")
    return doc


class Reader:
    """Frames from a non-blocking socket, as far as they have arrived."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._buf = bytearray()
        self.closed = False

    def frames(self) -> list[dict[str, Any]]:
        """Every complete frame readable now; ``closed`` is set once the peer is gone."""
        while not self.closed:
            try:
                chunk = self._sock.recv(65536)
            except BlockingIOError:
                break
            except OSError:
                chunk = b""
            if not chunk:
                self.closed = True
                break
            self._buf += chunk
            if len(chunk) < 65536:
                break
        out = []
        while len(self._buf) >= _HEADER.size:
            (size,) = _HEADER.unpack_from(self._buf)
            if len(self._buf) < _HEADER.size + size:
                break
            out.append(decode(bytes(self._buf[_HEADER.size : _HEADER.size + size])))
            del self._buf[: _HEADER.size + size]
        return out


def _recv_exactly(sock: socket.socket, n: int) -> bytes | None:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)
