"""A worker rank of an mpi4py serial pilot: run the jobs rank 0 starts on this node.

One loop, no threads: take rank 0's messages (start, signal, ping, stop), poll the tasks it
started here (the local launcher: the same process groups, terminate and kill as a
single-process pilot's), send each one's exit status back, and ping rank 0 every second.
When nothing happens it naps, a tenth of a millisecond at first, doubling up to 2 ms.

Rank 0 is the only one that decides: SIGTERM and SIGINT (which ``mpiexec`` forwards to every
rank when the batch job ends) are left to it, and it drains the jobs here through this loop.
If rank 0 falls silent for the timeout it was given, its pilot is gone and nobody can report
these jobs any more (the controller times them out when its session expires): the worker
kills them and exits.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from lodestream.agents.launcher.errors import ProtocolError
from lodestream.agents.launcher.mpi_channel import Channel
from lodestream.agents.launcher.mpi_link import BEAT_S, IDLE_WAIT_S
from lodestream.agents.launcher.mpi_protocol import (
    Assign,
    Bye,
    Exited,
    Message,
    Ping,
    Signal,
    Start,
    Started,
    StartRefused,
    Stop,
    decode,
)
from lodestream.platform_adapters.launchers.base import AppLauncher, RunningTask, TaskSpec

log = logging.getLogger(__name__)

ASSIGN_WAIT_S = 600.0  # rank 0 discovers the nodes and plans before it assigns them
FLUSH_WAIT_S = 5.0  # for the last messages to leave when the worker exits
STOP_GRACE_S = 2.0


@dataclass(frozen=True, slots=True)
class WorkerExit:
    code: int  # 0: told to stop; 1: rank 0 went silent
    reason: str


class WorkerLoop:
    def __init__(
        self,
        channel: Channel,
        launcher: Callable[[str], AppLauncher],
        *,
        rank: int,
        beat_s: float = BEAT_S,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._channel = channel
        self._make_launcher = launcher  # from the machine's GPU variable, once assigned
        self._launcher: AppLauncher | None = None
        self._rank = rank
        self._beat_s = beat_s
        self._clock = clock
        self._sleep = sleep
        self._tasks: dict[str, RunningTask] = {}
        self._assigned = False
        self._timeout_s = ASSIGN_WAIT_S
        self._heard = self._beaten = clock()
        self._exit: WorkerExit | None = None

    def serve(self) -> WorkerExit:
        """Wait for rank 0's assignment, then serve until told to stop (or rank 0 is gone)."""
        nap = IDLE_WAIT_S[0]
        while self._exit is None:
            busy = self.step()
            nap = IDLE_WAIT_S[0] if busy else min(nap * 2, IDLE_WAIT_S[1])
            if not busy:
                self._sleep(nap)
        self._flush()
        return self._exit

    def step(self) -> bool:
        """One turn of the loop; whether anything happened."""
        busy = self._receive()
        busy |= self._reap()
        now = self._clock()
        if self._assigned and self._exit is None and now - self._beaten >= self._beat_s:
            self._beaten = now
            self._channel.post(0, Ping())
        if self._exit is None and now - self._heard > self._timeout_s:
            why = f"rank 0 silent for {self._timeout_s:g} s"
            self._exit = WorkerExit(1, why)
            # Said before the kill: whoever sees the jobs gone can read why.
            log.error("worker rank %d: %s; killing its %d jobs", self._rank, why, len(self._tasks))
            self._stop_all(kill=True)
        self._channel.progress()
        return busy

    @property
    def running(self) -> int:
        return len(self._tasks)

    @property
    def stopping(self) -> bool:
        """Told to stop (or given up on rank 0): the other ranks are leaving too."""
        return self._exit is not None

    def _receive(self) -> bool:
        got = False
        while self._exit is None and (received := self._channel.poll()) is not None:
            got = True
            source, data = received
            if source != 0:
                log.warning("worker rank %d: message from rank %d dropped", self._rank, source)
                continue
            self._heard = self._clock()
            try:
                self._handle(decode(data))
            except ProtocolError as exc:
                log.warning("worker rank %d: dropped a message: %s", self._rank, exc)
        return got

    def _handle(self, message: Message) -> None:
        match message:
            case Assign(node=node, timeout_s=timeout_s, gpu_env=gpu_env):
                self._assigned, self._timeout_s = True, timeout_s
                if node is None:  # stays till the end: an early exit alarms every rank
                    log.info("worker rank %d serves no node", self._rank)
                else:
                    self._launcher = self._make_launcher(gpu_env)
                    log.info("worker rank %d serves node %s", self._rank, node)
            case Start(spec=spec):
                self._start(spec)
            case Signal(job_id=job_id, kill=kill, grace_s=grace_s):
                self._signal(job_id, kill=kill, grace_s=grace_s)
            case Stop(reason=reason):
                self._exit = WorkerExit(0, reason)
                self._stop_all(kill=False)
                self._channel.post(0, Bye())
            case Ping():
                pass
            case _:
                log.warning("worker rank %d: %s is rank 0's to receive", self._rank, message)

    def _start(self, spec: TaskSpec) -> None:
        if self._launcher is None:
            self._channel.post(0, StartRefused(spec.job_id, "started before its assignment"))
            return
        try:
            task = self._launcher.start(spec)
        except Exception as exc:  # StartFailed, or anything else the launcher raised
            self._channel.post(0, StartRefused(spec.job_id, f"{exc}"))
            return
        self._tasks[spec.job_id] = task
        self._channel.post(0, Started(spec.job_id, task.pid))

    def _signal(self, job_id: str, *, kill: bool, grace_s: float) -> None:
        task = self._tasks.get(job_id)
        if task is None:  # ended meanwhile (its exit is on its way), or never started
            return
        if kill:
            task.kill()
        else:
            task.terminate(grace_s)

    def _reap(self) -> bool:
        ended = [(job_id, task, code) for job_id, task in self._tasks.items()
                 if (code := task.poll()) is not None]  # fmt: skip
        for job_id, task, code in ended:
            del self._tasks[job_id]
            tail = task.stderr_tail() if code != 0 else ""
            self._channel.post(0, Exited(job_id, code, tail))
        return bool(ended)

    def _stop_all(self, *, kill: bool) -> None:
        """Rank 0 drains its jobs before it says stop: what is left here has nobody to report
        it, so it ends now."""
        for task in self._tasks.values():
            if kill:
                task.kill()
            else:
                task.terminate(STOP_GRACE_S)
        deadline = self._clock() + STOP_GRACE_S + 1
        while self._tasks and self._clock() < deadline:
            self._reap()
            self._sleep(0.01)

    def _flush(self) -> None:
        deadline = self._clock() + FLUSH_WAIT_S
        while self._channel.progress() and self._clock() < deadline:
            self._sleep(0.001)
