"""``build_events`` constructs its ``job.created`` events without validating them again
(issue 15): each must equal, byte for byte on the log, what ``JobCreated.create`` validates
from the same inputs, and what cannot be proved valid in advance is refused as before."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from lodestream.schemas.codec import decode, encode
from lodestream.schemas.events.job import JobCreated
from lodestream.schemas.placement import SiteChoice
from lodestream.services.api import submit
from lodestream.services.api.models import JobSubmission, SubmitRequest
from lodestream.services.api.placement import SiteLoad
from lodestream.services.api.submit import AppInterface, Catalog

NOW = datetime(2025, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)
PLAIN = AppInterface.from_row({"n": {"required": False}}, {})
HOOKED = AppInterface.from_row({}, {"inputs": {"required": False}}, hooks=("preprocess",))
CATALOG = Catalog(
    sites=frozenset({"alpha", "beta"}),
    apps={"alpha": {"plain": PLAIN, "hooked": HOOKED}, "beta": {"plain": PLAIN}},
    own_jobs=frozenset(),
    locations={"alpha": frozenset({"beamline"}), "beta": frozenset()},
    loads={"alpha": SiteLoad(2, 0, {}), "beta": SiteLoad(0, 0, {})},
)

INT64 = st.integers(-(2**63), 2**63 - 1)
NUL_FREE = st.text(max_size=4).filter(lambda s: "\x00" not in s)
JOBS: st.SearchStrategy[dict[str, Any]] = st.builds(
    dict,
    site=st.sampled_from(["alpha", "beta", "auto"]),
    app=st.just("plain"),
    workdir=st.sampled_from(["w", "runs/é", "a_b-1"]),
    parameters=st.dictionaries(st.just("n"), NUL_FREE),
    tags=st.dictionaries(st.sampled_from(["a", "b"]), st.sampled_from(["1", "é", ""])),
    data=st.dictionaries(
        st.sampled_from(["x", "y"]), INT64 | st.floats(allow_nan=False, allow_infinity=False)
    ),
) | st.just(
    {
        "site": "alpha",
        "app": "hooked",  # not created runnable
        "workdir": "w",
        "transfers": {"inputs": {"location": "beamline", "path": "/d"}},
    }
)


def reference(plan: submit.Plan, user: str, now: datetime) -> list[JobCreated]:
    """The same events as ``JobCreated.create`` builds them: validated, field by field."""
    return [
        JobCreated.create(
            site=event.site,
            aggregate_id=event.aggregate_id,
            actor=f"user:{user}",
            data=event.data,
            event_id=event.id,
            occurred_at=now,
        )
        for event in plan.to_append
    ]


def planned(jobs: list[dict[str, Any]], *, user: str = "ada", now: datetime = NOW,
            key: str | None = None) -> submit.Plan:  # fmt: skip
    req = submit.resolve_auto(
        SubmitRequest.model_validate({"jobs": jobs, "idempotency_key": key}), CATALOG
    )
    ids = submit.job_ids(req, user, b"secret")
    submit.check(req, ids, CATALOG)
    return submit.build_events(req, ids, CATALOG, user=user, now=now, secret=b"secret")


@settings(max_examples=60)
@given(st.lists(JOBS, min_size=1, max_size=6), st.none() | st.just("key"))
def test_constructed_events_are_the_validated_events(
    jobs: list[dict[str, Any]], key: str | None
) -> None:
    plan = planned(jobs, key=key)
    expected = reference(plan, "ada", NOW)
    assert plan.to_append == expected
    for event, validated in zip(plan.to_append, expected, strict=True):
        assert encode(event) == encode(validated)
        assert event.model_fields_set == validated.model_fields_set
        assert decode(encode(event)) == decode(encode(validated))


def test_what_build_events_decides_survives_construction() -> None:
    plan = planned(
        [
            {"site": "alpha", "app": "plain", "workdir": "w"},
            {"site": "auto", "app": "plain", "workdir": "w"},
            {"site": "alpha", "app": "hooked", "workdir": "w"},
        ]
    )
    runnable, placed, hooked = plan.to_append
    assert runnable.runnable
    assert not hooked.runnable
    choice = placed.data.site_choice
    assert isinstance(choice, SiteChoice)
    assert placed.site == placed.data.site == choice.chosen
    assert all(isinstance(event.data, JobSubmission) for event in plan.to_append)
    for event in plan.to_append:  # the request's own fields stay off the log
        assert {"id", "strategy"}.isdisjoint(orjson.loads(encode(event))["data"])


def test_an_offset_timestamp_is_kept_as_validation_keeps_it() -> None:
    at = datetime(2025, 1, 2, 5, tzinfo=timezone(timedelta(hours=2)))
    plan = planned([{"site": "beta", "app": "plain", "workdir": "w"}], now=at)
    assert plan.to_append == reference(plan, "ada", at)
    assert encode(plan.to_append[0]) == encode(reference(plan, "ada", at)[0])


@pytest.mark.parametrize("user", ["has space", "x" * 121, ""])
def test_a_user_name_that_is_no_actor_is_refused_as_validation_refuses_it(user: str) -> None:
    with pytest.raises(ValidationError):
        JobCreated.create(site="beta", aggregate_id=uuid.uuid4(), actor=f"user:{user}",
                          data=JobSubmission(site="beta", app="plain", workdir="w"))  # fmt: skip
    with pytest.raises(ValidationError):
        planned([{"site": "beta", "app": "plain", "workdir": "w"}], user=user)


def test_a_naive_timestamp_is_refused_as_validation_refuses_it() -> None:
    with pytest.raises(ValidationError):
        planned([{"site": "beta", "app": "plain", "workdir": "w"}], now=NOW.replace(tzinfo=None))
