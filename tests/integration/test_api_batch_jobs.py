"""Pilot batch jobs through the API: request, list, show and delete, against the real log and
read models. What the site does with a request is tests/integration/test_site_scheduler.py."""

from __future__ import annotations

from typing import Any

import pytest

from lodestream.eventlog import EventLog
from lodestream.schemas.events import BatchJobFinished, BatchJobSubmitted
from lodestream.schemas.events.batch import BatchFinishedData, BatchSubmittedData
from lodestream.schemas.subjects import event_subject
from tests.fixtures.api import ApiHarness

REQUEST = {"num_nodes": 2, "wall_time_min": 30, "queue": "debug", "project": "cosmo"}


async def _request(api: ApiHarness, user: str, site: str, **body: Any) -> dict[str, Any]:
    response = await api.client.post(
        f"/sites/{site}/batch-jobs", json=REQUEST | body, params={"wait": "true"},
        headers=api.user(user),
    )  # fmt: skip
    assert response.status_code == 201, response.text
    result: dict[str, Any] = response.json()
    return result


async def test_a_requested_pilot_is_listed_and_shown(api: ApiHarness) -> None:
    await api.register_site("alice", "theta")
    accepted = await _request(
        api, "alice", "theta", filter_tags={"run": "7"}, options={"qos": "debug"}
    )

    assert (accepted["state"], accepted["site"], accepted["duplicate"]) == (
        "requested", "theta", False,
    )  # fmt: skip
    stored = await api.js.get_msg("EVENTS", seq=accepted["seq"])
    assert stored.subject == event_subject("theta", "batch.requested", accepted["id"])
    listed = (await api.client.get("/sites/theta/batch-jobs", headers=api.user("alice"))).json()
    assert [b["id"] for b in listed] == [accepted["id"]]
    shown = await api.client.get(f"/batch-jobs/{accepted['id']}", headers=api.user("alice"))
    job = shown.json()
    assert {k: job[k] for k in (*REQUEST, "job_mode", "state", "filter_tags", "options")} == (
        REQUEST | {"job_mode": "serial", "state": "requested", "filter_tags": {"run": "7"},
                   "options": {"qos": "debug"}}
    )  # fmt: skip
    everywhere = (await api.client.get("/batch-jobs", headers=api.user("alice"))).json()
    assert [b["id"] for b in everywhere] == [accepted["id"]]


async def test_only_the_owner_may_ask_a_site_for_pilots_or_see_them(api: ApiHarness) -> None:
    await api.register_site("alice", "theta")
    accepted = await _request(api, "alice", "theta")
    count = await api.message_count()

    asked = await api.client.post("/sites/theta/batch-jobs", json=REQUEST, headers=api.user("bob"))
    listed = await api.client.get("/sites/theta/batch-jobs", headers=api.user("bob"))
    shown = await api.client.get(f"/batch-jobs/{accepted['id']}", headers=api.user("bob"))
    deleted = await api.client.delete(f"/batch-jobs/{accepted['id']}", headers=api.user("bob"))

    assert asked.status_code == 404
    assert asked.json()["error"]["message"] == "site 'theta' not found"
    assert listed.status_code == shown.status_code == deleted.status_code == 404
    assert await api.message_count() == count


@pytest.mark.parametrize(
    ("body", "where", "says"),
    [
        ({"num_nodes": 0}, "body.num_nodes", "greater than or equal to 1"),
        ({"wall_time_min": 0}, "body.wall_time_min", "greater than or equal to 1"),
        ({"queue": "-p evil"}, "body.queue", "starts with '-', so it could be read as an option"),
        ({"project": "two words"}, "body.project", "one word"),
        ({"job_mode": "gpu"}, "body.job_mode", "'serial' or 'mpi'"),
        ({"options": {"--export": "LD_PRELOAD=x"}}, "body.options.--export.[key]",
         "an option name is a letter"),
        ({"options": {"qos": "a\nb"}}, "body.options.qos", "'\\n' is not one of letters"),
        ({"options": {"comment": "x --export=ALL,BASH_ENV=$(id)"}}, "body.options.comment",
         "cannot reach the scheduler as one word: ' ' is not one of letters"),
        ({"project": "a#b"}, "body.project", "'#' is not one of letters"),
        ({"filter_tags": {"a b": "c"}}, "body.filter_tags.a b.[key]", "String should match"),
        ({"colour": "red"}, "body.colour", "Extra inputs are not permitted"),
    ],
)  # fmt: skip
async def test_a_request_that_cannot_be_submitted_is_a_clear_422(
    api: ApiHarness, body: dict[str, Any], where: str, says: str
) -> None:
    await api.register_site("alice", "theta")
    count = await api.message_count()

    response = await api.client.post(
        "/sites/theta/batch-jobs", json=REQUEST | body, headers=api.user("alice")
    )

    assert response.status_code == 422, response.text
    message = response.json()["error"]["message"]
    assert message.startswith(f"invalid request: {where}: ")
    assert says in message
    assert await api.message_count() == count


async def test_an_idempotent_request_is_appended_once(api: ApiHarness) -> None:
    await api.register_site("alice", "theta")
    first = await _request(api, "alice", "theta", idempotency_key="nightly-1")
    count = await api.message_count()
    again = await _request(api, "alice", "theta", idempotency_key="nightly-1")

    assert (again["id"], again["seq"], again["duplicate"]) == (first["id"], first["seq"], True)
    assert await api.message_count() == count


async def test_a_deletion_is_recorded_once_and_refused_after_the_end(api: ApiHarness) -> None:
    await api.register_site("alice", "theta")
    accepted = await _request(api, "alice", "theta")
    batch = accepted["id"]

    deleted = await api.client.delete(f"/batch-jobs/{batch}", headers=api.user("alice"))
    assert deleted.status_code == 200, deleted.text
    assert deleted.json()["state"] == "deletion_requested"
    stored = await api.js.get_msg("EVENTS", seq=deleted.json()["seq"])
    assert stored.subject == event_subject("theta", "batch.deletion_requested", batch)
    assert b'"reason":"deleted by alice"' in (stored.data or b"")
    await api.wait_projected(deleted.json()["seq"])
    again = await api.client.delete(f"/batch-jobs/{batch}", headers=api.user("alice"))
    assert (again.status_code, again.json()["duplicate"]) == (200, True)

    # The site cancelled it: the scheduler's answer ends it, and nothing is left to delete.
    log = EventLog(api.js)
    submitted = await log.append(BatchJobSubmitted.create(
        site="theta", aggregate_id=accepted["id"], actor="site:theta",
        data=BatchSubmittedData(scheduler_id="77", scheduler="slurm"),
    ), expect=deleted.json()["seq"])  # fmt: skip
    finished = await log.append(BatchJobFinished.create(
        site="theta", aggregate_id=accepted["id"], actor="site:theta",
        data=BatchFinishedData(state="cancelled", reason="cancelled by the user"),
    ), expect=submitted.seq)  # fmt: skip
    await api.wait_projected(finished.seq)
    job = (await api.client.get(f"/batch-jobs/{batch}", headers=api.user("alice"))).json()
    assert (job["state"], job["scheduler"], job["scheduler_id"], job["scheduler_state"]) == (
        "finished", "slurm", "77", "cancelled",
    )  # fmt: skip
    late = await api.client.delete(f"/batch-jobs/{batch}", headers=api.user("alice"))
    assert late.status_code == 409
    assert late.json()["error"]["message"] == f"batch job {batch} has ended: nothing to delete"
    finished_only = await api.client.get(
        "/batch-jobs", params={"state": ["finished"]}, headers=api.user("alice")
    )
    assert [b["id"] for b in finished_only.json()] == [batch]
