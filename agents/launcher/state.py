"""What the pilot's parts share while it runs: the jobs it holds, their chains, its nodes.

The offer (:mod:`~lodestream.agents.launcher.offering`) places a job and holds it, the run
(:mod:`~lodestream.agents.launcher.running`) leases, reports and frees it, stopping
(:mod:`~lodestream.agents.launcher.stopping`) drains or kills what still runs, and the
loop (:class:`~lodestream.agents.launcher.launcher.Launcher`) fetches only while nodes are
free. Each of them is handed this one object instead of reaching into the others.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from lodestream.agents.launcher.report import LauncherReport
from lodestream.agents.launcher.tasks import Reaper
from lodestream.agents.launcher.work import JobKey, WorkItem
from lodestream.platform_adapters.packing import JobRequest, NodePacker


@dataclass(frozen=True, slots=True)
class Waiting:
    """A delivery kept beside full slots: everything but a free slot was checked."""

    item: WorkItem
    request: JobRequest
    prefer: list[str]  # the nodes to place it on first (their caches hold its inputs)
    since: float  # monotonic
    # Its check against its job.created (Running.check_kept), begun when it was kept so that
    # a freed slot waits for the lease alone; None when the delivery is the job.created.
    check: asyncio.Task[bool] | None = None


@dataclass(slots=True)
class PilotState:
    packer: NodePacker  # the nodes' free slots: allocated at the offer, released at the end
    report: LauncherReport = field(default_factory=LauncherReport)
    reaper: Reaper = field(default_factory=Reaper)  # the tasks that run, until they end
    jobs: set[asyncio.Task[None]] = field(default_factory=set)  # one per job held
    # What we hold, from the offer until the task is reported: one entry per job.
    held: dict[JobKey, WorkItem] = field(default_factory=dict)
    # Jobs holding an allocation: from the offer until their task has ended.
    placed: set[JobKey] = field(default_factory=set)
    # Deliveries kept, unleased, for the next free slot (launcher.prefetch), in order, and
    # what places them (the offer's): called the moment a slot frees.
    waiting: dict[JobKey, Waiting] = field(default_factory=dict)
    place_waiting: Callable[[], Awaitable[None]] | None = None
    # The last sequence of our CAS chain; present only while we may still report.
    chains: dict[JobKey, int] = field(default_factory=dict)
    freed: asyncio.Event = field(default_factory=asyncio.Event)  # a slot was given back
    idle_from: float = 0.0  # monotonic: not idle before a deferred retry falls due
    draining: bool = False
    drain_until: float = 0.0  # monotonic: a drain's reports are given up after this
    revoked: bool = False  # the site's credential: nothing can be reported any more
    # When the pilot was told to stop (monotonic): a task that dies about then died of it.
    stopping: asyncio.Event = field(default_factory=asyncio.Event)
    stopped_at: float | None = None

    def start_job(self, job: Coroutine[Any, Any, None]) -> None:
        """Run ``job`` as one of the jobs the pilot holds (and waits for when it stops)."""
        task = asyncio.create_task(job)
        self.jobs.add(task)
        task.add_done_callback(self.jobs.discard)

    def forget(self, key: JobKey) -> None:
        """The job is done with: nothing is held or reported for it any more."""
        self.chains.pop(key, None)
        self.held.pop(key, None)
