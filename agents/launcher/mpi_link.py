"""Rank 0 of an mpi4py serial pilot: its jobs on other nodes, as tasks of an app launcher.

The pilot (:class:`~lodestream.agents.launcher.launcher.Launcher`) runs unchanged on rank 0.
Its app launcher is a :class:`RankLauncher`: a job packed on rank 0's own node starts here
with the local launcher; a job packed on another node is handed to the worker rank that
serves it, and comes back as a :class:`RemoteTask` that the pilot's reaper waits for like
any other (it offers an exit descriptor, so no polling).

One thread, :class:`RankLink`'s, makes every MPI call of rank 0: it sends what the pilot
posts, receives what the workers send, and pings them; the pilot's event loop never waits
on MPI. A worker that stays silent for ``timeout_s`` (killed, hung, its node gone) is lost:
its starts fail, and its running tasks end as ``lost``, which the pilot reports as timed
out (``job.run_timed_out``), so the site's ``handle_timeout`` decides whether they run
again. Nothing it ran is left unreported.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout

from lodestream.agents.launcher.errors import ProtocolError
from lodestream.agents.launcher.mpi_channel import Channel
from lodestream.agents.launcher.mpi_protocol import (
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
from lodestream.platform_adapters.errors import StartFailed, WaitTimedOut
from lodestream.platform_adapters.launchers.base import (
    DEFAULT_GRACE_S,
    DEFAULT_TAIL_BYTES,
    AppLauncher,
    RunningTask,
    TaskSpec,
)

log = logging.getLogger(__name__)

BEAT_S = 1.0  # how often each side pings the other
FAILED_BEATS = 5  # once a rank is known to have exited, silence this long means it was that one
IDLE_WAIT_S = (0.0001, 0.002)  # the link thread's nap when nothing happens: first, longest
LOST_STATUS = -int(signal.SIGKILL)  # the status of a task whose worker was lost (see ``lost``)


class RemoteTask(RunningTask):
    """A job running on a worker rank. Thread-safe: the link thread ends it."""

    def __init__(self, spec: TaskSpec, link: RankLink, rank: int, pid: int) -> None:
        super().__init__(spec)
        self.rank = rank
        self._link = link
        self._pid = pid
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._status: int | None = None
        self._lost: str | None = None
        self._tail = ""
        self._exit_w: int | None = None

    @property
    def pid(self) -> int:
        return self._pid  # on the worker's node

    @property
    def returncode(self) -> int | None:
        return self._status

    @property
    def lost(self) -> str | None:
        return self._lost

    def poll(self) -> int | None:
        return self._status

    def wait(self, timeout: float | None = None) -> int:
        if not self._done.wait(timeout):
            raise WaitTimedOut(f"job {self.job_id} still running after {timeout}s")
        assert self._status is not None
        return self._status

    def terminate(self, grace_s: float = DEFAULT_GRACE_S) -> None:
        if self._status is None:  # the worker escalates to SIGKILL after grace_s
            self._link.post(self.rank, Signal(self.job_id, kill=False, grace_s=grace_s))

    def kill(self) -> None:
        if self._status is None:
            self._link.post(self.rank, Signal(self.job_id, kill=True))

    def exit_fd(self) -> int | None:
        """A pipe's read end; its write end is closed when the task ends (EOF: readable)."""
        with self._lock:
            if self._status is not None or self._exit_w is not None:
                return None
            read, self._exit_w = os.pipe()
        return read

    def stderr_tail(self, max_bytes: int = DEFAULT_TAIL_BYTES) -> str:
        # Read on the worker's node: the job's files may not be visible from rank 0's.
        return self._tail[-max_bytes:] if self._tail else super().stderr_tail(max_bytes)

    def end(self, status: int, *, tail: str = "", lost: str | None = None) -> None:
        """The task ended with ``status`` (or its worker was lost: ``lost`` says how)."""
        with self._lock:
            if self._status is not None:
                return
            self._tail, self._lost, self._status = tail, lost, status
            self._done.set()
            exit_w, self._exit_w = self._exit_w, None
        if exit_w is not None:
            os.close(exit_w)


class RankLink:
    """Rank 0's side of the channel, run by its own thread (``start``, then ``close``).

    ``workers`` maps each worker rank to the node it serves (None: none, it waits for the
    end); every one of them is pinged, watched, and told to stop.
    """

    def __init__(
        self,
        channel: Channel,
        workers: Mapping[int, str | None],
        *,
        timeout_s: float,
        beat_s: float = BEAT_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._channel = channel
        self.workers = dict(workers)
        self._timeout_s = timeout_s
        self._beat_s = beat_s
        self._clock = clock
        self._lock = threading.Lock()
        self._outbox: collections.deque[tuple[int, Message]] = collections.deque()
        self._wake = threading.Event()
        self._starts: dict[str, tuple[int, TaskSpec, Future[RemoteTask]]] = {}
        self._tasks: dict[str, RemoteTask] = {}
        now = clock()
        self._heard = dict.fromkeys(self.workers, now)
        self._beaten = now
        self.lost: dict[int, str] = {}  # rank -> why
        self._gone: set[int] = set()  # ranks that said bye
        self._stopping = False
        self._failure_reported = False
        self._thread = threading.Thread(target=self._run, name="mpi-link", daemon=True)

    # --- the pilot's side (any thread) ------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def post(self, rank: int, message: Message) -> None:
        self._outbox.append((rank, message))
        self._wake.set()

    def start_task(self, rank: int, spec: TaskSpec, timeout_s: float) -> RemoteTask:
        """Have ``rank`` start ``spec``; blocks until it has (``StartFailed`` if it did not)."""
        answer: Future[RemoteTask] = Future()
        with self._lock:
            if rank in self.lost or rank not in self.workers:
                raise StartFailed(f"job {spec.job_id}: {self._why_not(rank)}")
            self._starts[spec.job_id] = (rank, spec, answer)
        self.post(rank, Start(spec))
        try:
            return answer.result(timeout_s)
        except FutureTimeout:
            with self._lock:
                self._starts.pop(spec.job_id, None)
            self.post(rank, Signal(spec.job_id, kill=True))  # should it start after all
            raise StartFailed(
                f"job {spec.job_id}: worker rank {rank} did not answer within {timeout_s:g} s"
            ) from None

    def failure_reported(self) -> None:
        """The process manager says a rank exited (Hydra's SIGUSR1): from now on, a worker
        silent for five beats is that one; no need to wait out the whole timeout."""
        self._failure_reported = True
        self._wake.set()

    def close(self, reason: str, wait_s: float = 10.0) -> None:
        """Tell every live worker to stop, wait up to ``wait_s`` for their byes, end the thread."""
        for rank in self.workers:
            if rank not in self.lost:
                self.post(rank, Stop(reason))
        deadline = time.monotonic() + wait_s  # a real wait, whatever clock the link is given
        while time.monotonic() < deadline and self._thread.is_alive():
            with self._lock:
                if set(self.workers) <= self._gone | set(self.lost):
                    break
            time.sleep(0.01)
        self._stopping = True
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(wait_s)

    # --- the link thread --------------------------------------------------------------------

    def _run(self) -> None:
        nap = IDLE_WAIT_S[0]
        try:
            while not self._stopping or self._outbox:
                busy = self._send() | self._receive()
                in_flight = self._channel.progress()
                self._watch()
                if busy:
                    nap = IDLE_WAIT_S[0]
                    continue
                self._wake.wait(nap)
                self._wake.clear()
                nap = min(nap * 2, IDLE_WAIT_S[1]) if not in_flight else IDLE_WAIT_S[0]
            self._channel.progress()
        except Exception:  # the link is how every remote task ends: fail them all, loudly
            log.exception("launcher: the MPI link thread failed")
            for rank in list(self.workers):
                self._lose(rank, "rank 0's MPI link failed")

    def _send(self) -> bool:
        sent = False
        while self._outbox:
            rank, message = self._outbox.popleft()
            if rank in self.lost:
                continue
            self._channel.post(rank, message)
            sent = True
        return sent

    def _receive(self) -> bool:
        got = False
        while (received := self._channel.poll()) is not None:
            got = True
            rank, data = received
            if rank not in self.workers:
                log.warning("launcher: message from rank %d, which serves no node; dropped", rank)
                continue
            self._heard[rank] = self._clock()
            try:
                message = decode(data)
            except ProtocolError as exc:
                log.warning("launcher: dropped a message from rank %d: %s", rank, exc)
                continue
            self._handle(rank, message)
        return got

    def _handle(self, rank: int, message: Message) -> None:
        match message:
            case Started(job_id=job_id, pid=pid):
                with self._lock:
                    start = self._starts.pop(job_id, None)
                if start is None:  # we gave up on it: it must not run
                    self.post(rank, Signal(job_id, kill=True))
                    return
                task = RemoteTask(start[1], self, rank, pid)
                self._tasks[job_id] = task
                start[2].set_result(task)
            case StartRefused(job_id=job_id, reason=reason):
                with self._lock:
                    start = self._starts.pop(job_id, None)
                if start is not None:
                    start[2].set_exception(StartFailed(reason))
            case Exited(job_id=job_id, returncode=code, stderr_tail=tail):
                ended = self._tasks.pop(job_id, None)
                if ended is not None:
                    ended.end(code, tail=tail)
            case Bye():
                with self._lock:
                    self._gone.add(rank)
            case Ping():
                pass
            case _:
                log.warning("launcher: rank %d sent %s, which only rank 0 sends", rank, message)

    def _watch(self) -> None:
        now = self._clock()
        if now - self._beaten >= self._beat_s:
            self._beaten = now
            for rank in self.workers:
                if rank not in self.lost and rank not in self._gone:
                    self._channel.post(rank, Ping())
        timeout = self._timeout_s
        if self._failure_reported:
            timeout = min(timeout, FAILED_BEATS * self._beat_s)
        for rank, heard in self._heard.items():
            if rank not in self.lost and rank not in self._gone and now - heard > timeout:
                self._lose(rank, f"silent for {timeout:g} s")

    def _lose(self, rank: int, why: str) -> None:
        with self._lock:
            if rank in self.lost:
                return
            self.lost[rank] = why
            starts = [(j, s) for j, s in self._starts.items() if s[0] == rank]
            for job_id, _ in starts:
                del self._starts[job_id]
        reason = self._why_not(rank)
        tasks = [t for t in self._tasks.values() if t.rank == rank]
        log.error("launcher: %s; its %d running jobs are reported timed out", reason, len(tasks))
        for job_id, (_, _, answer) in starts:
            answer.set_exception(StartFailed(f"job {job_id}: {reason}"))
        for task in tasks:
            del self._tasks[task.job_id]
            task.end(LOST_STATUS, lost=f"{reason}; the job's end was not seen")

    def _why_not(self, rank: int) -> str:
        if rank not in self.workers:
            return f"rank {rank} serves no node"
        return f"worker rank {rank} (node {self.workers[rank]}) lost: {self.lost.get(rank)}"


class RankLauncher(AppLauncher):
    """Starts each job on the rank that serves its node: here (``local``), or a worker's.

    Every job's environment says which rank ran it (``LODE_WORKER_RANK``).
    """

    name = "mpi4py-workers"

    def __init__(
        self,
        link: RankLink,
        node_ranks: Mapping[str, int],
        local: AppLauncher,
        *,
        start_timeout_s: float,
    ) -> None:
        self._link = link
        self._node_ranks = dict(node_ranks)
        self._local = local
        self._start_timeout_s = start_timeout_s

    def render_command(self, spec: TaskSpec) -> list[str]:
        return self._local.render_command(spec)  # what the worker's local launcher runs

    def start(self, spec: TaskSpec) -> RunningTask:
        hosts = spec.hostnames
        rank = self._node_ranks.get(hosts[0]) if len(hosts) == 1 else None
        if rank is None:
            raise StartFailed(f"job {spec.job_id}: no rank serves nodes {', '.join(hosts)}")
        spec = dataclasses.replace(spec, env={**spec.env, "LODE_WORKER_RANK": str(rank)})
        if rank == 0:
            return self._local.start(spec)
        return self._link.start_task(rank, spec, self._start_timeout_s)

    def check_available(self) -> None:
        self._local.check_available()
