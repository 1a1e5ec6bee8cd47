"""Work split across spawned processes, one per share, fed chunks over a pipe by its parent.

The parent (:class:`Shares`) reads its input once and sends each process the chunks of
its share (:meth:`Shares.send`), then ``None`` for the end (:meth:`Shares.finish`); each
process (:func:`serve`) works through them and sends one outcome back on the same pipe:
its result, or a :class:`ShareFailure` that says why there is none.

The processes are spawned, not forked: the parent runs an event loop and threads (nats-py's,
the executor's) that a fork would copy in whatever state they are in. Whatever ends the
parent's wait (a share's error, a process that died, the caller cancelling), every process
still running is terminated and reaped before the error goes on (:meth:`Shares.stop`), so
none outlives the call. A process ends with its parent whatever happens to that one: a
thread waits on the parent's end of the spawn pipe and exits the process when it closes,
and the chunks' pipe reads as ended. Ctrl-C reaches the whole process group, so a process
ignores it: the parent decides, and stops it, without a traceback there.

Used by the analytics' split replay and by the projector's split rebuild.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import os
import signal
import sys
import threading
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from typing import Any, Final, Generic, NoReturn, TypeVar

from lodestream.collector import collector_paused

log = logging.getLogger(__name__)

START_METHOD: Final = "spawn"
STOP_GRACE_S: Final = 5.0  # after SIGTERM, before SIGKILL
# Exit statuses of a process whose parent went away (nobody wants its result): seen while
# it worked, or only when it sent the result.
ORPHANED_EXIT: Final = 3
ORPHANED_AT_SEND_EXIT: Final = 4

Task = TypeVar("Task")
Receive = Callable[[], Any]
"""A process's next chunk from its parent (blocking), or None: its input has ended."""


@dataclass(frozen=True, slots=True)
class ShareFailure:
    """Why a share has no result: the error's words, a tag the caller's :meth:`error` maps
    to its own exception, and the traceback of an unexpected failure."""

    message: str
    kind: str = ""
    detail: str = ""


class Shares(Generic[Task]):
    """The processes running ``target(task, pipe)`` for ``tasks``, one each: :meth:`start`,
    :meth:`send` their chunks, :meth:`finish`, :meth:`collect`, and :meth:`stop` always.

    ``what`` names one process in errors ("replay process"); ``error`` is the exception
    raised for a process that died or sent what cannot be read, and ``failed`` turns a
    :class:`ShareFailure` a process sent into the exception raised for it.
    """

    def __init__(
        self,
        target: Callable[[Task, Connection], None],
        tasks: Sequence[Task],
        *,
        name: str,
        what: str,
        error: Callable[[str], Exception],
        failed: Callable[[ShareFailure], Exception],
    ) -> None:
        self._target = target
        self._tasks = tasks
        self._name = name
        self._what = what
        self._error = error
        self._failed = failed
        self._processes: list[BaseProcess] = []
        self._pipes: list[Connection] = []

    @property
    def processes(self) -> tuple[BaseProcess, ...]:
        """The processes started, in order of share."""
        return tuple(self._processes)

    def start(self) -> None:
        context = multiprocessing.get_context(START_METHOD)
        count = len(self._tasks)
        for share, task in enumerate(self._tasks):
            ours, theirs = context.Pipe(duplex=True)  # chunks there, the outcome back
            process = context.Process(
                target=self._target, args=(task, theirs), daemon=True,
                name=f"{self._name}-{share}-of-{count}",
            )  # fmt: skip
            try:
                process.start()
            except BaseException:
                ours.close()
                raise
            finally:
                # The child holds the only other end now: if it dies, its pipe reads as ended.
                theirs.close()
            self._pipes.append(ours)
            self._processes.append(process)

    def send(self, share: int, chunk: Any) -> None:
        """Hand ``chunk`` to the process of ``share`` (blocking while it is busy with the one
        before: its pipe holds less than a chunk); if it is gone, the error that says why."""
        pipe = self._pipes[share]
        if pipe.poll():  # a process sends nothing before the end of its input but a failure
            raise self._gone(share)
        try:
            pipe.send(chunk)
        except OSError:  # it died
            raise self._gone(share) from None

    def finish(self) -> None:
        """Tell every process that its input has ended: each sends its outcome back."""
        for share in range(len(self._pipes)):
            self.send(share, None)

    def collect(self) -> list[Any]:
        """Every share's outcome, in order of share (blocking); the first failure raised."""
        outcomes: dict[int, Any] = {}
        waiting = dict(zip(self._pipes, range(len(self._pipes)), strict=True))
        try:
            while waiting:
                for pipe in wait(list(waiting)):
                    assert isinstance(pipe, Connection)
                    share = waiting.pop(pipe)
                    outcomes[share] = self._received(share, pipe)
        finally:
            for pipe in waiting:  # those of the shares still running, after a failure
                pipe.close()
        return [outcomes[share] for share in range(len(self._pipes))]

    def _received(self, share: int, pipe: Connection) -> Any:
        try:
            outcome = pipe.recv()
        except (EOFError, OSError):  # ended, or reset: it died with a chunk of ours unread
            raise self._died(share) from None
        except Exception as exc:  # what a process sends is this package's; a bug, in words
            raise self._error(f"{self._what} {share} sent what cannot be read: {exc!r}") from exc
        finally:
            pipe.close()
        if isinstance(outcome, ShareFailure):
            raise self._failure(share, outcome)
        return outcome

    def _failure(self, share: int, failure: ShareFailure) -> Exception:
        if failure.detail:
            log.debug("%s %d failed:\n%s", self._what, share, failure.detail)
        return self._failed(failure)

    def _gone(self, share: int) -> Exception:
        """Why the process of ``share`` took no more: the failure it sent, or its end."""
        pipe = self._pipes[share]
        try:
            if pipe.poll():
                outcome = pipe.recv()
                if isinstance(outcome, ShareFailure):
                    return self._failure(share, outcome)
        except (EOFError, OSError):
            pass
        return self._died(share)

    def _died(self, share: int) -> Exception:
        process = self._processes[share]
        process.join(STOP_GRACE_S)
        code = process.exitcode
        how = f"killed by signal {-code}" if code is not None and code < 0 else f"exit code {code}"
        return self._error(
            f"{self._what} {share} of {len(self._processes)} ended without its result ({how})"
        )

    def stop(self) -> None:
        """Terminate and reap every process still running (none is left behind)."""
        for process in self._processes:
            if process.is_alive():
                process.terminate()
        for process in self._processes:
            process.join(STOP_GRACE_S)
            if process.is_alive():
                process.kill()
                process.join()


# How many processes a split takes when its caller does not say. Measured on the analytics'
# replay (python -m bench.analytics, a 2-core machine with other work on it, 1,000,000
# events): one process replayed in 33-36 s, two in 25-28 s where the load left both cores.
# So two cores or more split, one process per core up to 4 (more is not measured: the
# reading process deals out every message, about 10 s of one core a million). Starting the
# processes (each imports the package) and sending results back costs about a second: over
# 100,000 events two took 4.4 s against 3.9 s for one, so a short range is not split. The
# rebuild's fold, the same shape, follows the same rule.
DEFAULT_WORKERS: Final = 4
SPLIT_FROM_CORES: Final = 2
SPLIT_FROM: Final = 250_000


def default_workers(messages: int) -> int:
    """How many processes split ``messages`` when the caller does not say: one per core this
    process may use, up to :data:`DEFAULT_WORKERS`, for a range of :data:`SPLIT_FROM` or
    more where it may use :data:`SPLIT_FROM_CORES` or more; else 1 (no split)."""
    cores = usable_cores()
    if cores < SPLIT_FROM_CORES or messages < SPLIT_FROM:
        return 1
    return min(cores, DEFAULT_WORKERS)


def usable_workers(asked: int) -> int:
    """``asked`` processes, but no more than this process may use cores, and at least one."""
    return max(1, min(asked, usable_cores()))


def usable_cores() -> int:
    """The cores this process may run on: its affinity (a batch job's or a container's share
    of the host), not the host's count, which a split across processes would oversubscribe."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux: no affinity API, every core is taken to be ours
        return os.cpu_count() or 1


async def send_all(pool: Shares[Task], chunks: Sequence[Any]) -> None:
    """Send each share its chunk (none to a share whose chunk is empty), from threads: a
    process busy with its last chunk delays neither the others nor the caller's loop, which
    reads the next batch meanwhile. Each send is waited for, failed or not, before the
    first failure goes on: none is left running."""
    sent = await asyncio.gather(
        *(asyncio.to_thread(pool.send, share, chunk) for share, chunk in enumerate(chunks)
          if chunk),
        return_exceptions=True,
    )  # fmt: skip
    for outcome in sent:
        if isinstance(outcome, BaseException):
            raise outcome


def id_share(token: bytes, shares: int) -> int:
    """The share (0 to ``shares`` - 1) of an aggregate id as a subject spells it: the same
    in every process and every run (Python's ``hash`` of a string is salted per process)."""
    try:
        # The shared rule accepts only the canonical spelling of an id on a subject, so any
        # reading of the token that is the same from one run to the next is enough.
        return int(token.replace(b"-", b""), 16) % shares
    except ValueError:  # no uuid: the shared rule refuses it wherever it goes
        return 0


def serve(
    pipe: Connection,
    work: Callable[[Receive], Any],
    failure: Callable[[Exception], ShareFailure],
) -> NoReturn:
    """Run ``work`` in a spawned process on the chunks received on ``pipe``; send its
    outcome back on the pipe (``failure(exc)`` if it raised), then end the process."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _end_with_parent()
    # Paused until the end: what the work keeps is built once and freed with the process,
    # and sending it back, with the collector walking all of it again as pickling
    # allocates, takes twice as long.
    with collector_paused():
        try:
            outcome = work(lambda: _receive(pipe))
        except Exception as exc:
            outcome = failure(exc)
        try:
            with pipe:
                pipe.send(outcome)
                if isinstance(outcome, ShareFailure):
                    # Read on to the end (the parent sees the failure at its next chunk):
                    # ended with a chunk unread, the pipe would be reset, the failure lost.
                    _drain(pipe)
        except OSError:  # the parent is gone, and the watch has not woken yet
            os._exit(ORPHANED_AT_SEND_EXIT)
    # Freeing what the work built, object by object, would take a second the parent waits
    # for when it reaps this process; nothing of it needs to be closed or written.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def unexpected(words: str, exc: Exception, kind: str = "") -> ShareFailure:
    """The failure for an error the work did not expect: in words, with its traceback."""
    return ShareFailure(f"{words}: {exc!r}", kind, "".join(traceback.format_exception(exc)))


def _receive(pipe: Connection) -> Any:
    try:
        return pipe.recv()
    except (EOFError, OSError):  # the parent closed its end without the end of the input
        os._exit(ORPHANED_EXIT)


def _drain(pipe: Connection) -> None:
    try:
        while pipe.recv() is not None:
            pass
    except EOFError:  # the parent read the failure and closed its end
        return


def _end_with_parent() -> None:
    parent = multiprocessing.parent_process()
    if parent is None:
        return

    def watch() -> None:
        parent.join()  # its end of the pipe closes when it ends, however it ends
        os._exit(ORPHANED_EXIT)

    threading.Thread(target=watch, name="watch-parent", daemon=True).start()
