"""The projector's in-memory fold of sites, apps, batch jobs, sessions, transfers and
heartbeats (``services/projector/projection.py``): the operations a batch yields for the
store, and what is quarantined and why. Without Postgres.
"""

from __future__ import annotations

import json
import uuid
from datetime import timedelta

import pytest
from pydantic import BaseModel

from lodestream.schemas.envelope import Event
from lodestream.schemas.events import (
    AppRegistered,
    AppRemoved,
    BatchJobDeletionRequested,
    BatchJobFinished,
    BatchJobQueued,
    BatchJobRequested,
    BatchJobRunning,
    BatchJobSubmitFailed,
    BatchJobSubmitted,
    ScalerBacklog,
    ScalerDecided,
    SessionClosed,
    SessionExpired,
    SessionOpened,
    SiteKeyBound,
    SiteLocationsSet,
    SiteRegistered,
    SiteRemoved,
    TransferFailed,
    TransferRequested,
    TransferSubmitted,
    TransferSucceeded,
)
from lodestream.schemas.events.app import AppRemovedData
from lodestream.schemas.events.batch import (
    BatchFinishedData,
    BatchReasonData,
    BatchRequestData,
    BatchSubmittedData,
)
from lodestream.schemas.events.scaler import (
    ScalerBacklogData,
    ScalerDecidedData,
    ScalerLimits,
    scaler_id,
)
from lodestream.schemas.events.session import (
    Heartbeat,
    SessionClosedData,
    SessionExpiredData,
    SessionOpenedData,
)
from lodestream.schemas.events.site import (
    SiteKeyData,
    SiteLocationsData,
    SiteRegisteredData,
    SiteRemovedData,
)
from lodestream.schemas.events.xfer import (
    TransferDoneData,
    TransferFailedData,
    TransferRequestedData,
    TransferSubmittedData,
)
from lodestream.schemas.ids import derived_id
from lodestream.schemas.resources import App, NodeInfo, TransferSpec
from lodestream.schemas.subjects import HB_STREAM
from lodestream.services.projector.messages import (
    ExpiryMarker,
    HeartbeatMessage,
    RawMessage,
)
from tests.support.builders import (
    job_created,
    site_registered,
)
from tests.support.folding import (
    AT,
    NKEY_USER,
    OWNER,
    SESSION,
    SITE,
    SITE_ACTOR,
    ev,
    fold,
    fresh,
    ops,
    reasons,
)

# --- sites and apps ------------------------------------------------------------------------


def test_a_site_is_registered_by_its_owner_and_then_owns_its_jobs() -> None:
    projection = fresh(owned=False)
    registered = site_registered(SITE, OWNER)
    fold(projection, [registered, job_created(SITE, OWNER)])
    assert projection.known.site_owners == {SITE: OWNER}
    ((statement, params),) = ops(projection)
    assert statement == "site_registered"
    assert (params["id"], params["owner"], params["seq"]) == (registered.aggregate_id, OWNER, 1)
    assert len(projection.changes.new_jobs) == 1


@pytest.mark.parametrize(
    ("registered", "owned", "reason"),
    [
        (
            SiteRegistered.create(
                site=SITE,
                aggregate_id=uuid.uuid4(),
                actor=f"user:{OWNER}",
                data=SiteRegisteredData(name=SITE, owner=OWNER),
            ),
            False,
            "site.registered does not match its site name",
        ),
        (
            SiteRegistered.create(
                site=SITE,
                aggregate_id=derived_id("site", SITE),
                actor="user:mallory",
                data=SiteRegisteredData(name=SITE, owner=OWNER),
            ),
            False,
            f"site registered by user:mallory for {OWNER}",
        ),
        (site_registered(SITE, OWNER), True, f"site {SITE!r} is already registered"),
    ],
    ids=["aggregate-id", "not-by-owner", "twice"],
)
def test_a_site_registration_that_does_not_hold_is_quarantined(
    registered: Event, *, owned: bool, reason: str
) -> None:
    projection = fresh(owned=owned)
    fold(projection, [registered])
    assert reasons(projection) == [f"illegal: {reason}"]
    assert ops(projection) == []


def test_a_removed_site_takes_no_more_jobs() -> None:
    projection = fresh()
    removed = ev(SiteRemoved, SiteRemovedData(), actor=f"user:{OWNER}")
    fold(projection, [removed, job_created(SITE, OWNER)])
    assert [statement for statement, _ in ops(projection)] == ["site_removed"]
    assert reasons(projection) == [f"illegal: job.created for unregistered site {SITE!r}"]


@pytest.mark.parametrize(
    "event",
    [
        ev(SiteKeyBound, SiteKeyData(public_key=NKEY_USER), actor="user:mallory"),
        ev(SiteRemoved, SiteRemovedData(), actor=SITE_ACTOR),
    ],
    ids=["key-bound", "removed"],
)
def test_only_the_owner_binds_a_key_or_removes_a_site(event: Event) -> None:
    projection = fresh()
    fold(projection, [event])
    assert reasons(projection) == [f"illegal: {event.type} by {event.actor}, not the site owner"]
    assert projection.known.site_owners == {SITE: OWNER}


def test_the_owner_binds_a_key() -> None:
    projection = fresh()
    fold(projection, [ev(SiteKeyBound, SiteKeyData(public_key=NKEY_USER), actor=f"user:{OWNER}")])
    assert [(s, p["public_key"]) for s, p in ops(projection)] == [("site_key_bound", NKEY_USER)]


APP = App(site=SITE, name="demo", hooks=("postprocess",))


def test_a_site_registers_and_removes_its_apps() -> None:
    projection = fresh()
    fold(projection, [ev(AppRegistered, APP), ev(AppRemoved, AppRemovedData(name="demo"))])
    (registered, upserted), (removed, gone) = ops(projection)
    assert (registered, upserted["name"], upserted["hooks"]) == (
        "app_upserted",
        "demo",
        '["postprocess"]',
    )
    assert (removed, gone["name"]) == ("app_removed", "demo")


@pytest.mark.parametrize(
    ("event", "owned", "reason"),
    [
        (
            ev(AppRegistered, APP, actor=f"user:{OWNER}"),
            True,
            f"app.registered must come from site:{SITE}",
        ),
        (
            ev(AppRegistered, APP.model_copy(update={"site": "beta"})),
            True,
            f"app for site 'beta' appended by {SITE!r}",
        ),
        (ev(AppRegistered, APP), False, f"app.registered for unregistered site {SITE!r}"),
    ],
    ids=["not-the-site", "another-sites-app", "unregistered-site"],
)
def test_an_app_event_that_does_not_hold_is_quarantined(
    event: Event, *, owned: bool, reason: str
) -> None:
    projection = fresh(owned=owned)
    fold(projection, [event])
    assert reasons(projection) == [f"illegal: {reason}"]


# --- batch jobs, sessions, transfers, heartbeats ----------------------------------------


def test_batch_job_events_are_state_changes_of_one_row() -> None:
    batch = uuid.uuid4()
    events = [
        ev(
            BatchJobRequested,
            BatchRequestData(num_nodes=2, wall_time_min=30, filter_tags={"a": "b"},
                             options={"qos": "debug"}),
            actor=f"user:{OWNER}",
            aggregate=batch,
        ),
        ev(BatchJobSubmitted, BatchSubmittedData(scheduler_id="123", scheduler="slurm"),
           aggregate=batch),
        ev(BatchJobQueued, BatchReasonData(), aggregate=batch),
        ev(BatchJobRunning, BatchReasonData(), aggregate=batch),
        ev(BatchJobFinished, BatchFinishedData(exit_code=0, state="walltime_expired",
                                               reason="done"), aggregate=batch),
    ]  # fmt: skip
    projection = fresh()
    fold(projection, events)
    (requested, params), *states = ops(projection)
    assert (requested, params["num_nodes"], params["filter_tags"], params["options"]) == (
        "batch_requested",
        2,
        '{"a":"b"}',
        '{"qos":"debug"}',
    )
    assert [
        (p["state"], p["scheduler_id"], p["scheduler"], p["exit_code"], p["scheduler_state"])
        for _, p in states
    ] == [
        ("submitted", "123", "slurm", None, None),
        ("queued", None, None, None, None),
        ("running", None, None, None, None),
        ("finished", None, None, 0, "walltime_expired"),
    ]
    assert all(p["id"] == batch for _, p in ops(projection))


def test_a_batch_job_requested_by_the_elastic_queue_is_told_from_a_users() -> None:
    ours, theirs = uuid.uuid4(), uuid.uuid4()
    projection = fresh()
    fold(projection, [
        ev(BatchJobRequested, BatchRequestData(num_nodes=1, wall_time_min=5), aggregate=ours),
        ev(BatchJobRequested, BatchRequestData(num_nodes=1, wall_time_min=5), aggregate=theirs,
           actor=f"user:{OWNER}"),
    ])  # fmt: skip
    assert [p["requested_by"] for _, p in ops(projection)] == [SITE_ACTOR, f"user:{OWNER}"]


def test_scaler_events_update_the_sites_scaler_and_keep_every_decision() -> None:
    backlog = ScalerBacklogData(as_of_seq=7, runnable_jobs=3, node_footprint=1.5)
    decided = ScalerDecidedData(
        backlog_id=uuid.uuid4(), backlog=backlog, limits=ScalerLimits(), reason="covered"
    )
    projection = fresh()
    fold(projection, [
        ev(ScalerBacklog, backlog, actor="controller:main", aggregate=scaler_id(SITE)),
        ev(ScalerDecided, decided, aggregate=scaler_id(SITE)),
    ])  # fmt: skip
    (stored, backlog_params), (seen, _), (decision, params) = ops(projection)
    assert (stored, seen, decision) == ("scaler_backlog", "scaler_decided", "scaler_decision")
    assert json.loads(backlog_params["backlog"])["node_footprint"] == 1.5
    assert (params["seq"], params["reason"], params["requests"], params["deletions"]) == (
        2, "covered", "[]", "[]",
    )  # fmt: skip
    inputs = json.loads(params["inputs"])
    assert set(inputs) == {"backlog", "windows", "limits"}
    assert inputs["backlog"]["runnable_jobs"] == 3
    assert reasons(projection) == []


def test_a_deletion_request_is_sticky_until_the_batch_job_ends() -> None:
    batch = uuid.uuid4()
    request = BatchRequestData(num_nodes=1, wall_time_min=5)
    events = [
        ev(BatchJobRequested, request, actor=f"user:{OWNER}", aggregate=batch),
        ev(BatchJobDeletionRequested, BatchReasonData(reason="rm"), actor=f"user:{OWNER}",
           aggregate=batch),
        ev(BatchJobSubmitted, BatchSubmittedData(scheduler_id="7"), aggregate=batch),
        ev(BatchJobRunning, BatchReasonData(), aggregate=batch),
        ev(BatchJobFinished, BatchFinishedData(state="cancelled"), aggregate=batch),
    ]  # fmt: skip
    projection = fresh()
    fold(projection, events)
    assert [p["state"] for _, p in ops(projection)[1:]] == [
        "deletion_requested", "deletion_requested", "deletion_requested", "finished",
    ]  # fmt: skip
    assert reasons(projection) == []


@pytest.mark.parametrize(
    ("aggregate", "owned", "reason"),
    [
        (uuid.uuid4(), True, "is not on site 'alpha''s scaler"),
        (scaler_id(SITE), False, "for unregistered site 'alpha'"),
    ],
)
def test_a_scaler_event_off_the_sites_scaler_is_quarantined(
    aggregate: uuid.UUID, *, owned: bool, reason: str
) -> None:
    decided = ScalerDecidedData(limits=ScalerLimits(), reason="no backlog")
    projection = fresh(owned=owned)
    fold(projection, [ev(ScalerDecided, decided, aggregate=aggregate)])
    assert ops(projection) == []
    assert reasons(projection) == [f"illegal: scaler.decided {reason}"]


@pytest.mark.parametrize(
    ("history", "refused"),
    [
        ((), BatchJobSubmitted),  # nothing was requested
        ((BatchJobSubmitted, BatchJobFinished), BatchJobSubmitFailed),  # it had ended
        ((BatchJobSubmitted, BatchJobFinished), BatchJobRunning),
        ((), BatchJobRequested),  # asked twice for one id
    ],
)
def test_a_batch_event_out_of_the_lifecycle_is_quarantined(
    history: tuple[type[Event], ...], refused: type[Event]
) -> None:
    batch = uuid.uuid4()
    request = BatchRequestData(num_nodes=1, wall_time_min=5)
    data: dict[type[Event], BaseModel] = {
        BatchJobRequested: request,
        BatchJobSubmitted: BatchSubmittedData(scheduler_id="7"),
        BatchJobFinished: BatchFinishedData(),
        BatchJobSubmitFailed: BatchReasonData(reason="no"),
        BatchJobRunning: BatchReasonData(),
    }
    events = [ev(BatchJobRequested, request, actor=f"user:{OWNER}", aggregate=batch)]
    if refused is BatchJobSubmitted:
        events = []
    events += [ev(cls, data[cls], aggregate=batch) for cls in history]
    actor = f"user:{OWNER}" if refused is BatchJobRequested else SITE_ACTOR
    events.append(ev(refused, data[refused], actor=actor, aggregate=batch))
    projection = fresh()
    fold(projection, events)
    [reason] = reasons(projection)
    assert reason.startswith(f"illegal: {refused.event_type} is not allowed")  # type: ignore[attr-defined]


def test_only_the_site_owner_may_ask_for_a_pilot() -> None:
    request = BatchRequestData(num_nodes=1, wall_time_min=5)
    projection = fresh()
    fold(projection, [ev(BatchJobRequested, request, actor="user:mallory")])
    assert reasons(projection) == ["illegal: batch.requested by user:mallory, not the site owner"]
    projection = fresh()
    fold(projection, [ev(BatchJobRequested, request, actor=SITE_ACTOR)])  # its elastic queue
    assert reasons(projection) == []


def test_session_events_open_and_end_a_session() -> None:
    launcher = f"launcher:{SESSION}"
    opened = SessionOpenedData(
        hostname="nid1",
        nodes=(NodeInfo(hostname="nid1", cores=4),),
        deadline=AT + timedelta(hours=1),
        heartbeat_ttl_s=10,
    )
    projection = fresh()
    fold(
        projection,
        [
            ev(SessionOpened, opened, actor=launcher, aggregate=SESSION),
            ev(SessionClosed, SessionClosedData(reason="idle"), actor=launcher, aggregate=SESSION),
            ev(SessionExpired, SessionExpiredData(), actor="controller:main", aggregate=SESSION),
        ],
    )
    (statement, params), *ended = ops(projection)
    assert (statement, params["hostname"], params["heartbeat_ttl_s"]) == (
        "session_opened",
        "nid1",
        10,
    )
    assert json.loads(params["nodes"]) == [{"hostname": "nid1", "cores": 4, "gpus": 0}]
    assert [(s, p["state"], p["reason"]) for s, p in ended] == [
        ("session_ended", "closed", "idle"),
        ("session_ended", "expired", "heartbeat expired"),
    ]


def _requested(job: uuid.UUID) -> TransferRequestedData:
    return TransferRequestedData(
        job_id=job, slot="inputs", direction="in", local_path="w/in",
        remote=TransferSpec(location="beamline", path="/d"), step_id=uuid.uuid4(),
    )  # fmt: skip


def test_transfer_events_are_state_changes_of_one_item() -> None:
    xfer, job = uuid.uuid4(), uuid.uuid4()
    requested = _requested(job)
    projection = fresh()
    fold(
        projection,
        [
            ev(TransferRequested, requested, actor="controller:main", aggregate=xfer),
            ev(TransferSubmitted, TransferSubmittedData(task_id="t1"), aggregate=xfer),
            ev(TransferSubmitted, TransferSubmittedData(task_id="t2", attempt=2), aggregate=xfer),
            ev(
                TransferSucceeded,
                TransferDoneData(bytes_transferred=42, duration_s=1.5, attempts=2),
                aggregate=xfer,
            ),
        ],
    )
    assert reasons(projection) == []
    (statement, params), *states = ops(projection)
    assert (statement, params["job_id"], params["direction"]) == ("xfer_requested", job, "in")
    assert params["step_id"] == requested.step_id
    assert [(p["state"], p["task_id"], p["attempts"], p["bytes_transferred"])
            for _, p in states] == [
        ("submitted", "t1", 1, None),
        ("submitted", "t2", 2, None),
        ("succeeded", None, 2, 42),
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("history", "refused"),
    [
        ((TransferFailed,), TransferSucceeded),  # failed is final
        ((TransferSubmitted, TransferSucceeded), TransferFailed),  # succeeded is final
        ((TransferSubmitted, TransferSucceeded), TransferSubmitted),
        ((), TransferRequested),  # requested twice
    ],
)
def test_a_transfer_event_out_of_the_item_lifecycle_is_quarantined(
    history: tuple[type[Event], ...], refused: type[Event]
) -> None:
    xfer = uuid.uuid4()
    data: dict[type[Event], BaseModel] = {
        TransferRequested: _requested(uuid.uuid4()),
        TransferSubmitted: TransferSubmittedData(task_id="t"),
        TransferSucceeded: TransferDoneData(),
        TransferFailed: TransferFailedData(reason="no such file", permanent=True),
    }
    events = [ev(TransferRequested, data[TransferRequested], actor="controller:main",
                 aggregate=xfer)]  # fmt: skip
    events += [ev(cls, data[cls], aggregate=xfer) for cls in history]
    actor = "controller:main" if refused is TransferRequested else SITE_ACTOR
    events.append(ev(refused, data[refused], actor=actor, aggregate=xfer))
    projection = fresh()
    fold(projection, events)
    [reason] = reasons(projection)
    assert reason.startswith(f"illegal: {refused.event_type} is not allowed")  # type: ignore[attr-defined]


def test_a_sites_transfer_locations_are_its_own_to_declare() -> None:
    locations = SiteLocationsData(locations={"beamline": "rsync:/data"})
    projection = fresh()
    fold(projection, [ev(SiteLocationsSet, locations, aggregate=derived_id("site", SITE))])
    [(statement, params)] = ops(projection)
    assert statement == "site_locations"
    assert json.loads(params["locations"]) == {"beamline": "rsync:/data"}
    projection = fresh()
    fold(projection, [ev(SiteLocationsSet, locations, actor="controller:main",
                         aggregate=derived_id("site", SITE))])  # fmt: skip
    assert reasons(projection) == [f"illegal: site.locations_set must come from site:{SITE}"]
    projection = fresh()
    fold(projection, [ev(SiteLocationsSet, locations, aggregate=uuid.uuid4())])
    assert reasons(projection) == ["illegal: site.locations_set is not on the site's aggregate"]


def test_heartbeats_and_their_expiry_markers_update_sessions() -> None:
    beat = Heartbeat(session_id=SESSION, site=SITE, at=AT)
    projection = fresh()
    projection.fold(RawMessage(HB_STREAM, 1, "hb", b""), HeartbeatMessage(1, SITE, SESSION, beat))
    projection.fold(RawMessage(HB_STREAM, 2, "hb", b""), ExpiryMarker(2, SITE, SESSION))
    (beat_op, beat_params), (expired, expired_params) = ops(projection)
    assert (beat_op, beat_params["id"], beat_params["at"]) == ("heartbeat", SESSION, AT)
    assert beat_params["heartbeat"] == beat.model_dump_json()
    assert (expired, expired_params) == ("session_expired", {"id": SESSION, "site": SITE})
