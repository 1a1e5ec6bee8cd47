"""Watching the stack: projector position vs. stream end, over time; CPU seconds per process."""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import os
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nats.js import JetStreamContext
from psycopg import AsyncConnection

from bench.stack import BenchError
from lodestream.schemas.subjects import EVENTS_STREAM
from lodestream.services.projector.errors import ProjectorBehind
from lodestream.services.projector.position import applied_seq, wait_until_applied

SAMPLE_INTERVAL_S = 0.05
_CLK_TCK = os.sysconf("SC_CLK_TCK")


class Positions:
    """The projector's committed position and the stream's last seq."""

    def __init__(self, js: JetStreamContext, conn: AsyncConnection[Any]) -> None:
        self.js = js
        self.conn = conn

    @classmethod
    async def connect(cls, js: JetStreamContext, dsn: str) -> Positions:
        return cls(js, await AsyncConnection.connect(dsn, autocommit=True))

    async def close(self) -> None:
        await self.conn.close()

    async def projector(self) -> int:
        return await applied_seq(self.conn, EVENTS_STREAM)

    async def stream_last(self) -> int:
        info = await self.js.stream_info(EVENTS_STREAM)
        return int(info.state.last_seq)

    async def wait_for(self, seq: int, timeout_s: float, what: str) -> float:
        """Seconds until the projector reaches ``seq``; BenchError after ``timeout_s``."""
        started = time.perf_counter()
        try:
            await wait_until_applied(
                self.projector, seq, timeout_s=timeout_s, poll_s=SAMPLE_INTERVAL_S
            )
        except ProjectorBehind as exc:
            raise BenchError(f"{what}: {exc}") from exc
        return time.perf_counter() - started

    async def caught_up(self, timeout_s: float, what: str) -> float:
        return await self.wait_for(await self.stream_last(), timeout_s, what)


@dataclass(slots=True)
class Timeline:
    """Samples (seconds since start, projector position, stream last seq) taken every 50 ms."""

    started: float = field(default_factory=time.perf_counter)
    samples: list[tuple[float, int, int]] = field(default_factory=list)

    def now(self) -> float:
        return time.perf_counter() - self.started

    def first_advance(self, above: int) -> float | None:
        return next((t for t, pos, _ in self.samples if pos > above), None)

    def reached(self, seq: int) -> float | None:
        return next((t for t, pos, _ in self.samples if pos >= seq), None)

    def position_at(self, when: float) -> int:
        before = [pos for t, pos, _ in self.samples if t <= when]
        return before[-1] if before else 0

    def peak_lag(self) -> int:
        return max((last - pos for _, pos, last in self.samples), default=0)

    def peak_rate(self, window_s: float = 1.0) -> float:
        """Highest projector events/s over any ``window_s`` stretch of samples."""
        best, j = 0.0, 0
        for i, (t, pos, _) in enumerate(self.samples):
            while j < i and t - self.samples[j][0] > window_s:
                j += 1
            span = t - self.samples[j][0]
            if j < i and span >= window_s * 0.8:
                best = max(best, (pos - self.samples[j][1]) / span)
        return best


@contextlib.asynccontextmanager
async def timeline(positions: Positions) -> AsyncIterator[Timeline]:
    """Sample the projector's position and the stream's end for the duration of the block."""
    line = Timeline()

    async def sample() -> None:
        position, last = await positions.projector(), await positions.stream_last()
        line.samples.append((line.now(), position, last))

    async def sampling() -> None:
        while True:
            await asyncio.sleep(SAMPLE_INTERVAL_S)
            await sample()

    await sample()  # the block may end before the first tick
    task = asyncio.create_task(sampling())
    try:
        yield line
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def _stat_fields(pid: int) -> list[str] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2 :].split()  # the name may contain spaces


def _cpu_s(pid: int, *, reaped: bool = False) -> float:
    """utime + stime of ``pid``; with ``reaped``, plus that of its exited, waited-for children."""
    fields = _stat_fields(pid)
    if not fields:
        return 0.0
    # fields[0] is field 3 (state): utime, stime, cutime, cstime are fields 14 to 17.
    ticks = int(fields[11]) + int(fields[12])
    if reaped:
        ticks += int(fields[13]) + int(fields[14])
    return ticks / _CLK_TCK


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            fields = _stat_fields(int(entry.name))
            if fields and int(fields[1]) == pid:
                found.append(int(entry.name))
    return found


def cpu_snapshot(pids: Mapping[str, int]) -> dict[str, float]:
    """CPU seconds so far per component.

    Postgres is the postmaster, its live backends, and the backends that have exited (the
    postmaster reaps them, so their time lands in its cutime/cstime).
    """
    # Reaped children count towards their parent: a pilot's finished tasks are its cost.
    snapshot = {name: _cpu_s(pid, reaped=True) for name, pid in pids.items()}
    if "postgres" in pids:
        postmaster = pids["postgres"]
        snapshot["postgres"] = _cpu_s(postmaster, reaped=True) + sum(
            _cpu_s(child) for child in _children(postmaster)
        )
    me = os.getpid()
    snapshot["bench"] = _cpu_s(me)
    # The processes this one spawned to split work (a rebuild's), running or reaped.
    spawned = sum(_cpu_s(p.pid or 0) for p in multiprocessing.active_children())
    snapshot[SPAWNED] = _cpu_s(me, reaped=True) - snapshot["bench"] + spawned
    snapshot[MACHINE] = _machine_busy_s()
    return snapshot


SPAWNED = "bench's spawned processes"
MACHINE = "machine (all processes)"
OTHERS = "others (not this stack)"


def _machine_busy_s() -> float:
    """Non-idle CPU seconds of the whole machine, all cores (the first line of /proc/stat)."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    idle = fields[3] + fields[4]  # idle + iowait
    return (sum(fields) - idle) / _CLK_TCK


class CpuMeter:
    """CPU used by each process between :meth:`start` and :meth:`stop`, as % of one core.

    Also the whole machine's, and what is left for processes that are not this stack's:
    another benchmark on the same machine shows up there and voids the figures.
    """

    def __init__(self, pids: Mapping[str, int]) -> None:
        self.pids = dict(pids)
        self._before: dict[str, float] = {}
        self._t0 = 0.0
        self.result: dict[str, float] = {}

    def start(self) -> CpuMeter:
        self._before = cpu_snapshot(self.pids)
        self._t0 = time.perf_counter()
        return self

    def stop(self) -> dict[str, float]:
        after = cpu_snapshot(self.pids)
        wall = max(time.perf_counter() - self._t0, 1e-9)
        # A backend that exits between its last reading and the reap is briefly uncounted.
        self.result = {
            name: round(max(after[name] - self._before.get(name, 0.0), 0.0) / wall * 100, 1)
            for name in after
        }
        ours = sum(v for k, v in self.result.items() if k != MACHINE)
        self.result[OTHERS] = round(max(self.result[MACHINE] - ours, 0.0), 1)
        return self.result
