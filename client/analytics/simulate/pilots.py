"""What the simulator holds of a pilot: its nodes' free slots and the jobs it keeps for its
own next room; and the offers of a job it handed back (its hand-back cycle)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass(slots=True)
class Pilot:
    """An open pilot: each node's slots (``size``) and those free, and its kept jobs."""

    size: list[int]
    free: list[int]
    free_slots: int = 0  # counters, so that a full pilot is passed over at once
    idle_nodes: int = 0
    # Jobs it fetched and keeps for its own next room (launcher.prefetch), and since when.
    kept: dict[int, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.free_slots = sum(self.free)
        self.idle_nodes = sum(1 for f, s in zip(self.free, self.size, strict=True) if f == s)

    def take(self, nodes: int, units: int = 1) -> tuple[tuple[int, int], ...] | None:
        """``units`` slots of one node for a one-node job, else ``nodes`` idle nodes whole:
        (node, slots taken) each; None if they are not free."""
        if nodes == 1:
            if self.free_slots < units:
                return None
            for j, left in enumerate(self.free):
                need = min(units, self.size[j])  # a node narrower than the job: all of it
                if left >= need:
                    self.idle_nodes -= left == self.size[j]
                    self.free[j] -= need
                    self.free_slots -= need
                    return ((j, need),)
            return None
        if self.idle_nodes < nodes:
            return None
        idle = [j for j, left in enumerate(self.free) if left == self.size[j]][:nodes]
        for j in idle:
            self.free_slots -= self.free[j]
            self.free[j] = 0
        self.idle_nodes -= nodes
        return tuple((j, self.size[j]) for j in idle)

    def fits(self, nodes: int, units: int = 1) -> bool:
        """Whether :meth:`take` would succeed now (taking nothing)."""
        if nodes != 1:
            return self.idle_nodes >= nodes
        if self.free_slots < units:
            return False
        return any(
            left >= min(units, size) for left, size in zip(self.free, self.size, strict=True)
        )

    def give_back(self, taken: tuple[tuple[int, int], ...]) -> None:
        for j, count in taken:
            self.free[j] += count
            self.free_slots += count
            self.idle_nodes += self.free[j] == self.size[j]


@dataclass(frozen=True, slots=True)
class Cycle:
    """The offers of a handed-back job: the points ``phase + k * period`` after ``handed_at``
    (times within a billionth of a period are the same time)."""

    handed_at: float
    period: float
    phase: float

    def _after(self, at: float) -> int:
        """The index of the first point after ``at``."""
        return math.floor((at - self.phase) / self.period + 1e-9) + 1

    def _at_or_after(self, at: float) -> int:
        """The index of the first point at ``at`` or later."""
        return math.ceil((at - self.phase) / self.period - 1e-9)

    def _point(self, k: int) -> float:
        return self.phase + k * self.period

    def first_after(self, at: float) -> float:
        """The first offer after ``at`` (and after the hand-back)."""
        return self._point(self._after(max(at, self.handed_at)))

    def offers_until(self, offer: float, limit: float) -> tuple[int, float]:
        """From ``offer`` (one of the points), how many come before ``limit`` (at least that
        one), and the first point after them."""
        k = round((offer - self.phase) / self.period)
        last = max(self._at_or_after(limit), k + 1)
        return last - k, self._point(last)

    def first_at_or_after(self, at: float) -> float:
        """The first offer at ``at`` or later (and after the hand-back)."""
        return self._point(max(self._at_or_after(at), self._after(self.handed_at)))
