"""Failures broken down by cause chain.

Each failure event (a run that errored or timed out, a job that failed) is grouped by its
type and its cause chain (task → session → batch job → scheduler exit, as the writers
record it), with a failed job's reason leading its chain. Ids differ from one failure to
the next (sessions, batch jobs, parents), so UUIDs in the chain are replaced by ``<id>`` for
grouping; each group keeps one example as written.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Final

from lodestream.client.analytics.timeline import FailureRecord, JobTimeline
from lodestream.schemas.states import JobState

_UUID: Final = re.compile(
    r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
)


@dataclass(frozen=True, slots=True)
class FailureGroup:
    type: str  # job.failed, job.run_errored, job.run_timed_out
    chain: tuple[str, ...]  # reason (if any), then the cause chain, ids masked
    events: int
    jobs: int
    jobs_failed: int  # of those jobs, how many are FAILED at the end
    return_codes: tuple[int, ...]  # distinct, sorted
    example_job: uuid.UUID
    example: str  # the first such failure as written (chain and stderr's last line)


@dataclass(slots=True)
class _Group:
    events: int = 0
    jobs: set[uuid.UUID] = field(default_factory=set)
    failed: set[uuid.UUID] = field(default_factory=set)
    codes: set[int] = field(default_factory=set)
    example: tuple[uuid.UUID, str] | None = None


def chain_of(failure: FailureRecord) -> tuple[str, ...]:
    """The failure's reason and cause chain as written."""
    return tuple(p for p in (failure.reason, *failure.cause) if p)


def mask(chain: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(_UUID.sub("<id>", link) for link in chain)


def failures_by_cause(jobs: Iterable[JobTimeline]) -> tuple[FailureGroup, ...]:
    """Groups, most events first (then by type and chain, for a stable order)."""
    groups: dict[tuple[str, tuple[str, ...]], _Group] = {}
    for job in jobs:
        for failure in job.failures:
            chain = chain_of(failure)
            group = groups.setdefault((failure.type, mask(chain)), _Group())
            group.events += 1
            group.jobs.add(job.job_id)
            if job.state is JobState.FAILED:
                group.failed.add(job.job_id)
            if failure.return_code is not None:
                group.codes.add(failure.return_code)
            if group.example is None:
                words = " ← ".join(chain) or "(no cause recorded)"
                if failure.stderr_tail:
                    words += f" [stderr: {failure.stderr_tail}]"
                group.example = (job.job_id, words)
    ordered = sorted(groups.items(), key=lambda kv: (-kv[1].events, kv[0]))
    return tuple(_group(kind, chain, g) for (kind, chain), g in ordered)


def _group(kind: str, chain: tuple[str, ...], g: _Group) -> FailureGroup:
    assert g.example is not None  # every group is made with its first failure
    job, words = g.example
    codes = tuple(sorted(g.codes))
    return FailureGroup(kind, chain, g.events, len(g.jobs), len(g.failed), codes, job, words)
