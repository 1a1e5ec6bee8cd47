"""``POST /jobs/kill`` and ``/jobs/reset`` by filter, in one request; the list routes refuse
query parameters they do not take and sites that are not the caller's; one tag syntax."""

from __future__ import annotations

import time
from typing import Any

import pytest

from tests.fixtures.api import ApiHarness

SITES = ("theta", "polaris")


@pytest.fixture
async def alice(api: ApiHarness) -> dict[str, str]:
    for site in SITES:
        await api.register_site("alice", site)
    await api.register_site("bob", "bobsite")
    return api.user("alice")


async def submit(api: ApiHarness, count: int, **tags: str) -> list[str]:
    jobs = [{"site": SITES[i % 2], "app": "sim", "workdir": f"r/{i}", "tags": {"i": str(i), **tags}}
            for i in range(count)]  # fmt: skip
    response = await api.submit("alice", jobs)
    assert response.status_code == 201, response.text
    return [job["id"] for job in response.json()["jobs"]]


async def states(api: ApiHarness, headers: dict[str, str], **params: Any) -> dict[str, str]:
    info = await api.js.stream_info("EVENTS")
    await api.wait_projected(int(info.state.last_seq))
    page = await api.client.get("/jobs", params={"limit": 1000, **params}, headers=headers)
    assert page.status_code == 200, page.text
    return {job["id"]: job["state"] for job in page.json()["items"]}


async def test_kill_by_filter_acts_on_the_matching_jobs_only_in_one_request(
    api: ApiHarness, alice: dict[str, str]
) -> None:
    doomed = await submit(api, 30, run="a")
    spared = await submit(api, 10, run="b")

    dry = await api.client.post("/jobs/kill", json={"tags": ["run:a"], "dry_run": True},
                                headers=alice)  # fmt: skip
    assert dry.status_code == 200, dry.text
    assert (dry.json()["matched"], dry.json()["acted"]) == (30, 0)

    started = time.perf_counter()
    killed = await api.client.post("/jobs/kill", json={"tags": ["run:a"], "reason": "bad run"},
                                   headers=alice)  # fmt: skip
    elapsed = time.perf_counter() - started
    assert killed.status_code == 200, killed.text
    # The harness caps a request at 50 jobs: 30 fit in one.
    assert {k: killed.json()[k] for k in ("matched", "acted", "refused", "more")} == {
        "matched": 30, "acted": 30, "refused": 0, "more": False}  # fmt: skip
    print(f"bulk kill of 30 jobs: {elapsed * 1000:.0f} ms")
    now = await states(api, alice)
    assert {now[i] for i in doomed} == {"KILLED"}
    assert {now[i] for i in spared} != {"KILLED"}

    # Killed jobs no longer match a kill; a reset brings back only those of the filter's site.
    again = await api.client.post("/jobs/kill", json={"tags": ["run:a"]}, headers=alice)
    assert again.json()["matched"] == 0
    reset = await api.client.post("/jobs/reset", json={"site": "theta", "tags": ["run:a"]},
                                  headers=alice)  # fmt: skip
    assert reset.json()["acted"] == 15, reset.text
    now = await states(api, alice, tag="run:a")
    assert sorted(now.values()).count("KILLED") == 15


async def test_more_than_one_request_holds_says_more_and_the_next_call_goes_on(
    api: ApiHarness, alice: dict[str, str]
) -> None:
    # The harness takes and acts on at most 50 jobs per request.
    ids = await submit(api, 40, run="c") + await submit(api, 30, run="c")
    first = (await api.client.post("/jobs/kill", json={"tags": ["run:c"]}, headers=alice)).json()
    assert (first["acted"], first["more"]) == (50, True)
    await states(api, alice)
    second = (await api.client.post("/jobs/kill", json={"tags": ["run:c"]}, headers=alice)).json()
    assert (second["acted"], second["more"]) == (20, False)
    now = await states(api, alice)
    assert {now[i] for i in ids} == {"KILLED"}


async def test_named_ids_and_what_a_bulk_action_refuses(
    api: ApiHarness, alice: dict[str, str]
) -> None:
    ids = await submit(api, 4)
    named = await api.client.post("/jobs/kill", json={"ids": ids[:2]}, headers=alice)
    assert named.json()["acted"] == 2
    assert sorted((await states(api, alice)).values()).count("KILLED") == 2

    nothing = await api.client.post("/jobs/kill", json={}, headers=alice)
    assert nothing.status_code == 422
    assert "name the jobs to kill" in nothing.json()["error"]["message"]
    finished = await api.client.post("/jobs/kill", json={"states": ["JOB_FINISHED"]},
                                     headers=alice)  # fmt: skip
    assert finished.status_code == 422
    assert "kill applies to jobs in" in finished.json()["error"]["message"]
    for site in ("nosuch", "bobsite"):
        foreign = await api.client.post("/jobs/kill", json={"site": site}, headers=alice)
        assert foreign.status_code == 404, foreign.text
    equals = await api.client.post("/jobs/reset", json={"tags": ["run=a"]}, headers=alice)
    assert equals.status_code == 422
    assert "write run:a" in equals.json()["error"]["message"]


async def test_list_routes_refuse_unknown_parameters_and_sites_not_yours(
    api: ApiHarness, alice: dict[str, str]
) -> None:
    await submit(api, 2)
    for path, params in [("/jobs", {"stat": "FAILED"}), ("/events", {"site": "theta"}),
                         ("/apps", {"name": "x"}), ("/sites", {"owner": "bob"}),
                         ("/batch-jobs", {"stat": "x"})]:  # fmt: skip
        answer = await api.client.get(path, params=params, headers=alice)
        assert answer.status_code == 422, (path, answer.text)
        message = answer.json()["error"]["message"]
        assert "unknown query parameter" in message
        assert next(iter(params)) in message
    for site in ("nosuch", "bobsite"):
        answer = await api.client.get("/jobs", params={"site": site}, headers=alice)
        assert answer.status_code == 404, answer.text
        assert f"site {site!r} not found" in answer.json()["error"]["message"]
    tagged = await api.client.get("/jobs", params={"tag": "i=1"}, headers=alice)
    assert tagged.status_code == 422
    assert "query.tag.0: a tag filter is key:value" in tagged.json()["error"]["message"]
    assert "; write i:1" in tagged.json()["error"]["message"]
    assert len((await api.client.get("/jobs", params={"tag": "i:1"}, headers=alice)).json()[
        "items"]) == 1  # fmt: skip
