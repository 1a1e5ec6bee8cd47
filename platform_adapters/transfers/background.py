"""What the local and rsync backends share: tasks run by a small thread pool, kept in files.

``submit`` records the task (``task_store``) and hands it to the pool, so it returns at once.
A worker moves the task's items one after another and records each outcome as it settles;
``poll`` reads the record. A task whose record is not final and that nobody holds (its runner
died with the site agent) is taken up again by the next ``poll`` or ``submit``: items already
settled are not moved again, the one cut short is moved again from the start, which is
harmless because no backend ever writes a file under its final name before it is whole.
"""

from __future__ import annotations

import logging
import threading
from abc import abstractmethod
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from lodestream.platform_adapters.transfers.base import (
    ItemOutcome,
    TaskStatus,
    TransferBackend,
    TransferBatch,
    TransferItem,
    TransferUnavailable,
    UnknownTask,
)
from lodestream.platform_adapters.transfers.task_store import TaskRecord, TaskStore

logger = logging.getLogger("lodestream.platform_adapters.transfers")

CANCELLED_REASON = "cancelled before it was moved"


@dataclass
class RunContext:
    """What a worker tells the item it moves: the task, and whether to give up."""

    task_id: str
    cancelled: threading.Event = field(default_factory=threading.Event)
    # Set by ``close()``: the item stops and its outcome is not recorded, so the task is
    # taken up again by the next backend on this state directory.
    stopping: threading.Event = field(default_factory=threading.Event)

    @property
    def interrupted(self) -> bool:
        return self.cancelled.is_set() or self.stopping.is_set()


class BackgroundBackend(TransferBackend):
    """A backend whose tasks run in this process (see the module doc).

    ``state_dir`` is the site's directory for transfer state; tasks live under
    ``state_dir/<backend name>/``. ``max_workers`` bounds how many tasks move at once. The
    site calls ``close()`` when it stops: otherwise the interpreter waits at exit for the
    pool's threads, each until its item is moved.
    """

    # ``poll`` reads a file this process writes: asking often costs nothing, and lets the
    # module report a small copy as soon as it ends (see ``TransferBackend``).
    poll_every_s: ClassVar[float | None] = 0.1

    def __init__(self, state_dir: Path, *, max_workers: int = 4) -> None:
        if max_workers < 1:
            raise ValueError(f"max_workers must be at least 1, not {max_workers}")
        self.store = TaskStore(Path(state_dir) / self.name, self.name)
        self._pool = ThreadPoolExecutor(max_workers, thread_name_prefix=f"lode-{self.name}")
        # Reentrant: a future that is already done runs its callback (which takes the lock)
        # inside ``_start``, which holds it.
        self._lock = threading.RLock()
        self._running: dict[str, tuple[Future[None], RunContext]] = {}
        self._stopping = threading.Event()

    @abstractmethod
    def check_batch(self, batch: TransferBatch) -> None:
        """Refuse a batch that can never be moved (``TransferRefused``) or cannot be now
        (``TransferUnavailable``); called by ``submit`` before anything is recorded."""

    @abstractmethod
    def move_item(
        self, batch: TransferBatch, item: TransferItem, context: RunContext
    ) -> ItemOutcome | None:
        """Move one item; None when ``context.stopping`` cut it short (nothing is recorded)."""

    def submit(self, batch: TransferBatch) -> str:
        if self._stopping.is_set():
            raise TransferUnavailable(f"{self.name}: this backend is closed")
        self.check_batch(batch)
        with self._lock:
            record = self.store.create(batch)
            if not record.final:
                self._start(record.task_id)
        return record.task_id

    def poll(self, task_id: str) -> TaskStatus:
        record = self.store.load(task_id)
        if not record.final and not self._stopping.is_set():
            with self._lock:
                self._start(task_id)
        return record.status()

    def cancel(self, task_id: str) -> None:
        try:
            self.store.request_cancel(task_id)
        except UnknownTask:
            return
        with self._lock:
            running = self._running.get(task_id)
        if running is not None:
            running[1].cancelled.set()

    def close(self, *, wait: bool = True) -> None:
        """Stop: running items are cut short and left unrecorded, for the next backend."""
        self._stopping.set()
        with self._lock:
            for _, context in self._running.values():
                context.stopping.set()
        self._pool.shutdown(wait=wait, cancel_futures=True)

    def _start(self, task_id: str) -> None:
        """Hand the task to the pool unless this object already runs it (lock held)."""
        running = self._running.get(task_id)
        if running is not None and not running[0].done():
            return
        context = RunContext(task_id)
        if self.store.cancel_requested(task_id):
            context.cancelled.set()
        future = self._pool.submit(self._run, context)
        self._running[task_id] = (future, context)
        future.add_done_callback(lambda done: self._forget(task_id, done))

    def _forget(self, task_id: str, done: Future[None]) -> None:
        with self._lock:
            if self._running.get(task_id, (None,))[0] is done:
                del self._running[task_id]

    def _run(self, context: RunContext) -> None:
        try:
            with self.store.hold(context.task_id) as held:
                if held:
                    self._run_held(context)
        except Exception:
            # The record stays as it was; the next poll takes the task up again.
            logger.exception("%s: task %s stopped on an error", self.name, context.task_id)

    def _run_held(self, context: RunContext) -> None:
        record = self.store.load(context.task_id)
        if record.final:
            return  # its last holder ended it between our look and our taking the lock
        for item in record.pending():
            if context.stopping.is_set():
                return
            if context.cancelled.is_set() or self.store.cancel_requested(context.task_id):
                context.cancelled.set()
                outcome: ItemOutcome | None = ItemOutcome(ok=False, reason=CANCELLED_REASON)
            else:
                outcome = self._move_safely(record, item, context)
            if outcome is None:
                return
            record = record.settled(item.item_id, outcome)
            self.store.save(record)
        self.store.save(record.finished(_summary(record, context)))

    def _move_safely(
        self, record: TaskRecord, item: TransferItem, context: RunContext
    ) -> ItemOutcome | None:
        try:
            return self.move_item(record.batch, item, context)
        except Exception as exc:
            # A fault of ours, not of the data: worth another try, and worth a traceback.
            logger.exception("%s: item %s of task %s", self.name, item.item_id, record.task_id)
            return ItemOutcome(ok=False, reason=f"{self.name}: {type(exc).__name__}: {exc}")


def _summary(record: TaskRecord, context: RunContext) -> str:
    moved = sum(outcome.ok for outcome in record.outcomes.values())
    summary = f"{moved} of {len(record.outcomes)} items moved"
    return f"{summary}; cancelled" if context.cancelled.is_set() else summary
