"""Event envelope, codec, upcasting, resource validation, subjects and ids."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from itertools import pairwise, product
from pathlib import PurePosixPath
from typing import Any

import orjson
import pytest
from pydantic import BaseModel, ValidationError

from lodestream.schemas.codec import CURRENT_VERSION, EVENT_CLASSES, decode, encode, to_document
from lodestream.schemas.envelope import Event
from lodestream.schemas.errors import DecodeError, SubjectError
from lodestream.schemas.events.app import AppLoadFailedData, AppRemovedData
from lodestream.schemas.events.batch import (
    BatchFinishedData,
    BatchReasonData,
    BatchRequestData,
    BatchSubmittedData,
)
from lodestream.schemas.events.job import (
    FailureData,
    FinishedData,
    JobFinished,
    JobKilled,
    JobRestartReady,
    LeaseData,
    ParentsData,
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
from lodestream.schemas.ids import derived_id, uuid7, uuid7s
from lodestream.schemas.resources import (
    MAX_PARENTS,
    WORKDIR_PATTERN,
    App,
    BatchJob,
    JobSpec,
    NodeInfo,
    Session,
    Site,
    TransferSpec,
)
from lodestream.schemas.states import FINISHED_AT_RUN_END
from lodestream.schemas.subjects import (
    aggregate_filter,
    check_site,
    event_subject,
    heartbeat_subject,
    parse_event_subject,
)
from lodestream.schemas.upcast import Document, unregister, upcaster

SITE = "alpha"
AGGREGATE = uuid.UUID("01900000-0000-7000-8000-000000000001")
SESSION_ID = uuid.UUID("01900000-0000-7000-8000-0000000000a1")
AT = datetime(2025, 1, 2, 3, 4, 5, 678_000, tzinfo=UTC)
NAIVE = datetime(2025, 1, 2, 3, 4, 5)  # noqa: DTZ001 - the point of the tests that use it
NKEY_USER = "UCHDHJ54QTK6PP5KIZ3IV3UVX5N446PLTFMIPABEPL3NO6LYBLGLJZ2F"  # a valid key (checksum)

SPEC = JobSpec(site=SITE, app="demo", workdir="demo/1")
APP = App(site=SITE, name="demo")
NODE = NodeInfo(hostname="nid0001", cores=64, gpus=4)

# Valid minimal payload of every event type; a test checks the keys against EVENT_CLASSES.
SAMPLE_DATA: dict[str, BaseModel] = {
    "job.created": SPEC.model_copy(update={"parent_ids": (uuid7(),), "tags": {"run": "7"}}),
    "job.awaiting_parents": ParentsData(parent_ids=(uuid7(),)),
    "job.ready": StepData(),
    "job.staged_in": StepData(skipped=("job.ready",)),
    "job.preprocessed": StepData(skipped=("job.ready", "job.staged_in")),
    "job.leased": LeaseData(session_id=SESSION_ID),
    "job.lease_released": LeaseData(session_id=SESSION_ID, reason="draining"),
    "job.lease_expired": LeaseData(session_id=SESSION_ID, reason="heartbeat lost"),
    "job.placement_refused": LeaseData(
        session_id=SESSION_ID, reason="needs 2 nodes; this pilot has 1"
    ),
    "job.started": StartedData(
        session_id=SESSION_ID, placement=(Placement(hostname="nid0001", cores=(0, 1)),), pid=42
    ),
    "job.run_done": RunResultData(return_code=0, runtime_s=1.5, result={"energy": -1.0}),
    "job.run_errored": RunResultData(return_code=1, stderr_tail="boom", cause=("task",)),
    "job.run_timed_out": RunResultData(cause=("task", "session")),
    "job.postprocessed": StepData(),
    "job.restart_ready": RetryData(attempt=2, reason="retry"),
    "job.staged_out": StepData(),
    "job.finished": FinishedData(
        skipped=FINISHED_AT_RUN_END, run=RunResultData(return_code=0, result={"x": [1, 2]})
    ),
    "job.failed": FailureData(reason="parent failed", parent_id=uuid7()),
    "job.killed": ReasonData(reason="user"),
    "job.reset": ReasonData(),
    "batch.requested": BatchRequestData(num_nodes=2, wall_time_min=30),
    "batch.submitted": BatchSubmittedData(scheduler_id="12345"),
    "batch.queued": BatchReasonData(),
    "batch.running": BatchReasonData(),
    "batch.finished": BatchFinishedData(exit_code=0, state="COMPLETED"),
    "batch.submit_failed": BatchReasonData(reason="sbatch: invalid account"),
    "batch.deletion_requested": BatchReasonData(reason="idle"),
    "session.opened": SessionOpenedData(
        hostname="nid0001", nodes=(NODE,), deadline=AT + timedelta(hours=1), heartbeat_ttl_s=30
    ),
    "session.closed": SessionClosedData(reason="idle"),
    "session.expired": SessionExpiredData(leases_expired=2, runs_timed_out=1),
    "xfer.requested": TransferRequestedData(
        job_id=AGGREGATE,
        slot="input",
        direction="in",
        remote=TransferSpec(location="globus:endpoint", path="/data/in.h5"),
        local_path="in.h5",
    ),
    "xfer.submitted": TransferSubmittedData(task_id="task-1"),
    "xfer.succeeded": TransferDoneData(bytes_transferred=1024),
    "xfer.failed": TransferFailedData(reason="permission denied"),
    "app.registered": APP,
    "app.updated": APP.model_copy(update={"description": "v2"}),
    "app.removed": AppRemovedData(name="demo"),
    "app.load_failed": AppLoadFailedData(
        source="sim.py", line=7, message="RuntimeError: half-edited", apps=("demo",)
    ),
    "site.registered": SiteRegisteredData(name=SITE, owner="alice", public_key=NKEY_USER),
    "site.key_bound": SiteKeyData(public_key=NKEY_USER),
    "site.removed": SiteRemovedData(),
    "site.locations_set": SiteLocationsData(locations={"beamline": "rsync://ada@127.0.0.1/d"}),
    "scaler.backlog": ScalerBacklogData(
        as_of_seq=42,
        runnable_jobs=3,
        node_footprint=1.5,
        max_wall_time_min=20,
        batch_jobs=(
            ScalerBatchJob(
                id=uuid7(),
                state="queued",
                num_nodes=2,
                wall_time_min=30,
                requested_at=AT,
                elastic=True,
            ),
        ),
    ),
    "scaler.decided": ScalerDecidedData(
        backlog_id=uuid7(),
        backlog=ScalerBacklogData(as_of_seq=42, runnable_jobs=3, node_footprint=1.5),
        windows=(WindowData(queue="debug", nodes=4, minutes=40),),
        limits=ScalerLimits(queue="debug", max_nodes=4, use_backfill=True),
        requests=(
            ScalerRequest(
                batch_job_id=uuid7(),
                request=BatchRequestData(num_nodes=2, wall_time_min=35, queue="debug"),
                window=WindowData(queue="debug", nodes=4, minutes=40),
            ),
        ),
        deletions=(ScalerDeletion(batch_job_id=uuid7(), reason="waited too long"),),
        reason="2 node(s) short",
    ),
}
EVENT_TYPES = sorted(EVENT_CLASSES)


def sample_event(event_type: str, **overrides: Any) -> Event:
    fields: dict[str, Any] = {
        "site": SITE,
        "aggregate_id": AGGREGATE,
        "actor": "controller:test",
        "data": SAMPLE_DATA[event_type],
        "occurred_at": AT,
        "causation_id": uuid7(),
        "correlation_id": uuid7(),
        **overrides,
    }
    return EVENT_CLASSES[event_type].create(**fields)


def sample_document(event_type: str = "job.failed", **changes: Any) -> Document:
    document = to_document(sample_event(event_type))
    document.update(changes)
    return document


def test_samples_cover_every_event_class() -> None:
    assert set(SAMPLE_DATA) == set(EVENT_CLASSES) == set(CURRENT_VERSION)


# --- envelope ------------------------------------------------------------------------------


@pytest.mark.parametrize("event_type", EVENT_TYPES)
def test_events_are_frozen(event_type: str) -> None:
    event = sample_event(event_type)
    with pytest.raises(ValidationError, match="frozen"):
        event.actor = "user:mallory"  # type: ignore[misc]
    with pytest.raises(ValidationError, match="frozen"):
        setattr(event.data, next(iter(type(event.data).model_fields)), None)


@pytest.mark.parametrize("event_type", EVENT_TYPES)
def test_events_forbid_extra_fields(event_type: str) -> None:
    cls = EVENT_CLASSES[event_type]
    document = to_document(sample_event(event_type))
    with pytest.raises(ValidationError, match=r"extra_forbidden|Extra inputs"):
        cls.model_validate({**document, "priority": 1})
    with pytest.raises(ValidationError, match=r"extra_forbidden|Extra inputs"):
        cls.model_validate({**document, "data": {**document["data"], "priority": 1}})


@pytest.mark.parametrize("event_type", EVENT_TYPES)
def test_event_class_pins_type_version_and_kind(event_type: str) -> None:
    event = sample_event(event_type)
    assert event.type == event_type
    assert event.v == CURRENT_VERSION[event_type]
    assert type(event).kind == event_type.partition(".")[0]
    assert event.id.version == 7


def test_occurred_at_must_be_timezone_aware() -> None:
    with pytest.raises(ValidationError, match="timezone"):
        sample_event("job.killed", occurred_at=NAIVE)
    event = sample_event("job.killed", occurred_at=AT.astimezone(UTC))
    assert event.occurred_at.utcoffset() == timedelta(0)


@pytest.mark.parametrize(
    ("model", "fields", "name"),
    [
        (Heartbeat, {"session_id": SESSION_ID, "site": SITE}, "at"),
        (Session, {"id": SESSION_ID, "site": SITE}, "deadline"),
        (Session, {"id": SESSION_ID, "site": SITE}, "last_heartbeat"),
        (Site, {"name": SITE, "owner": "alice"}, "created_at"),
        (
            SessionOpenedData,
            {"hostname": "h", "nodes": (NODE,), "heartbeat_ttl_s": 30},
            "deadline",
        ),
    ],
)
def test_model_timestamps_must_be_timezone_aware(
    model: type[BaseModel], fields: dict[str, Any], name: str
) -> None:
    with pytest.raises(ValidationError, match="timezone"):
        model.model_validate({**fields, name: NAIVE})
    assert getattr(model.model_validate({**fields, name: AT}), name) == AT


@pytest.mark.parametrize("actor", ["", "controller", "root:x", "user:", "user:a b", "user:a/b"])
def test_actor_must_name_its_kind_and_id(actor: str) -> None:
    with pytest.raises(ValidationError, match="actor"):
        sample_event("job.killed", actor=actor)


# --- codec ---------------------------------------------------------------------------------


@pytest.mark.parametrize("event_type", EVENT_TYPES)
def test_encode_decode_round_trip(event_type: str) -> None:
    event = sample_event(event_type)
    raw = encode(event)
    decoded = decode(raw)
    assert type(decoded) is EVENT_CLASSES[event_type]
    assert decoded == event
    assert encode(decoded) == raw
    assert decode(raw.decode()) == event  # str input too
    assert decoded.subject == event_subject(SITE, event_type, AGGREGATE)


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"{not json", "not JSON"),
        (b"", "not JSON"),
        (b"[1, 2]", "must be a JSON object"),
        (b'"job.created"', "must be a JSON object"),
    ],
)
def test_decode_refuses_malformed_bytes(raw: bytes, message: str) -> None:
    with pytest.raises(DecodeError, match=message):
        decode(raw)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"type": "job.exploded"}, "unknown event type 'job.exploded'"),
        ({"type": None}, "unknown event type None"),
        ({"type": 7}, "unknown event type 7"),
        ({"v": None}, "version must be an integer, got None"),
        ({"v": True}, "version must be an integer, got True"),
        ({"v": "1"}, "version must be an integer, got '1'"),
        ({"v": 1.0}, "version must be an integer, got 1.0"),
        ({"v": 2}, r"job.failed v2 is newer than this code \(v1\)"),
        ({"v": 0}, "no upcaster for job.failed v0"),
        ({"data": {}}, r"invalid event: job\.failed\.data\.reason: Field required"),
        ({"site": "Al.pha"}, r"invalid event: job\.failed\.site: String should match"),
        ({"occurred_at": NAIVE.isoformat()}, r"occurred_at: Input should have timezone"),
        ({"id": "not-a-uuid"}, r"invalid event: job\.failed\.id"),
    ],
)
def test_decode_refuses_bad_documents_with_a_clear_message(
    changes: dict[str, Any], message: str
) -> None:
    with pytest.raises(DecodeError, match=message):
        decode(orjson.dumps(sample_document(**changes)))


@pytest.mark.parametrize("field", ["type", "v"])
def test_decode_refuses_missing_type_or_version(field: str) -> None:
    document = sample_document()
    del document[field]
    with pytest.raises(DecodeError, match=r"unknown event type|version must be an integer"):
        decode(orjson.dumps(document))


# --- upcasting -----------------------------------------------------------------------------


@pytest.fixture
def killed_v0_upcaster() -> Iterator[None]:
    """A pretend v0 of job.killed that called the reason ``why``."""

    @upcaster("job.killed", 0)
    def _rename_why(document: Document) -> Document:
        data = dict(document.get("data", {}))
        if "why" in data:
            data["reason"] = data.pop("why")
        return {**document, "data": data}

    yield
    unregister("job.killed", 0)  # the registry is process-wide: leave it as found


@pytest.mark.usefixtures("killed_v0_upcaster")
def test_old_version_is_upcast_on_read() -> None:
    old = sample_document("job.killed", v=0, data={"why": "user asked"})
    event = decode(orjson.dumps(old))
    assert isinstance(event, JobKilled)
    assert event.v == CURRENT_VERSION["job.killed"] == 1
    assert event.data.reason == "user asked"
    assert old["data"] == {"why": "user asked"}  # the stored document is never rewritten


@pytest.mark.usefixtures("killed_v0_upcaster")
def test_upcaster_cannot_be_registered_twice() -> None:
    with pytest.raises(ValueError, match="already registered"):
        upcaster("job.killed", 0)(lambda document: document)


def test_job_finished_v1_on_the_log_still_reads() -> None:
    # v1 (before the pilot could finish a job) had no data.run; events on the log stay as written.
    v1 = sample_document(
        "job.finished", v=1, data={"skipped": ["job.postprocessed", "job.staged_out"], "note": ""}
    )
    event = decode(orjson.dumps(v1))
    assert isinstance(event, JobFinished)
    assert event.v == CURRENT_VERSION["job.finished"] == 2
    assert event.data.skipped == ("job.postprocessed", "job.staged_out")
    assert event.data.run is None


def test_job_restart_ready_v1_on_the_log_reads_as_due_at_once() -> None:
    # v1 (before retries backed off) had no wait: the retry was due when it was appended.
    v1 = sample_document("job.restart_ready", v=1, data={"attempt": 2, "reason": "retry"})
    event = decode(orjson.dumps(v1))
    assert isinstance(event, JobRestartReady)
    assert event.v == CURRENT_VERSION["job.restart_ready"] == 2
    assert (event.data.attempt, event.data.backoff_s, event.data.retry_at) == (2, 0.0, None)
    assert event.data.max_attempts is None


def test_without_upcaster_old_version_is_refused() -> None:
    old = sample_document("job.killed", v=0, data={"why": "user asked"})
    with pytest.raises(DecodeError, match=r"no upcaster for job.killed v0"):
        decode(orjson.dumps(old))


# --- resources -----------------------------------------------------------------------------


@pytest.mark.parametrize("workdir", ["demo", "demo/1", "a.b/c-d_e", "./x", "x/y/z/"])
def test_workdir_accepts_relative_paths(workdir: str) -> None:
    assert JobSpec(site=SITE, app="demo", workdir=workdir).workdir == workdir


@pytest.mark.parametrize(
    "workdir",
    [
        *("", "/abs", "/", "..", "../x", "a/../../b", "a/..", "x" * 1025),
        *(".", "./", "./.", ".//.", "//"),  # data/ itself
        *("a\x00b", "a\nb", "a\rb", "a\tb", "a\x1bb", "a\x7fb", "a\x85b"),  # control characters
    ],
)
def test_workdir_refuses_absolute_escaping_or_bad_paths(workdir: str) -> None:
    with pytest.raises(ValidationError, match="workdir"):
        JobSpec(site=SITE, app="demo", workdir=workdir)


def test_workdir_rule_is_a_pattern_json_schema_shows() -> None:
    # Checked in Rust on every decode; no Python validator runs for it.
    properties = JobSpec.model_json_schema()["properties"]
    assert properties["workdir"]["pattern"] == WORKDIR_PATTERN
    with pytest.raises(ValidationError, match=r"workdir\n  String should match pattern"):
        JobSpec(site=SITE, app="demo", workdir="./")


STORABLE_BASE: dict[str, Any] = {"site": SITE, "app": "demo", "workdir": "w"}


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("workdir", "a\x00b"),
        ("parameters", {"steps": "1\x00"}),
        ("parameters", {"st\x00eps": "1"}),
        ("tags", {"run": "a\x00"}),
        ("launch_params", {"cpu-bind": "\x00"}),
        ("launch_params", {"\x00": "x"}),
        ("data", {"k\x00": 1}),
        ("data", {"k": "v\x00"}),
        ("data", {"k": [1, {"deep": ["ok", "n\x00t ok"]}]}),
        ("data", {"k": {"de\x00ep": 1}}),
        ("transfers", {"input": {"location": "g\x00", "path": "p"}}),
        ("transfers", {"input": {"location": "g", "path": "p\x00"}}),
    ],
)
def test_no_string_of_a_job_may_hold_nul(field: str, value: Any) -> None:
    """Postgres text and jsonb refuse NUL: a job carrying one could never be projected."""
    with pytest.raises(ValidationError, match=field):
        JobSpec.model_validate({**STORABLE_BASE, field: value})
    raw = orjson.dumps({**STORABLE_BASE, field: value})
    assert b"\\u0000" in raw
    with pytest.raises(ValidationError, match=field):
        JobSpec.model_validate_json(raw)


def test_a_nul_deep_in_data_is_named_by_its_path() -> None:
    with pytest.raises(ValidationError) as caught:
        JobSpec.model_validate({**STORABLE_BASE, "data": {"k": [1, {"deep": ["ok", "\x00"]}]}})
    assert "data['k'][1]['deep'][1] contains NUL (\\u0000)" in str(caught.value)


@pytest.mark.parametrize("number", [-(2**63), 2**63 - 1, 0, 1.5, -1e300, True, None])
def test_data_keeps_numbers_the_codec_reads_back_as_they_were(number: Any) -> None:
    spec = JobSpec.model_validate({**STORABLE_BASE, "data": {"x": [{"y": number}]}})
    assert orjson.loads(spec.model_dump_json())["data"] == {"x": [{"y": number}]}


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"9223372036854775808", "outside"),
        (b"-9223372036854775809", "outside"),
        (b"123456789012345678901234567890", "outside"),
        (b"NaN", "not a finite number"),
        (b"Infinity", "not a finite number"),
        (b"-Infinity", "not a finite number"),
        (b"1e400", "not a finite number"),
    ],
)
def test_data_refuses_numbers_json_or_the_codec_cannot_keep(raw: bytes, message: str) -> None:
    document = b'{"site": "alpha", "app": "demo", "workdir": "w", "data": {"x": [%s]}}' % raw
    with pytest.raises(ValidationError, match=rf"data\['x'\]\[0\] .*{message}"):
        JobSpec.model_validate_json(document)


@pytest.mark.parametrize(
    ("model", "fields", "field"),
    [
        (App, {"site": SITE, "name": "demo", "description": "\x00"}, "description"),
        (App, {"site": SITE, "name": "demo", "parameters": {"p\x00": {}}}, "parameters"),
        (App, {"site": SITE, "name": "demo", "parameters": {"p": {"help": "\x00"}}}, "help"),
        (NodeInfo, {"hostname": "nid\x00", "cores": 1}, "hostname"),
        (NodeInfo, {"hostname": "nid", "cores": 2**31}, "cores"),
        (NodeInfo, {"hostname": "nid", "cores": 1, "gpus": 2**31}, "gpus"),
        (
            BatchJob,
            {"id": AGGREGATE, "site": SITE, "num_nodes": 2**31, "wall_time_min": 1},
            "num_nodes",
        ),
        (
            BatchJob,
            {"id": AGGREGATE, "site": SITE, "num_nodes": 1, "wall_time_min": 2**31},
            "wall_time",
        ),
        (
            BatchJob,
            {"id": AGGREGATE, "site": SITE, "num_nodes": 1, "wall_time_min": 1, "queue": "\x00"},
            "queue",
        ),
    ],
)
def test_resource_models_refuse_what_postgres_cannot_store(
    model: type[BaseModel], fields: dict[str, Any], field: str
) -> None:
    with pytest.raises(ValidationError, match=field):
        model.model_validate(fields)


def test_duplicate_parent_ids_are_refused() -> None:
    parent = uuid7()
    with pytest.raises(ValidationError, match="parent_ids contains duplicates"):
        JobSpec(site=SITE, app="demo", workdir="w", parent_ids=(parent, uuid7(), parent))


def test_parent_count_is_bounded() -> None:
    parents = tuple(uuid7() for _ in range(MAX_PARENTS + 1))
    with pytest.raises(ValidationError, match="parent_ids"):
        JobSpec(site=SITE, app="demo", workdir="w", parent_ids=parents)
    assert len(JobSpec(site=SITE, app="demo", workdir="w", parent_ids=parents[:-1]).parent_ids) == (
        MAX_PARENTS
    )


@pytest.mark.parametrize(
    ("field", "lowest", "highest"),
    [
        ("num_nodes", 1, 100_000),
        ("ranks_per_node", 1, 4096),
        ("threads_per_rank", 1, 4096),
        ("threads_per_core", 1, 8),
        ("gpus_per_rank", 0, 64),
        ("node_packing_count", 1, 4096),
        ("wall_time_min", 0, 60 * 24 * 30),
    ],
)
def test_resource_bounds(field: str, lowest: int, highest: int) -> None:
    base = {"site": SITE, "app": "demo", "workdir": "w"}
    for ok in (lowest, highest):
        assert getattr(JobSpec.model_validate({**base, field: ok}), field) == ok
    for bad in (lowest - 1, highest + 1):
        with pytest.raises(ValidationError, match=field):
            JobSpec.model_validate({**base, field: bad})


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("app", "1demo"),
        ("app", "rm -rf /"),
        ("site", "Alpha"),
        ("tags", {"bad key": "v"}),
        ("transfers", {"in put": {"location": "l", "path": "p"}}),
        ("unknown", 1),
    ],
)
def test_job_spec_refuses_bad_fields(field: str, value: Any) -> None:
    with pytest.raises(ValidationError):
        JobSpec.model_validate({"site": SITE, "app": "demo", "workdir": "w", field: value})


# --- site slugs and subjects ---------------------------------------------------------------


@pytest.mark.parametrize("site", ["a", "alpha", "theta-gpu", "a1", "0", "x" * 40])
def test_valid_site_slugs(site: str) -> None:
    assert check_site(site) == site
    assert Site(name=site, owner="alice", created_at=AT).name == site


@pytest.mark.parametrize(
    "site", ["", "Alpha", "-a", "a-", "a.b", "a*", "a>", "a b", "a_b", "x" * 41, "ä"]
)
def test_invalid_site_slugs(site: str) -> None:
    with pytest.raises(SubjectError, match="invalid site name"):
        check_site(site)
    with pytest.raises(ValidationError, match="site"):
        sample_event("job.killed", site=site)
    with pytest.raises(ValidationError, match="site"):  # it becomes a token of hb.<site>.<id>
        Heartbeat(session_id=SESSION_ID, site=site, at=AT)


def test_subject_helpers() -> None:
    event = sample_event("job.lease_expired")
    expected = f"evt.alpha.job.{AGGREGATE}.lease_expired"
    assert event_subject(SITE, "job.lease_expired", AGGREGATE) == expected
    assert event.subject == expected
    assert aggregate_filter(SITE, "job", AGGREGATE) == f"evt.alpha.job.{AGGREGATE}.*"
    assert event.aggregate_subjects == f"evt.alpha.job.{AGGREGATE}.*"
    assert heartbeat_subject(SITE, SESSION_ID) == f"hb.alpha.{SESSION_ID}"


@pytest.mark.parametrize("event_type", EVENT_TYPES)
def test_parse_event_subject_inverts_event_subject(event_type: str) -> None:
    parsed = parse_event_subject(event_subject(SITE, event_type, AGGREGATE))
    assert (parsed.site, parsed.aggregate_id, parsed.event_type) == (
        SITE,
        str(AGGREGATE),
        event_type,
    )


@pytest.mark.parametrize(
    "subject",
    [
        "",
        "hb.alpha.x",
        "evt.alpha.job.x",
        "evt.alpha.job.x.created.more",
        "event.alpha.job.x.created",
        "evt.alpha.widget.x.created",
        "evt.Alpha.job.x.created",
        "evt.alpha.job..created",
        "evt.alpha.job.x.",
        "evt.alpha.job.*.created",
        "evt.alpha.job.x.>",
        "evt.*.job.x.created",
    ],
)
def test_parse_event_subject_refuses_bad_subjects(subject: str) -> None:
    with pytest.raises(SubjectError):
        parse_event_subject(subject)


# --- ids -----------------------------------------------------------------------------------


def test_uuid7_layout_and_clock() -> None:
    before_ms = int(datetime.now(UTC).timestamp() * 1000)
    value = uuid7()
    after_ms = int(datetime.now(UTC).timestamp() * 1000)
    assert value.version == 7
    assert value.variant == uuid.RFC_4122
    assert before_ms - 1 <= value.int >> 80 <= after_ms + 1


def test_uuid7_is_strictly_monotonic() -> None:
    ids = [uuid7() for _ in range(10_000)]
    assert all(a < b for a, b in pairwise(ids))
    assert all(a.bytes < b.bytes for a, b in pairwise(ids))  # byte order too (B-tree keys)


def test_uuid7s_are_uuid7s_minted_in_a_row() -> None:
    before_ms = int(datetime.now(UTC).timestamp() * 1000)
    ids = [uuid7(), *uuid7s(10_000), uuid7(), *uuid7s(1), *uuid7s(0)]
    after_ms = int(datetime.now(UTC).timestamp() * 1000)
    assert len(ids) == 10_003
    assert all(a.bytes < b.bytes for a, b in pairwise(ids))  # strictly, across both
    assert {(i.version, i.variant) for i in ids} == {(7, uuid.RFC_4122)}
    assert all(before_ms - 1 <= i.int >> 80 <= after_ms + 1 for i in ids)
    assert len({i.int & 0x3FFF_FFFF_FFFF_FFFF for i in ids}) == len(ids)  # rand_b: random


def test_derived_id_is_stable() -> None:
    cause = "01900000-0000-7000-8000-000000000001"
    first = derived_id(cause, "job.ready")
    assert first == derived_id(cause, "job.ready")
    # pinned: a changed namespace or joining rule would re-mint every idempotency key
    assert first == uuid.UUID("5de6f7d2-6322-5a41-9996-77f07b7e883b")
    assert first.version == 5
    assert derived_id(cause, "job.failed") != first
    assert derived_id("job.ready", cause) != first


def test_workdir_check_agrees_with_posix_path_semantics() -> None:
    """The string test of JobSpec.workdir refuses exactly what PurePosixPath calls escaping
    or empty."""
    parts = ["", "a", ".", "..", "...", "..a", "a..", ".a", "/", "//", "b c", "é"]
    for combo in product(parts, repeat=4):
        value = "/".join(combo)
        if not value:
            continue
        path = PurePosixPath(value)
        # ... or names the site's data/ directory itself ('.', './.', '//' is absolute)
        escapes = path.is_absolute() or ".." in path.parts or not path.parts
        try:
            JobSpec(site=SITE, app="demo", workdir=value)
        except ValueError:
            assert escapes, value
        else:
            assert not escapes, value
