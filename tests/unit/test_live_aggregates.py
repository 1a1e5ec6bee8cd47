"""The live aggregates are a fold of events: backlog by state, running, done per second,
failures with their cause."""

from __future__ import annotations

import uuid

from lodestream.client.live import WINDOW_S, LiveView, cause_of
from lodestream.client.watch import Watched
from lodestream.schemas.envelope import Event
from lodestream.schemas.events import JobFailed
from lodestream.schemas.events.job import FailureData
from lodestream.schemas.states import JobState
from tests.support.builders import job_created, lifecycle


def fold(view: LiveView, events: list[Event], start_seq: int, now: float) -> int:
    for offset, event in enumerate(events):
        view.apply(Watched(start_seq + offset, event.site, event), now)
    return start_seq + len(events)


def test_backlog_running_and_done_per_second() -> None:
    view = LiveView()
    jobs = [job_created("alpha", "ada") for _ in range(4)]
    seq = fold(view, list(jobs), 1, now=0.0)
    site = view.sites["alpha"]
    assert site.backlog() == {JobState.CREATED: 4}
    steps = [lifecycle(job) for job in jobs]
    seq = fold(view, [s[0] for s in steps] + [s[1] for s in steps[:2]], seq, now=1.0)
    assert site.backlog() == {JobState.PREPROCESSED: 2, JobState.RUNNING: 2}
    assert site.running == 2
    seq = fold(view, steps[0][2:] + steps[1][2:], seq, now=2.0)  # two jobs finish
    assert site.backlog() == {JobState.PREPROCESSED: 2}
    assert site.done_per_s(now=2.0) == 2 / WINDOW_S
    assert site.done_per_s(now=2.0 + WINDOW_S + 1) == 0.0  # out of the window
    assert site.last_seq == seq - 1


def test_failures_are_kept_with_their_cause() -> None:
    view = LiveView()
    job = job_created("beta", "bob")
    failed = JobFailed.create(
        site="beta", aggregate_id=job.aggregate_id, actor="controller:main",
        data=FailureData(reason="parent failed", cause=("job 1 exit 3",)),
    )  # fmt: skip
    fold(view, [job, failed], 10, now=0.0)
    site = view.sites["beta"]
    assert site.backlog() == {}
    [failure] = site.failures
    assert (failure.seq, failure.job, failure.type) == (11, job.aggregate_id, "job.failed")
    assert failure.cause == "parent failed; job 1 exit 3"
    assert cause_of(job) == "job.created"


def test_sites_are_folded_apart() -> None:
    view = LiveView()
    fold(view, [job_created("alpha", "ada"), job_created("beta", "bob")], 1, now=0.0)
    assert set(view.sites) == {"alpha", "beta"}
    assert all(sum(s.backlog().values()) == 1 for s in view.sites.values())
    assert isinstance(next(iter(view.sites["alpha"].states)), uuid.UUID)
