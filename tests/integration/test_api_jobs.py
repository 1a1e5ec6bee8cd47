"""POST /jobs against real NATS, Postgres and projector: accepted, idempotent, or refused whole."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from lodestream.eventlog import EventLog
from lodestream.eventlog.append import appended_seq
from lodestream.schemas.events.job import JobCreated
from lodestream.schemas.ids import uuid7
from lodestream.schemas.resources import App, AppParameter, AppTransferSlot, JobSpec
from tests.fixtures.api import ApiHarness

SITE = "theta"


def job(n: int = 0, **fields: Any) -> dict[str, Any]:
    return {"site": SITE, "app": "sim", "workdir": f"runs/{n}", **fields}


@pytest.fixture
async def alice(api: ApiHarness) -> dict[str, str]:
    await api.register_site("alice", SITE)
    return api.user("alice")


async def test_submitted_jobs_are_projected_as_created(
    api: ApiHarness, alice: dict[str, str]
) -> None:
    before = await api.message_count()
    response = await api.submit("alice", [job(1, tags={"run": "a"}), job(2)])

    assert response.status_code == 201, response.text
    body = response.json()
    assert [j["duplicate"] for j in body["jobs"]] == [False, False]
    assert body["last_seq"] == max(j["seq"] for j in body["jobs"])
    assert await api.message_count() == before + 2
    first = body["jobs"][0]
    shown = (await api.client.get(f"/jobs/{first['id']}", headers=alice)).json()
    assert shown["state"] == "CREATED"
    assert shown["owner"] == "alice"
    assert shown["tags"] == {"run": "a"}
    assert shown["created_seq"] == first["seq"]
    events = (await api.client.get(f"/jobs/{first['id']}/events", headers=alice)).json()
    assert [(e["type"], e["seq"], e["actor"]) for e in events] == [
        ("job.created", first["seq"], "user:alice")
    ]


async def test_without_wait_the_submission_is_accepted(
    api: ApiHarness, alice: dict[str, str]
) -> None:
    response = await api.client.post("/jobs", json={"jobs": [job()]}, headers=alice)

    assert response.status_code == 202
    assert response.json()["jobs"][0]["duplicate"] is False


async def test_resubmit_with_the_same_key_appends_nothing(
    api: ApiHarness, alice: dict[str, str]
) -> None:
    request = {"jobs": [job(1), job(2), job(3)], "idempotency_key": "batch-7"}
    first = await api.client.post("/jobs", json=request, params={"wait": "true"}, headers=alice)
    count = await api.message_count()

    again = await api.client.post("/jobs", json=request, params={"wait": "true"}, headers=alice)

    assert again.status_code == 201
    assert [(j["id"], j["seq"]) for j in again.json()["jobs"]] == [
        (j["id"], j["seq"]) for j in first.json()["jobs"]
    ]
    assert all(j["duplicate"] for j in again.json()["jobs"])
    assert await api.message_count() == count


async def test_retry_before_projection_is_deduplicated_by_the_log(
    api: ApiHarness, alice: dict[str, str]
) -> None:
    await api.projector.stop()
    request = {"jobs": [job(1), job(2)], "idempotency_key": "k"}
    first = (await api.client.post("/jobs", json=request, headers=alice)).json()
    count = await api.message_count()

    again = (await api.client.post("/jobs", json=request, headers=alice)).json()

    assert again["jobs"] == [{**j, "duplicate": True} for j in first["jobs"]]
    assert await api.message_count() == count


async def test_the_same_key_of_another_user_makes_other_jobs(api: ApiHarness) -> None:
    await api.register_site("alice", SITE)
    await api.register_site("bob", "bobsite")
    mine = await api.submit("alice", [job()], idempotency_key="k")
    theirs = await api.submit("bob", [job(site="bobsite")], idempotency_key="k")

    assert mine.json()["jobs"][0]["id"] != theirs.json()["jobs"][0]["id"]


async def test_a_dag_goes_in_one_request(api: ApiHarness, alice: dict[str, str]) -> None:
    parent, child = str(uuid7()), str(uuid7())
    response = await api.submit("alice", [job(1, id=parent), job(2, id=child, parent_ids=[parent])])

    assert response.status_code == 201, response.text
    assert [j["id"] for j in response.json()["jobs"]] == [parent, child]
    shown = (await api.client.get(f"/jobs/{child}", headers=alice)).json()
    assert shown["parent_ids"] == [parent]


async def test_a_parent_may_be_an_earlier_submitted_job(
    api: ApiHarness, alice: dict[str, str]
) -> None:
    parent = (await api.submit("alice", [job(1)])).json()["jobs"][0]["id"]

    response = await api.submit("alice", [job(2, parent_ids=[parent])])

    assert response.status_code == 201, response.text


async def test_a_taken_client_id_is_a_conflict(api: ApiHarness, alice: dict[str, str]) -> None:
    taken = str(uuid7())
    await api.submit("alice", [job(1, id=taken)])
    count = await api.message_count()

    response = await api.submit("alice", [job(2), job(3, id=taken)])

    assert response.status_code == 409
    error = response.json()["error"]
    assert error["code"] == "conflict"
    assert f"job {taken} already exists" in error["message"]
    assert "nothing was appended" in error["message"]
    assert await api.message_count() == count


async def test_a_clash_the_read_model_has_not_seen_is_caught_by_the_log(
    api: ApiHarness, alice: dict[str, str]
) -> None:
    await api.projector.stop()
    taken = str(uuid7())
    await api.client.post("/jobs", json={"jobs": [job(1, id=taken)]}, headers=alice)
    count = await api.message_count()

    response = await api.client.post("/jobs", json={"jobs": [job(2, id=taken)]}, headers=alice)

    assert response.status_code == 409
    assert response.json()["error"]["details"]["refused"][0]["id"] == taken
    assert await api.message_count() == count


async def test_appended_seq_tells_a_retry_from_another_event(api: ApiHarness) -> None:
    spec = JobSpec(site=SITE, app="sim", workdir="w")
    job_id = uuid7()
    mine = JobCreated.create(site=SITE, aggregate_id=job_id, actor="user:alice", data=spec)
    other = JobCreated.create(site=SITE, aggregate_id=job_id, actor="user:alice", data=spec)
    appended = await EventLog(api.js).append(mine, expect=0)

    assert await appended_seq(api.js, mine) == appended.seq
    assert await appended_seq(api.js, other) is None


async def test_wait_times_out_with_the_accepted_jobs(
    api: ApiHarness, alice: dict[str, str]
) -> None:
    await api.projector.stop()

    response = await api.client.post(
        "/jobs",
        json={"jobs": [job()]},
        params={"wait": "true", "wait_timeout": "0.2"},
        headers=alice,
    )

    assert response.status_code == 504
    error = response.json()["error"]
    assert "projector" in error["message"]
    assert len(error["details"]["jobs"]) == 1


# --- refused whole: nothing reaches the log ---------------------------------------------------


@pytest.fixture
async def with_app(api: ApiHarness, alice: dict[str, str]) -> dict[str, str]:
    await api.register_app(
        App(
            site=SITE,
            name="sim",
            parameters={
                "steps": AppParameter(),
                "seed": AppParameter(required=False),
                "mode": AppParameter(default="fast"),
            },
            transfers={"input": AppTransferSlot(direction="in", local_path="in.h5")},
        )
    )
    return alice


async def refused(api: ApiHarness, user: str, body: bytes | dict[str, Any]) -> tuple[int, Any]:
    count = await api.message_count()
    if isinstance(body, bytes):
        response = await api.client.post(
            "/jobs",
            content=body,
            headers={**api.user(user), "content-type": "application/json"},
        )
    else:
        response = await api.client.post("/jobs", json=body, headers=api.user(user))
    assert await api.message_count() == count, "a refused submission appended events"
    return response.status_code, response.json()["error"]


@pytest.mark.usefixtures("with_app")
@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (job(app="nope", parameters={"steps": "1"}), "site 'theta' has no app 'nope'"),
        (
            job(parameters={"steps": "1", "speed": "9"}),
            "app 'sim' at 'theta' has no parameter 'speed'",
        ),
        (job(parameters={"seed": "1"}), "app 'sim' requires parameter 'steps'"),
        (
            job(parameters={"steps": "1"}, transfers={"out": {"location": "g", "path": "/p"}}),
            "app 'sim' has no transfer slot 'out'",
        ),
        (job(parameters={"steps": "1"}, workdir="../x"), "workdir: must be a relative path"),
        (
            job(parameters={"steps": "1"}, parent_ids=[str(uuid.uuid4())]),
            "neither one of your jobs",
        ),
        (job(parameters={"steps": "1"}, tags={"bad key": "v"}), "tags.bad key"),
    ],
)
async def test_an_invalid_job_refuses_the_whole_request(
    api: ApiHarness, bad: dict[str, Any], message: str
) -> None:
    good = job(1, parameters={"steps": "10"})

    status, error = await refused(api, "alice", {"jobs": [good, bad]})

    assert status == 422
    assert error["code"] == "invalid"
    assert message in error["message"]
    assert error["details"][0]["loc"][:3] == ["body", "jobs", 1]


async def test_a_parent_must_come_before_its_child(api: ApiHarness, alice: dict[str, str]) -> None:
    parent = str(uuid7())
    child = job(1, parent_ids=[parent])

    status, error = await refused(api, "alice", {"jobs": [child, job(2, id=parent)]})

    assert status == 422
    assert "later job of this request" in error["message"]


async def test_one_id_twice_is_invalid(api: ApiHarness, alice: dict[str, str]) -> None:
    same = str(uuid7())

    status, error = await refused(api, "alice", {"jobs": [job(1, id=same), job(2, id=same)]})

    assert status == 422
    assert "also used by jobs[0]" in error["message"]


async def test_malformed_json_is_invalid(api: ApiHarness, alice: dict[str, str]) -> None:
    status, error = await refused(api, "alice", b'{"jobs": [')

    assert status == 422
    assert error["message"].startswith("invalid submission: body: Invalid JSON")


async def test_empty_and_unknown_fields_are_invalid(api: ApiHarness, alice: dict[str, str]) -> None:
    assert (await refused(api, "alice", {"jobs": []}))[0] == 422
    status, error = await refused(api, "alice", {"jobs": [job()], "priority": 1})
    assert status == 422
    assert "body.priority" in error["message"]


async def test_more_jobs_than_allowed_is_too_large(api: ApiHarness, alice: dict[str, str]) -> None:
    limit = api.settings.api.max_jobs_per_request

    status, error = await refused(api, "alice", {"jobs": [job(i) for i in range(limit + 1)]})

    assert status == 413
    assert error["message"] == (
        f"{limit + 1} jobs in one request; the limit is {limit}: split the submission"
    )


async def test_a_site_of_another_user_is_not_found(api: ApiHarness, alice: dict[str, str]) -> None:
    status, error = await refused(api, "bob", {"jobs": [job()]})
    assert (status, error["message"]) == (404, "site 'theta' not found")

    status, error = await refused(api, "bob", {"jobs": [job(site="nowhere")]})
    assert (status, error["message"]) == (404, "site 'nowhere' not found")


async def test_a_parent_of_another_user_is_invalid(api: ApiHarness, alice: dict[str, str]) -> None:
    parent = (await api.submit("alice", [job()])).json()["jobs"][0]["id"]
    await api.register_site("bob", "bobsite")

    status, error = await refused(api, "bob", {"jobs": [job(site="bobsite", parent_ids=[parent])]})

    assert status == 422
    assert f"parent {parent} is neither one of your jobs" in error["message"]


async def test_wait_timeout_above_the_maximum_is_invalid(
    api: ApiHarness, alice: dict[str, str]
) -> None:
    response = await api.client.post(
        "/jobs",
        json={"jobs": [job()]},
        params={"wait": "true", "wait_timeout": "1e6"},
        headers=alice,
    )

    assert response.status_code == 422
    assert "wait_timeout must be at most" in response.json()["error"]["message"]
