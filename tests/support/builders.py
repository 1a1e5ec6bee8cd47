"""Event builders for tests: valid by default, so each test states only what it varies."""

from __future__ import annotations

import uuid
from typing import Any

from lodestream.schemas.envelope import Event
from lodestream.schemas.events import (
    JobCreated,
    JobFinished,
    JobPreprocessed,
    JobRunDone,
    JobStarted,
    SiteRegistered,
)
from lodestream.schemas.events.job import FinishedData, RunResultData, StartedData, StepData
from lodestream.schemas.events.site import SiteRegisteredData
from lodestream.schemas.ids import derived_id
from lodestream.schemas.resources import JobSpec
from lodestream.schemas.states import FINISHED_AT_RUN_END


def site_registered(name: str, owner: str) -> SiteRegistered:
    return SiteRegistered.create(
        site=name,
        aggregate_id=derived_id("site", name),
        actor=f"user:{owner}",
        data=SiteRegisteredData(name=name, owner=owner),
    )


def job_created(site: str, owner: str, **spec: Any) -> JobCreated:
    fields: dict[str, Any] = {"site": site, "app": "demo", "workdir": "w"} | spec
    return JobCreated.create(
        site=site,
        aggregate_id=uuid.uuid4(),
        actor=f"user:{owner}",
        data=JobSpec.model_validate(fields),
    )


def lifecycle(created: JobCreated, session: uuid.UUID | None = None) -> list[Event]:
    """The common six-event path after creation: preprocessed, started, run_done, finished."""
    session = session or uuid.uuid4()
    site, job = created.site, created.aggregate_id
    return [
        JobPreprocessed.create(
            site=site, aggregate_id=job, actor="controller:main",
            data=StepData(skipped=("job.ready", "job.staged_in")),
        ),
        JobStarted.create(
            site=site, aggregate_id=job, actor=f"launcher:{session}",
            data=StartedData(session_id=session, skipped=("job.leased",)),
        ),
        JobRunDone.create(
            site=site, aggregate_id=job, actor=f"launcher:{session}",
            data=RunResultData(return_code=0, runtime_s=0.01),
        ),
        JobFinished.create(
            site=site, aggregate_id=job, actor="controller:main",
            data=FinishedData(skipped=("job.postprocessed", "job.staged_out")),
        ),
    ]  # fmt: skip


def lifecycle_finished_by_pilot(
    created: JobCreated, session: uuid.UUID | None = None
) -> list[Event]:
    """The path of a job nothing follows: the pilot's job.finished stands for run_done too."""
    session = session or uuid.uuid4()
    site, job = created.site, created.aggregate_id
    preprocessed, started = lifecycle(created, session)[:2]
    return [
        preprocessed,
        started,
        JobFinished.create(
            site=site, aggregate_id=job, actor=f"launcher:{session}",
            data=FinishedData(skipped=FINISHED_AT_RUN_END,
                              run=RunResultData(return_code=0, runtime_s=0.01, result=[1, 2])),
        ),
    ]  # fmt: skip
