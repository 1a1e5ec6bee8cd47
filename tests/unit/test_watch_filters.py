"""The watch's own filters on real events: tags come from the job's spec in job.created."""

from __future__ import annotations

import uuid

from lodestream.client.watch import Filters
from lodestream.schemas.events import JobCreated, JobKilled
from lodestream.schemas.events.job import CreatedData, ReasonData

SITE = "alpha"


def created(job_id: uuid.UUID, tags: dict[str, str]) -> JobCreated:
    data = CreatedData(site=SITE, app="demo", workdir="w", tags=tags)
    return JobCreated.create(site=SITE, aggregate_id=job_id, actor="user:ada", data=data)


def killed(job_id: uuid.UUID) -> JobKilled:
    return JobKilled.create(
        site=SITE, aggregate_id=job_id, actor="user:ada", data=ReasonData(reason="enough")
    )


def test_a_tag_filter_admits_the_tagged_jobs_events_and_only_theirs() -> None:
    chosen = Filters.of(None, None, {"run": "42"})
    tagged: set[uuid.UUID] = set()
    mine, other = uuid.uuid4(), uuid.uuid4()
    assert chosen.admits(created(mine, {"run": "42", "beam": "b1"}), tagged)
    assert not chosen.admits(created(other, {"run": "41"}), tagged)
    # Later events carry no spec: they are admitted by the job they belong to.
    assert chosen.admits(killed(mine), tagged)
    assert not chosen.admits(killed(other), tagged)
