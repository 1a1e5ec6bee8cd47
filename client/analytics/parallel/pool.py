"""The parent of a split replay: starts one process per share, feeds each its share of the
messages (:meth:`Shares.send`), and collects their parts.

The processes are spawned, not forked: the parent runs an event loop and threads (nats-py's,
the executor's) that a fork would copy in whatever state they are in. Whatever ends the
parent's wait (a share's error, a process that died, the caller cancelling), every process
still running is terminated and reaped before the error goes on, so none outlives the call.
"""

from __future__ import annotations

import logging
import multiprocessing
from collections.abc import Sequence
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from typing import Final

from lodestream.client.analytics.errors import AnalyticsError
from lodestream.client.analytics.parallel.compact import PackedPart, unpack
from lodestream.client.analytics.parallel.worker import (
    Chunk,
    ShareFailure,
    ShareTask,
    replay_share,
)
from lodestream.client.analytics.summary import Loaded

log = logging.getLogger(__name__)

START_METHOD: Final = "spawn"
STOP_GRACE_S: Final = 5.0  # after SIGTERM, before SIGKILL


class Shares:
    """The processes replaying ``tasks``, one each: :meth:`start`, :meth:`send` their chunks,
    :meth:`finish`, :meth:`collect`, and :meth:`stop` always."""

    def __init__(self, tasks: Sequence[ShareTask]) -> None:
        self._tasks = tasks
        self._processes: list[BaseProcess] = []
        self._pipes: list[Connection] = []

    @property
    def processes(self) -> tuple[BaseProcess, ...]:
        """The processes started, in order of share."""
        return tuple(self._processes)

    def start(self) -> None:
        context = multiprocessing.get_context(START_METHOD)
        for task in self._tasks:
            ours, theirs = context.Pipe(duplex=True)  # chunks there, the part back
            process = context.Process(
                target=replay_share, args=(task, theirs), daemon=True,
                name=f"lode-analytics-{task.share}-of-{task.shares}",
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

    def send(self, share: int, chunk: Chunk) -> None:
        """Hand ``chunk`` to the process of ``share`` (blocking while it is busy with the one
        before: its pipe holds less than a chunk); if it is gone, the error that says why."""
        pipe = self._pipes[share]
        if pipe.poll():  # a process sends nothing before the end of the range but a failure
            raise self._gone(share)
        try:
            pipe.send(chunk)
        except OSError:  # it died
            raise self._gone(share) from None

    def finish(self) -> None:
        """Tell every process that the range has ended: each sends its part back."""
        for share in range(len(self._pipes)):
            self.send(share, None)

    def collect(self) -> list[Loaded]:
        """Every share's part, in order of share (blocking); the first failure raised."""
        parts: dict[int, Loaded] = {}
        waiting = dict(zip(self._pipes, range(len(self._pipes)), strict=True))
        try:
            while waiting:
                for pipe in wait(list(waiting)):
                    assert isinstance(pipe, Connection)
                    share = waiting.pop(pipe)
                    parts[share] = self._received(share, pipe)
        finally:
            for pipe in waiting:  # those of the shares still running, after a failure
                pipe.close()
        return [parts[share] for share in range(len(self._pipes))]

    def _received(self, share: int, pipe: Connection) -> Loaded:
        try:
            outcome = pipe.recv()
        except (EOFError, OSError):  # ended, or reset: it died with a chunk of ours unread
            raise self._died(share) from None
        except Exception as exc:  # what a process sends is this package's; a bug, in words
            raise AnalyticsError(
                f"replay process {share} sent what cannot be read: {exc!r}"
            ) from exc
        finally:
            pipe.close()
        if isinstance(outcome, ShareFailure):
            if outcome.detail:
                log.debug("replay process %d failed:\n%s", share, outcome.detail)
            raise outcome.error()
        if not isinstance(outcome, PackedPart):
            raise AnalyticsError(f"replay process {share} sent {type(outcome).__name__}")
        return unpack(outcome)

    def _gone(self, share: int) -> AnalyticsError:
        """Why the process of ``share`` took no more: the failure it sent, or its end."""
        pipe = self._pipes[share]
        try:
            if pipe.poll():
                outcome = pipe.recv()
                if isinstance(outcome, ShareFailure):
                    if outcome.detail:
                        log.debug("replay process %d failed:\n%s", share, outcome.detail)
                    return outcome.error()
        except (EOFError, OSError):
            pass
        return self._died(share)

    def _died(self, share: int) -> AnalyticsError:
        process = self._processes[share]
        process.join(STOP_GRACE_S)
        code = process.exitcode
        how = f"killed by signal {-code}" if code is not None and code < 0 else f"exit code {code}"
        return AnalyticsError(
            f"replay process {share} of {len(self._processes)} ended without its result ({how})"
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
