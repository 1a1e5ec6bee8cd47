"""The live projector's cache between batches (``services/projector/cache.py``) and the
row encoding it writes (``rows.py``): without Postgres.

What the cache must never do is fold a batch onto state another writer has changed, or onto
what a failed batch left half-folded; that it is reloaded when the position row moved under
it is tested against Postgres in ``tests/integration/test_projector.py``.
"""

from __future__ import annotations

import itertools
import json
from datetime import UTC, datetime, timedelta, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import TypeAdapter

from lodestream.schemas.envelope import Event
from lodestream.schemas.fold import JobView
from lodestream.schemas.states import JobState
from lodestream.services.projector.cache import FoldCache
from lodestream.services.projector.projection import Changes, Known, Projection
from lodestream.services.projector.rows import JobProgress, JobRecord
from lodestream.services.projector.store import Position
from tests.support.builders import job_created, lifecycle
from tests.support.folding import OWNER, SESSION, SITE, fold

AT = Position(seq=10, writer=700)


def test_the_cache_is_used_only_at_the_position_committed_with_it() -> None:
    cache = FoldCache(max_jobs=10)
    known = Known(site_owners={SITE: OWNER})
    cache.give_back(known, AT)
    assert cache.take(AT) is known
    for other in (Position(11, 700), Position(10, 701)):  # another batch, another writer
        cache.give_back(known, AT)
        assert cache.take(other) is None


def test_a_taken_cache_is_gone_until_its_batch_commits() -> None:
    cache = FoldCache(max_jobs=10)
    cache.give_back(Known(), AT)
    assert cache.take(AT) is not None
    # The batch failed before keep(): what it folded must not be folded onto again.
    assert cache.take(AT) is None


def test_kept_jobs_are_progress_only_and_bounded() -> None:
    cache = FoldCache(max_jobs=4)
    projection = Projection(Known(site_owners={SITE: OWNER}), Changes())
    created = [job_created(SITE, OWNER) for _ in range(6)]
    fold(projection, list(created))
    cache.keep(projection.known, projection.changes, AT)
    known = cache.take(AT)
    assert known is not None
    assert all(isinstance(entry, JobProgress) for entry in known.jobs.values())
    assert len(known.jobs) == len(created)  # kept whole: a next batch may be folding onto it
    cache.trim(known)
    # Past the bound the oldest go, down to half of it.
    assert list(known.jobs) == [c.aggregate_id for c in created[4:]]


def history() -> list[Event]:
    jobs = [job_created(SITE, OWNER) for _ in range(3)]
    steps = [lifecycle(job, SESSION) for job in jobs]
    # Interleaved, one job's events spread over many batches.
    return [*jobs, *itertools.chain.from_iterable(zip(*steps, strict=True))]


@given(st.sets(st.integers(1, len(history()) - 1), max_size=6))
def test_folding_onto_the_cache_equals_folding_in_one(cuts: set[int]) -> None:
    events = history()
    whole = Projection(Known(site_owners={SITE: OWNER}), Changes())
    fold(whole, events)

    cache = FoldCache(max_jobs=100)
    cache.give_back(Known(site_owners={SITE: OWNER}), Position(0, 1))
    rows = []
    bounds = [0, *sorted(cuts), len(events)]
    for n, (start, stop) in enumerate(itertools.pairwise(bounds)):
        known = cache.take(Position(start, n + 1))
        assert known is not None
        batch = Projection(known, Changes())
        fold(batch, events[start:stop], first_seq=start + 1)
        rows += batch.changes.job_events
        cache.keep(known, batch.changes, Position(stop, n + 2))
    assert rows == whole.changes.job_events
    known = cache.take(Position(len(events), len(bounds)))
    assert known is not None
    expected = {
        job_id: (entry.progress if isinstance(entry, JobRecord) else entry).to_copy()
        for job_id, entry in whole.known.jobs.items()
    }
    assert {job_id: entry.to_copy() for job_id, entry in known.jobs.items()} == expected


AWARE = TypeAdapter(datetime)


@pytest.mark.parametrize(
    "at",
    [
        datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC),
        datetime(2026, 1, 2, 3, 4, 5, 120, tzinfo=UTC),
        datetime(2026, 1, 2, 3, 4, 5, 500000, tzinfo=timezone(timedelta(hours=-5, minutes=-30))),
        AWARE.validate_json('"2026-01-02T03:04:05.000001+05:45"'),  # as an event carries it
        datetime.fromisoformat("2026-01-02T03:04:05.25+02:00"),  # as a row is read back
    ],
)
def test_stage_times_are_written_as_isoformat(at: datetime) -> None:
    view = JobView(
        id=job_created(SITE, OWNER).aggregate_id,
        site=SITE,
        state=JobState.RUNNING,
        last_seq=3,
        stage_times={"CREATED": at, "RUNNING": at + timedelta(seconds=1)},
        updated_at=at,
    )
    written = json.loads(JobProgress(view).stage_times_json())
    assert written == {k: v.isoformat() for k, v in view.stage_times.items()}
