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


@dataclass(frozen=True, slots=True)
class AppFailure:
    """Failures of one app with one exit code and one first line of stderr (or reason)."""

    app: str
    type: str
    return_code: int | None  # None: the job failed without a run's exit (job.failed)
    first_line: str  # stderr's first line; for job.failed, the reason and cause chain
    events: int
    jobs: int
    jobs_failed: int  # of those jobs, how many are FAILED at the end
    example_job: uuid.UUID

    @property
    def label(self) -> str:
        code = f"exit {self.return_code}"
        if self.return_code is None:
            code = "job failed" if self.type == "job.failed" else self.type
        return f"{self.app} · {code} · {self.first_line or '(stderr empty)'}"


def first_line(failure: FailureRecord) -> str:
    """What a reader recognises a failure by: stderr's first line, else its reason and causes."""
    if failure.stderr_first or failure.stderr_tail:
        return failure.stderr_first or failure.stderr_tail
    return " ← ".join(mask(chain_of(failure)))


def failures_by_app(jobs: Iterable[JobTimeline]) -> tuple[AppFailure, ...]:
    """Groups by app, exit code and first line, most events first (then by those keys)."""
    # Keyed by whether there is an exit code, then the code: None sorts, and -9 stays -9.
    groups: dict[tuple[str, str, bool, int, str], _Group] = {}
    for job in jobs:
        for failure in job.failures:
            code = failure.return_code
            key = (job.app, failure.type, code is None, code or 0,
                   _UUID.sub("<id>", first_line(failure)))  # fmt: skip
            group = groups.setdefault(key, _Group())
            group.events += 1
            group.jobs.add(job.job_id)
            if job.state is JobState.FAILED:
                group.failed.add(job.job_id)
            if group.example is None:
                group.example = (job.job_id, "")
    ordered = sorted(groups.items(), key=lambda kv: (-kv[1].events, kv[0]))
    return tuple(
        AppFailure(app, kind, None if no_code else code, line, g.events, len(g.jobs),
                   len(g.failed), g.example[0] if g.example else uuid.UUID(int=0))
        for (app, kind, no_code, code, line), g in ordered
    )  # fmt: skip
