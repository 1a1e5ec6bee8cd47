"""Property: whatever the schemas accept, the real projector folds into Postgres without error.

Hypothesis takes a legal history of every aggregate kind (a site, an app, a job through
its whole life, a session, a batch job, a transfer, the site's scaler), replaces its payload's
strings and numbers with arbitrary ones — any unicode, NUL included, huge and negative numbers,
arbitrary JSON in the free-form fields — and keeps each event the schemas still accept.
The projector's own code (decode, fold, rows, one transaction) then applies the history
to a real Postgres. It must never raise and never meet a value Postgres refuses
(``Projector.unstorable`` counts those): the schemas are the only gate.
"""

from __future__ import annotations

import asyncio
import itertools
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lodestream.schemas.codec import decode_document, encode, to_document
from lodestream.schemas.envelope import Event
from lodestream.schemas.errors import DecodeError
from lodestream.schemas.events import (
    AppRegistered,
    BatchJobFinished,
    BatchJobRequested,
    BatchJobSubmitted,
    JobCreated,
    JobFailed,
    JobKilled,
    JobLeased,
    JobPreprocessed,
    JobReset,
    JobRestartReady,
    JobRunErrored,
    JobStarted,
    ScalerBacklog,
    ScalerDecided,
    SessionClosed,
    SessionOpened,
    SiteRegistered,
    TransferFailed,
    TransferRequested,
)
from lodestream.schemas.events.batch import BatchFinishedData, BatchRequestData, BatchSubmittedData
from lodestream.schemas.events.job import (
    FailureData,
    LeaseData,
    Placement,
    ReasonData,
    RetryData,
    RunResultData,
    StartedData,
    StepData,
)
from lodestream.schemas.events.scaler import (
    ScalerBacklogData,
    ScalerBatchJob,
    ScalerDecidedData,
    ScalerDeletion,
    ScalerLimits,
    ScalerRequest,
    WindowData,
    scaler_id,
)
from lodestream.schemas.events.session import SessionClosedData, SessionOpenedData
from lodestream.schemas.events.site import SiteRegisteredData
from lodestream.schemas.events.xfer import TransferFailedData, TransferRequestedData
from lodestream.schemas.ids import derived_id
from lodestream.schemas.resources import App, JobSpec, NodeInfo
from lodestream.schemas.subjects import EVENTS_STREAM
from lodestream.services.projector.consumer import Projector
from lodestream.services.projector.messages import RawMessage
from lodestream.services.projector.store import ProjectionStore

SITE = "alpha"
OWNER = "ada"
AT = datetime(2026, 1, 1, tzinfo=UTC)
# Payload fields that identify rather than describe: replacing them tests the fold's
# legality checks (covered elsewhere), not what Postgres can store.
KEEP = frozenset({"site", "skipped", "session_id", "job_id", "parent_ids", "name", "owner"})

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
    max_leaves=6,
)


def _history(job: uuid.UUID, session: uuid.UUID) -> list[Event]:
    """One legal history touching every read model, with every free-text field filled."""
    spec = JobSpec.model_validate(
        {"site": SITE, "app": "demo", "workdir": "runs/1", "tags": {"run": "1"},
         "parameters": {"n": "5", "label": "x"}, "data": {"note": "d"}}
    )  # fmt: skip
    batch, xfer = derived_id("batch", str(job)), derived_id("xfer", str(job))
    launcher, site_actor, user = f"launcher:{session}", f"site:{SITE}", f"user:{OWNER}"
    app = App(site=SITE, name="demo", description="an app")
    nodes = (NodeInfo(hostname="nid0001", cores=4),)
    window = WindowData(queue="q", nodes=4, minutes=60)
    backlog = ScalerBacklogData(
        as_of_seq=5, runnable_jobs=3, node_footprint=1.5, node_minutes=45.0, max_wall_time_min=30,
        batch_jobs=(ScalerBatchJob(id=batch, state="queued", num_nodes=2, wall_time_min=30,
                                   queue="q", requested_at=AT, elastic=True),),
    )  # fmt: skip

    def ev(cls: type[Event], actor: str, data: Any, aggregate: uuid.UUID = job) -> Event:
        return cls.create(site=SITE, aggregate_id=aggregate, actor=actor, data=data,
                          occurred_at=AT)  # fmt: skip

    return [
        SiteRegistered.create(
            site=SITE,
            aggregate_id=derived_id("site", SITE),
            actor=user,
            occurred_at=AT,
            data=SiteRegisteredData(name=SITE, owner=OWNER, description="a site"),
        ),
        ev(AppRegistered, site_actor, app, derived_id("app", SITE, "demo")),
        ev(JobCreated, user, spec),
        ev(
            JobPreprocessed,
            "controller:main",
            StepData(skipped=("job.ready", "job.staged_in"), note="n", work=spec),
        ),
        ev(JobLeased, launcher, LeaseData(session_id=session, reason="r")),
        ev(
            JobStarted,
            launcher,
            StartedData(
                session_id=session,
                pid=42,
                placement=(Placement(hostname="nid0001", cores=(0, 1), gpus=(0,)),),
            ),
        ),
        ev(
            JobRunErrored,
            launcher,
            RunResultData(
                return_code=1,
                stderr_tail="boom",
                runtime_s=1.5,
                result={"r": 1},
                cause=("oom",),
                work=spec,
            ),
        ),
        ev(JobRestartReady, site_actor, RetryData(attempt=2, reason="retry", work=spec)),
        ev(JobKilled, user, ReasonData(reason="stop")),
        ev(JobReset, user, ReasonData(reason="again")),
        ev(JobFailed, "controller:main", FailureData(reason="gave up", cause=("a", "b"))),
        ev(
            SessionOpened,
            launcher,
            SessionOpenedData(
                hostname="nid0001",
                nodes=nodes,
                deadline=AT + timedelta(hours=1),
                heartbeat_ttl_s=10,
            ),
            session,
        ),
        ev(SessionClosed, launcher, SessionClosedData(reason="idle"), session),
        ev(
            BatchJobRequested,
            user,
            BatchRequestData(
                num_nodes=2, wall_time_min=30, queue="q", project="p", filter_tags={"a": "b"}
            ),
            batch,
        ),
        ev(BatchJobSubmitted, site_actor, BatchSubmittedData(scheduler_id="123"), batch),
        ev(
            BatchJobFinished,
            site_actor,
            BatchFinishedData(exit_code=0, state="s", reason="r"),
            batch,
        ),
        ev(
            TransferRequested,
            "controller:main",
            TransferRequestedData(
                job_id=job,
                slot="input",
                direction="in",
                remote={"location": "beamline", "path": "/data/x"},
                local_path="in/x",
            ),
            xfer,
        ),
        ev(TransferFailed, site_actor, TransferFailedData(reason="no route"), xfer),
        ev(ScalerBacklog, "controller:main", backlog, scaler_id(SITE)),
        ev(
            ScalerDecided,
            site_actor,
            ScalerDecidedData(
                backlog_id=job,
                backlog=backlog,
                windows=(window,),
                limits=ScalerLimits(queue="q", project="p", max_nodes=4, use_backfill=True),
                queued=1,
                running=0,
                requests=(
                    ScalerRequest(
                        batch_job_id=batch,
                        request=BatchRequestData(num_nodes=2, wall_time_min=30, queue="q"),
                        window=window,
                    ),
                ),
                deletions=(ScalerDeletion(batch_job_id=batch, reason="waited"),),
                reason="r",
            ),
            scaler_id(SITE),
        ),
    ]


@st.composite
def mutated(draw: st.DrawFn, value: Any, key: str = "") -> Any:
    """``value`` with some of its strings and numbers replaced by arbitrary ones."""
    if key in KEEP:
        return value
    if isinstance(value, dict):
        if key in {"parameters", "tags", "data", "result", "filter_tags"} and draw(st.booleans()):
            return draw(st.dictionaries(st.text(), JSON, max_size=4))
        return {k: draw(mutated(v, k)) for k, v in value.items()}
    if isinstance(value, list):
        return [draw(mutated(v, key)) for v in value]
    if not draw(st.booleans()):
        return value
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, str):
        return draw(st.text())
    if isinstance(value, int):
        return draw(st.integers())
    if isinstance(value, float):
        return draw(st.floats(allow_nan=False, allow_infinity=False))
    return value


@st.composite
def histories(draw: st.DrawFn) -> list[Event]:
    """A history in which each event is the template's or an accepted mutation of it."""
    events = []
    for event in _history(draw(st.uuids()), draw(st.uuids())):
        document = to_document(event)
        document["data"] = draw(mutated(document["data"]))
        try:
            events.append(decode_document(document))
        except DecodeError:
            events.append(event)  # the schema refused the mutation: nothing to store
    return events


async def _apply(dsn: str, events: list[Event], first_seq: int) -> Projector:
    projector = Projector(
        None,  # type: ignore[arg-type]  # apply() never touches NATS
        dsn, stream=EVENTS_STREAM, durable="property", batch_size=100, fetch_timeout_s=0.1,
        store=ProjectionStore("rm"), contiguous=False,
    )  # fmt: skip
    raws = [
        RawMessage(EVENTS_STREAM, seq, event.subject, encode(event))
        for seq, event in enumerate(events, start=first_seq)
    ]
    try:
        assert await projector.apply(raws)
    finally:
        if projector._conn is not None:
            await projector._conn.close()
    return projector


@pytest.mark.slow
def test_every_accepted_event_is_stored(database_url: str) -> None:
    sequence = itertools.count(1, 100)

    @settings(
        max_examples=120,
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )
    @given(histories())
    def fold_into_postgres(events: list[Event]) -> None:
        # Each history is its own site's; a fresh database per example would cost seconds.
        with psycopg.connect(database_url, autocommit=True) as conn:
            conn.execute(
                "TRUNCATE rm.sites, rm.jobs, rm.job_events, rm.quarantine, rm.apps, "
                "rm.projector_position, rm.scalers, rm.scaler_decisions"
            )
        projector = asyncio.run(_apply(database_url, events, next(sequence)))
        assert projector.unstorable == 0, "the schemas accepted what Postgres refuses"
        assert projector.applied == len(events)

    fold_into_postgres()
