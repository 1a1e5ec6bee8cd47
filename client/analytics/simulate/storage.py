"""Storage bandwidth shared equally by the tasks reading at once (processor sharing).

Every active transfer progresses at ``bandwidth / n`` bytes/s while ``n`` are active. Kept
as a "virtual" byte count each active transfer has received since the storage was created:
a transfer of ``b`` bytes entering when that count is ``v`` ends when it reaches ``v + b``,
so a change in ``n`` moves no finish times, and the next end is the heap's first.
"""

from __future__ import annotations

import heapq

_RELATIVE = 1e-9  # float rounding when the heap's first is exactly due: of the bytes counted


class SharedStorage:
    def __init__(self, bandwidth: float) -> None:
        self.bandwidth = bandwidth
        self._virtual = 0.0
        self._at = 0.0
        self._active: list[tuple[float, int]] = []  # (virtual bytes at its end, job)

    def __len__(self) -> int:
        return len(self._active)

    def _advance(self, now: float) -> None:
        if self._active:
            self._virtual += (now - self._at) * self.bandwidth / len(self._active)
        self._at = now

    def add(self, now: float, job: int, nbytes: float) -> None:
        self._advance(now)
        heapq.heappush(self._active, (self._virtual + nbytes, job))

    def next_end(self) -> float | None:
        """When the first active transfer ends if none joins before; None if none is active."""
        if not self._active:
            return None
        left = max(self._active[0][0] - self._virtual, 0.0)
        return self._at + left * len(self._active) / self.bandwidth

    def pop_ended(self, now: float) -> list[int]:
        """The jobs whose transfer has ended by ``now``, which is :meth:`next_end`'s time or
        later: the first active transfer is among them even if rounding left it a byte short
        (else the caller would wait for it at the same time for ever)."""
        due = self.next_end()
        self._advance(now)
        ended = [heapq.heappop(self._active)[1]] if due is not None and now >= due else []
        slack = _RELATIVE * max(1.0, self._virtual)
        while self._active and self._active[0][0] <= self._virtual + slack:
            ended.append(heapq.heappop(self._active)[1])
        return ended
