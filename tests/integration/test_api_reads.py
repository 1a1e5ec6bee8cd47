"""GET /jobs, /jobs/{id}, /events: filters, pagination, and what one user can see of another."""

from __future__ import annotations

from typing import Any

import pytest

from lodestream.schemas.ids import uuid7
from lodestream.schemas.resources import App
from tests.fixtures.api import ApiHarness


def job(n: int, site: str = "theta", **fields: Any) -> dict[str, Any]:
    return {"site": site, "app": "sim", "workdir": f"runs/{n}", **fields}


@pytest.fixture
async def jobs(api: ApiHarness) -> list[dict[str, Any]]:
    """Five of alice's jobs, one request each (distinct creation times), as GET /jobs shows them."""
    await api.register_site("alice", "theta")
    await api.register_site("alice", "polaris")
    parent = str(uuid7())
    bodies = [
        job(0, id=parent, tags={"run": "a"}),
        job(1, tags={"run": "a", "kind": "x"}, parent_ids=[parent]),
        job(2, tags={"run": "b"}),
        job(3, site="polaris", app="other"),
        job(4, parent_ids=[parent]),
    ]
    ids = [(await api.submit("alice", [body])).json()["jobs"][0]["id"] for body in bodies]
    shown = [(await api.client.get(f"/jobs/{i}", headers=api.user("alice"))).json() for i in ids]
    assert [j["id"] for j in shown] == ids
    return shown


async def listed(api: ApiHarness, user: str = "alice", **params: Any) -> list[str]:
    response = await api.client.get("/jobs", params=params, headers=api.user(user))
    assert response.status_code == 200, response.text
    return [item["id"] for item in response.json()["items"]]


def ids_of(jobs: list[dict[str, Any]], *indexes: int) -> list[str]:
    return [jobs[i]["id"] for i in indexes]


async def test_filters(api: ApiHarness, jobs: list[dict[str, Any]]) -> None:
    assert await listed(api) == ids_of(jobs, 4, 3, 2, 1, 0)
    assert await listed(api, state="CREATED") == ids_of(jobs, 4, 3, 2, 1, 0)
    assert await listed(api, state=["RUNNING", "FAILED"]) == []
    assert await listed(api, tag="run:a") == ids_of(jobs, 1, 0)
    assert await listed(api, tag=["run:a", "kind:x"]) == ids_of(jobs, 1)
    assert await listed(api, state="CREATED", tag="run:b") == ids_of(jobs, 2)
    assert await listed(api, site="polaris") == ids_of(jobs, 3)
    assert await listed(api, app="other") == ids_of(jobs, 3)
    assert await listed(api, parent_id=jobs[0]["id"]) == ids_of(jobs, 4, 1)


async def test_time_ranges(api: ApiHarness, jobs: list[dict[str, Any]]) -> None:
    middle = jobs[2]["created_at"]
    assert await listed(api, created_after=middle) == ids_of(jobs, 4, 3)
    assert await listed(api, created_before=middle) == ids_of(jobs, 1, 0)
    assert await listed(api, updated_after=jobs[0]["updated_at"], order_by="updated") == ids_of(
        jobs, 1, 2, 3, 4
    )
    assert await listed(api, updated_before=jobs[1]["updated_at"]) == ids_of(jobs, 0)


async def test_pagination_and_order(api: ApiHarness, jobs: list[dict[str, Any]]) -> None:
    pages: list[str] = []
    offset: int | None = 0
    while offset is not None:
        response = await api.client.get(
            "/jobs",
            params={"limit": 2, "offset": offset, "order_by": "created"},
            headers=api.user("alice"),
        )
        body = response.json()
        pages += [item["id"] for item in body["items"]]
        offset = body["next_offset"]
    assert pages == ids_of(jobs, 0, 1, 2, 3, 4)
    assert await listed(api, order_by="-updated") == ids_of(jobs, 4, 3, 2, 1, 0)


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"tag": "run"}, "query.tag.0: a tag filter is key:value"),
        ({"tag": ":a"}, "query.tag.0: a tag filter is key:value"),
        ({"tag": "run:\x00"}, "query.tag.0: a tag filter is key:value"),
        ({"site": "Theta"}, "query.site: a site name is 1-40 lowercase letters"),
        ({"app": "1sim"}, "query.app: an app name is a letter or '_'"),
        ({"state": "DONE"}, "query.state.0: Input should be 'CREATED'"),
        ({"offset": 2**63}, "query.offset: Input should be less than or equal to"),
        ({"tag": ["run:a", "run:b"]}, "tag 'run' is given twice"),
        ({"limit": 100_000}, "query.limit: Input should be less than or equal to 1000"),
        ({"order_by": "name"}, "query.order_by"),
        ({"created_after": "2024-01-01T00:00:00"}, "query.created_after"),
        ({"state": "CREATED", "parent_id": "nope"}, "query.parent_id"),
    ],
)
async def test_invalid_queries(api: ApiHarness, params: dict[str, Any], message: str) -> None:
    response = await api.client.get("/jobs", params=params, headers=api.user("alice"))

    assert response.status_code == 422
    assert message in response.json()["error"]["message"]


async def test_events_feed_in_log_order(api: ApiHarness, jobs: list[dict[str, Any]]) -> None:
    alice = api.user("alice")
    feed = (await api.client.get("/events", params={"after_seq": 0}, headers=alice)).json()

    assert [e["job_id"] for e in feed["items"]] == ids_of(jobs, 0, 1, 2, 3, 4)
    assert [e["type"] for e in feed["items"]] == ["job.created"] * 5
    seqs = [e["seq"] for e in feed["items"]]
    assert seqs == sorted(seqs)
    assert feed["next_after_seq"] >= seqs[-1]

    page = (
        await api.client.get("/events", params={"after_seq": seqs[1], "limit": 2}, headers=alice)
    ).json()
    assert [e["seq"] for e in page["items"]] == seqs[2:4]
    assert page["next_after_seq"] == seqs[3]


async def test_another_user_sees_nothing_of_alice(
    api: ApiHarness, jobs: list[dict[str, Any]]
) -> None:
    await api.register_app(App(site="theta", name="sim"))
    await api.register_site("bob", "bobsite")
    bob = api.user("bob")
    some = jobs[0]["id"]

    assert await listed(api, "bob") == []
    # Another's site is not found, as submit says it.
    theta = await api.client.get("/jobs", params={"site": "theta"}, headers=bob)
    assert (theta.status_code, theta.json()["error"]["message"]) == (404, "site 'theta' not found")
    for path in (f"/jobs/{some}", f"/jobs/{some}/events"):
        response = await api.client.get(path, headers=bob)
        assert (response.status_code, response.json()["error"]["message"]) == (
            404,
            f"job {some} not found",
        )
    feed = (await api.client.get("/events", headers=bob)).json()
    assert feed["items"] == []
    assert [s["name"] for s in (await api.client.get("/sites", headers=bob)).json()] == ["bobsite"]
    assert (await api.client.get("/apps", headers=bob)).json() == []
    response = await api.client.get("/apps", params={"site": "theta"}, headers=bob)
    assert (response.status_code, response.json()["error"]["message"]) == (
        404,
        "site 'theta' not found",
    )
    apps = (
        await api.client.get("/apps", params={"site": "theta"}, headers=api.user("alice"))
    ).json()
    assert [(a["site"], a["name"]) for a in apps] == [("theta", "sim")]
