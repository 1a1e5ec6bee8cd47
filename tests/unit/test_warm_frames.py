"""The warm workers' frames: what one side writes, the other reads, whole or in pieces."""

from __future__ import annotations

import os
import socket

import pytest

from lodestream.agents.launcher.warm import frames


def test_frames_arrive_whole_however_the_bytes_are_split() -> None:
    ours, theirs = socket.socketpair()
    ours.setblocking(False)
    reader = frames.Reader(ours)
    data = frames.encode({"a": 1}) + frames.encode({"b": "x" * 100_000})
    theirs.sendall(data[:3])
    assert reader.frames() == []
    theirs.sendall(data[3:70_000])
    assert reader.frames() == [{"a": 1}]
    theirs.sendall(data[70_000:])
    got: list[dict[str, object]] = []
    while not got:
        got = reader.frames()
    assert got == [{"b": "x" * 100_000}]
    theirs.close()
    assert reader.frames() == []
    assert reader.closed
    ours.close()


def test_a_request_carries_its_descriptor() -> None:
    ours, theirs = socket.socketpair()
    r, w = os.pipe()
    frames.send(ours, {"op": "fork"}, [w])
    got = frames.recv_with_fd(theirs)
    assert got is not None
    doc, fd = got
    assert doc == {"op": "fork"}
    assert fd is not None
    os.write(fd, b"!")
    assert os.read(r, 1) == b"!"
    for d in (r, w, fd):
        os.close(d)
    ours.close()
    theirs.close()


def test_what_is_not_a_frame_is_refused() -> None:
    ours, theirs = socket.socketpair()
    theirs.sendall(b"\x00\x00\x00\x02[]")
    with pytest.raises(frames.FrameError):
        frames.recv(ours)
    theirs.close()
    assert frames.recv(ours) is None
    ours.close()
