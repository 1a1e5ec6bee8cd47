"""The API's submission planning (``services/api/submit.py``), without HTTP, NATS or Postgres.

The route loads a :class:`Catalog` from the read models and appends what
:func:`build_events` plans; everything between (ids, checks, the events, what a retry
already created) is decided here from plain values. The route itself is tested through
a real stack in ``tests/integration/test_api_jobs.py``.
"""

from __future__ import annotations

import uuid
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import SecretStr

from lodestream.schemas.codec import encode
from lodestream.schemas.fold import apply
from lodestream.schemas.ids import uuid7
from lodestream.schemas.resources import TransferSpec
from lodestream.services.api import submit
from lodestream.services.api.errors import MAX_DETAILS, Conflict, InvalidInput, NotFound
from lodestream.services.api.models import JobSubmission, SubmitRequest
from lodestream.services.api.submit import AppInterface, Catalog, Existing
from lodestream.settings import ApiSettings, NatsSettings, Settings

USER = "ada"
SECRET = b"control-plane-secret"
NOW = datetime(2025, 1, 2, tzinfo=UTC)
KNOWN_PARENT = uuid.UUID("01900000-0000-7000-8000-0000000000f1")
INTERFACE = AppInterface.from_row(
    {
        "n": {"required": True},
        "label": {"required": True, "default": "x"},
        "verbose": {"required": False},
    },
    {"inputs": {"direction": "in", "required": True}, "outputs": {"direction": "out"}},
)
CATALOG = Catalog(
    sites=frozenset({"alpha", "beta"}),
    apps={"alpha": {"sim": INTERFACE}},  # beta's apps are not known: nothing to check there
    own_jobs=frozenset({KNOWN_PARENT}),
    locations={"alpha": frozenset({"beamline"}), "beta": frozenset({"beamline"})},
)
REMOTE = TransferSpec(location="beamline", path="/d")


def job(**fields: Any) -> JobSubmission:
    base: dict[str, Any] = {
        "site": "alpha",
        "app": "sim",
        "workdir": "w",
        "parameters": {"n": "1"},
        "transfers": {"inputs": REMOTE},
    }
    return JobSubmission.model_validate(base | fields)


def request(*jobs: JobSubmission, key: str | None = None) -> SubmitRequest:
    return SubmitRequest(jobs=list(jobs), idempotency_key=key)


def problems(exc: pytest.ExceptionInfo[InvalidInput]) -> list[tuple[list[Any], str]]:
    return [(d["loc"], d["msg"]) for d in exc.value.details]


# --- ids ----------------------------------------------------------------------------------


def test_an_app_interface_knows_what_a_submission_must_give() -> None:
    assert (
        AppInterface(
            parameters=frozenset({"n", "label", "verbose"}),
            required_parameters=frozenset({"n"}),  # label has a default, verbose is optional
            slots=frozenset({"inputs", "outputs"}),
            required_slots=frozenset({"inputs"}),
            types={"n": "str", "label": "str", "verbose": "str"},  # a shell app's default
        )
        == INTERFACE
    )


def test_a_clients_own_job_id_is_kept() -> None:
    own = uuid.uuid4()
    assert submit.job_ids(request(job(id=own)), USER, SECRET) == [own]
    assert submit.job_ids(request(job(id=own), key="k"), USER, SECRET) == [own]


def test_keyed_ids_are_the_same_on_a_retry_and_differ_by_user_key_position_and_secret() -> None:
    req = request(job(), job(), key="batch-7")
    ids = submit.job_ids(req, USER, SECRET)
    assert ids == submit.job_ids(req, USER, SECRET)
    assert ids[0] != ids[1]
    others = [
        submit.job_ids(req, "bob", SECRET),
        submit.job_ids(request(job(), job(), key="batch-8"), USER, SECRET),
        submit.job_ids(req, USER, b"another-secret"),
    ]
    assert all(set(ids).isdisjoint(other) for other in others)


def test_unkeyed_ids_are_fresh_uuid7s() -> None:
    req = request(job(), job())
    first, again = submit.job_ids(req, USER, SECRET), submit.job_ids(req, USER, SECRET)
    assert len({*first, *again}) == 4
    assert all(i.version == 7 for i in first)


def test_a_clients_ids_are_kept_among_fresh_ones() -> None:
    own = uuid.uuid4()
    ids = submit.job_ids(request(job(), job(id=own), job()), USER, SECRET)
    assert ids[1] == own
    assert ids[0] < ids[2]
    assert (ids[0].version, ids[2].version) == (7, 7)


@pytest.mark.parametrize(
    ("req", "needed"),
    [
        (request(job()), False),
        (request(job(), key="k"), True),
        (request(job(), job(id=uuid.uuid4())), True),
    ],
)
def test_only_ids_that_may_exist_are_looked_up(req: SubmitRequest, *, needed: bool) -> None:
    assert submit.needs_existence_check(req) is needed


def test_event_ids_are_keyed_like_job_ids() -> None:
    job_id = uuid.uuid4()
    assert submit.event_id(job_id, "k", SECRET) == submit.event_id(job_id, "k", SECRET)
    assert submit.event_id(job_id, "k", SECRET) != submit.event_id(uuid.uuid4(), "k", SECRET)
    assert submit.event_id(job_id, None, SECRET) != submit.event_id(job_id, None, SECRET)
    ids = [job_id, uuid.uuid4()]
    assert submit.event_ids(ids, "k", SECRET) == [submit.event_id(i, "k", SECRET) for i in ids]
    fresh = submit.event_ids(ids, None, SECRET)
    assert fresh[0] < fresh[1]
    assert {i.version for i in fresh} == {7}


@pytest.mark.parametrize(
    ("id_secret", "password", "expected"),
    [("s", "p", b"s"), (None, "p", b"p"), (None, None, b"")],
)
def test_ids_are_keyed_with_the_id_secret_else_the_nats_password(
    id_secret: str | None, password: str | None, expected: bytes
) -> None:
    settings = Settings(
        api=ApiSettings(id_secret=SecretStr(id_secret) if id_secret else None),
        nats=NatsSettings(password=SecretStr(password) if password else None),
    )
    assert submit.id_secret(settings) == expected


def test_the_catalog_is_asked_about_named_sites_and_outside_parents_only() -> None:
    first, outside = uuid.uuid4(), uuid.uuid4()
    req = request(job(id=first), job(site="beta", parent_ids=(first, outside)))
    ids = submit.job_ids(req, USER, SECRET)
    assert submit.named_sites(req) == {"alpha", "beta"}
    assert submit.outside_parents(req, ids) == {outside}


# --- checks -------------------------------------------------------------------------------


def check(req: SubmitRequest, catalog: Catalog = CATALOG) -> None:
    submit.check(req, submit.job_ids(req, USER, SECRET), catalog)


def test_a_valid_submission_passes() -> None:
    first = uuid.uuid4()
    check(
        request(
            job(id=first), job(parent_ids=(first, KNOWN_PARENT)), job(site="beta", app="anything")
        )
    )


def test_an_unknown_site_is_not_found_before_anything_else() -> None:
    with pytest.raises(NotFound, match="site 'gamma' not found"):
        check(request(job(app="nope"), job(site="gamma")))


def test_every_problem_of_a_job_is_named_where_it_is() -> None:
    bad = job(parameters={"typo": "1"}, transfers={"elsewhere": REMOTE})
    with pytest.raises(InvalidInput) as exc:
        check(request(job(), bad))
    assert problems(exc) == [
        (["body", "jobs", 1, "parameters"], "app 'sim' at 'alpha' has no parameter 'typo'"),
        (["body", "jobs", 1, "parameters"], "app 'sim' requires parameter 'n'"),
        (["body", "jobs", 1, "transfers"], "app 'sim' has no transfer slot 'elsewhere'"),
        (["body", "jobs", 1, "transfers"], "app 'sim' requires transfer slot 'inputs'"),
    ]
    assert str(exc.value).startswith("invalid submission: body.jobs.1.parameters: ")


def test_an_unknown_app_names_the_sites_apps() -> None:
    with pytest.raises(InvalidInput) as exc:
        check(request(job(app="simulate")))
    assert problems(exc) == [
        (["body", "jobs", 0, "app"], "site 'alpha' has no app 'simulate' (apps: sim)")
    ]


def test_a_job_id_used_twice_in_a_request_is_refused() -> None:
    twin = uuid.uuid4()
    with pytest.raises(InvalidInput) as exc:
        check(request(job(id=twin), job(), job(id=twin)))
    assert problems(exc) == [(["body", "jobs", 2, "id"], f"id {twin} is also used by jobs[0]")]


def test_parents_must_be_the_callers_jobs_or_earlier_jobs_of_the_request() -> None:
    later, stranger = uuid.uuid4(), uuid.uuid4()
    itself = uuid.uuid4()
    with pytest.raises(InvalidInput) as exc:
        check(
            request(
                job(parent_ids=(later, stranger)),
                job(id=later),
                job(id=itself, parent_ids=(itself,)),
            )
        )
    assert problems(exc) == [
        (
            ["body", "jobs", 0, "parent_ids", 0],
            f"parent {later} is a later job of this request (list parents before their children)",
        ),
        (
            ["body", "jobs", 0, "parent_ids", 1],
            f"parent {stranger} is neither one of your jobs nor an earlier job of this request",
        ),
        (
            ["body", "jobs", 2, "parent_ids", 0],
            f"parent {itself} is a later job of this request (list parents before their children)",
        ),
    ]


def test_problems_are_counted_but_only_the_first_ones_detailed() -> None:
    many = [job(app="nope") for _ in range(MAX_DETAILS + 20)]
    with pytest.raises(InvalidInput) as exc:
        check(request(*many))
    assert len(exc.value.details) == MAX_DETAILS
    assert f"(and {MAX_DETAILS - 1} more problems)" in str(exc.value)


# --- the plan -----------------------------------------------------------------------------


def plan(req: SubmitRequest, catalog: Catalog = CATALOG) -> tuple[list[uuid.UUID], submit.Plan]:
    ids = submit.job_ids(req, USER, SECRET)
    return ids, submit.build_events(req, ids, catalog, user=USER, now=NOW, secret=SECRET)


def test_each_job_becomes_one_job_created_by_the_user() -> None:
    req = request(job(id=uuid.uuid4(), tags={"run": "1"}), job(site="beta"), key="k")
    ids, planned = plan(req)
    assert planned.already == {}
    assert [e.aggregate_id for e in planned.to_append] == ids
    for event, submitted in zip(planned.to_append, req.jobs, strict=True):
        assert (event.type, event.site, event.actor, event.occurred_at) == (
            "job.created",
            submitted.site,
            f"user:{USER}",
            NOW,
        )
        assert event.id == submit.event_id(event.aggregate_id, "k", SECRET)
        assert event.data == submitted
        assert apply(None, event, 1).state.value == "CREATED"


def test_a_jobs_own_id_never_reaches_the_log() -> None:
    own = uuid.uuid4()
    _, planned = plan(request(job(id=own)))
    (event,) = planned.to_append
    assert "id" not in orjson.loads(encode(event))["data"]


def existing(ids: list[uuid.UUID], index: int, *, owner: str = USER, key: str = "k") -> Existing:
    return Existing(owner, submit.event_id(ids[index], key, SECRET), created_seq=40 + index)


def test_a_retry_appends_only_what_the_first_attempt_did_not() -> None:
    req = request(job(), job(), job(), key="k")
    ids = submit.job_ids(req, USER, SECRET)
    done = {ids[0]: existing(ids, 0), ids[2]: existing(ids, 2)}
    _, planned = plan(req, replace(CATALOG, existing=done))
    assert planned.already == {0: done[ids[0]], 2: done[ids[2]]}
    assert [e.aggregate_id for e in planned.to_append] == [ids[1]]


@pytest.mark.parametrize(
    "taken",
    [{"owner": "bob"}, {"key": "another-key"}],
    ids=["another-users-job", "another-submissions-job"],
)
def test_a_job_id_taken_by_another_submission_conflicts_and_nothing_is_planned(
    taken: dict[str, Any],
) -> None:
    own = [uuid.uuid4(), uuid.uuid4()]
    req = request(job(id=own[0]), job(id=own[1]), job(), key="k")
    catalog = replace(
        CATALOG, existing={own[0]: existing(own, 0, **taken), own[1]: existing(own, 1, **taken)}
    )
    with pytest.raises(Conflict) as exc:
        plan(req, catalog)
    assert exc.value.message == (f"job {own[0]} already exists (and 1 more); nothing was appended")
    assert [d["loc"] for d in exc.value.details] == [
        ["body", "jobs", 0, "id"],
        ["body", "jobs", 1, "id"],
    ]
    assert {d["type"] for d in exc.value.details} == {"taken"}


def test_an_unkeyed_submission_never_matches_an_existing_job() -> None:
    own = uuid.uuid4()
    existing_job = Existing(USER, uuid7(), created_seq=3)
    catalog = replace(CATALOG, existing={own: existing_job})
    with pytest.raises(Conflict):
        plan(request(job(id=own)), catalog)


SUBMISSIONS = st.lists(
    st.builds(job, tags=st.dictionaries(st.sampled_from(["a", "b"]), st.sampled_from(["1", "2"]))),
    min_size=1,
    max_size=5,
)


@given(SUBMISSIONS, st.text(min_size=1, max_size=20))
def test_a_keyed_plan_is_the_same_on_every_retry(jobs: list[JobSubmission], key: str) -> None:
    req = request(*jobs, key=key)
    first_ids, first = plan(req)
    again_ids, again = plan(req)
    assert first_ids == again_ids
    assert [encode(e) for e in first.to_append] == [encode(e) for e in again.to_append]


@given(SUBMISSIONS, st.text(min_size=1, max_size=20), st.data())
def test_a_retry_after_any_partial_append_completes_the_submission(
    jobs: list[JobSubmission], key: str, data: st.DataObject
) -> None:
    req = request(*jobs, key=key)
    ids, first = plan(req)
    landed = data.draw(st.sets(st.sampled_from(range(len(jobs)))))
    done = {ids[i]: existing(ids, i, key=key) for i in landed}
    _, retry = plan(req, replace(CATALOG, existing=done))
    assert set(retry.already) == landed
    assert [e.id for e in retry.to_append] == [
        e.id for i, e in enumerate(first.to_append) if i not in landed
    ]


def test_a_transfer_through_a_location_the_site_did_not_declare_is_refused() -> None:
    elsewhere = TransferSpec(location="laptop", path="/d")
    req = request(job(), job(transfers={"inputs": elsewhere}))
    with pytest.raises(InvalidInput) as exc:
        submit.check(req, submit.job_ids(req, "ada", b"secret"), CATALOG)
    assert problems(exc) == [
        (["body", "jobs", 1, "transfers"],
         "transfer slot 'inputs': site 'alpha' has no transfer location 'laptop' "
         "(its locations: beamline)"),
    ]  # fmt: skip


# --- calls: a job of many calls of a Python-function app ----------------------------------

PYTHON = AppInterface.from_row({"steps": {"type": "int"}, "label": {"default": "x"}}, {},
                               python=True)  # fmt: skip
PYTHON_CATALOG = Catalog(
    sites=frozenset({"alpha"}), apps={"alpha": {"py": PYTHON, "sim": INTERFACE}},
    own_jobs=frozenset(), locations={"alpha": frozenset({"beamline"})},
)  # fmt: skip


def calls_job(app: str, calls: list[dict[str, Any]]) -> JobSubmission:
    return JobSubmission.model_validate(
        {"site": "alpha", "app": app, "workdir": "w", "calls": calls}
    )


def test_each_call_is_checked_as_parameters_are_and_located_by_its_index() -> None:
    req = request(calls_job("py", [{"steps": 1}, {"steps": "2"}, {"label": "y"}, {"nope": 1}]))
    with pytest.raises(InvalidInput) as exc:
        submit.check(req, submit.job_ids(req, USER, SECRET), PYTHON_CATALOG)
    found = problems(exc)
    assert any(loc == ["body", "jobs", 0, "calls", 1] and "parameter 'steps'" in msg
               for loc, msg in found)  # fmt: skip
    assert any(loc == ["body", "jobs", 0, "calls", 2] and "required parameter 'steps'" in msg
               for loc, msg in found)  # fmt: skip
    assert any(loc == ["body", "jobs", 0, "calls", 3] and "no parameter 'nope'" in msg
               for loc, msg in found)  # fmt: skip
    assert not any(loc[:4] == ["body", "jobs", 0, "calls"] and loc[4] == 0 for loc, _ in found)


def test_good_calls_pass_and_a_shell_app_takes_none() -> None:
    good = request(calls_job("py", [{"steps": 1}, {"steps": 2, "label": "z"}]))
    submit.check(good, submit.job_ids(good, USER, SECRET), PYTHON_CATALOG)
    shell = request(calls_job("sim", [{"n": "1"}]))
    with pytest.raises(InvalidInput) as exc:
        submit.check(shell, submit.job_ids(shell, USER, SECRET), PYTHON_CATALOG)
    assert "calls are for Python functions" in problems(exc)[0][1]


def test_calls_and_parameters_do_not_go_together() -> None:
    both = {"site": "alpha", "app": "py", "workdir": "w", "calls": [{"steps": 1}],
            "parameters": {"steps": 1}}  # fmt: skip
    with pytest.raises(ValueError, match="parameters or calls"):
        JobSubmission.model_validate(both)


def test_calls_are_held_to_the_parameters_byte_limit_together() -> None:
    calls = [{"steps": 1, "label": "x" * 1000} for _ in range(80)]  # ~83 KB as JSON
    with pytest.raises(ValueError, match=r"calls take \d+ bytes as JSON; the limit is 65536"):
        calls_job("py", calls)
    assert len(calls_job("py", calls[:50]).calls) == 50
