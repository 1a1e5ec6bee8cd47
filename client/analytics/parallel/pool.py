"""The parent of a split replay: starts one process per share, collects and merges their parts.

The processes are spawned, not forked: the parent runs an event loop and threads (nats-py's,
the executor's) that a fork would copy in whatever state they are in. Whatever ends the
parent's wait (a share's error, a process that died, the caller cancelling), every process
still running is terminated and reaped before the error goes on, so none outlives the call.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
from collections.abc import Sequence
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from typing import Final

from lodestream.client.analytics.errors import AnalyticsError
from lodestream.client.analytics.parallel.worker import ShareFailure, ShareTask, replay_share
from lodestream.client.analytics.summary import Loaded

log = logging.getLogger(__name__)

START_METHOD: Final = "spawn"
STOP_GRACE_S: Final = 5.0  # after SIGTERM, before SIGKILL


class Shares:
    """The processes replaying ``tasks``, one each: :meth:`start`, :meth:`collect`, and
    :meth:`stop` always."""

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
            receive, send = context.Pipe(duplex=False)
            process = context.Process(
                target=replay_share, args=(task, send), daemon=True,
                name=f"lode-analytics-{task.share}-of-{task.shares}",
            )  # fmt: skip
            try:
                process.start()
            except BaseException:
                receive.close()
                raise
            finally:
                # The child holds the only sending end now: if it dies, its pipe reads as ended.
                send.close()
            self._pipes.append(receive)
            self._processes.append(process)

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
        except EOFError:
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
        if not isinstance(outcome, Loaded):
            raise AnalyticsError(f"replay process {share} sent {type(outcome).__name__}")
        return outcome

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


async def run_shares(tasks: Sequence[ShareTask]) -> list[Loaded]:
    """Each task replayed in its own process; their parts, in order of share."""
    shares = Shares(tasks)
    try:
        shares.start()
        # Waited for in a thread, so the event loop (the caller's) stays free; cancelling
        # this stops the processes, which ends the thread's wait.
        return await asyncio.to_thread(shares.collect)
    finally:
        shares.stop()
