"""Transfer items as users read them: in GET /jobs/{id} and GET /sites/{name}/transfers.

The items are put on the log as their writers put them (the controller requests, the site's
transfer module reports) and folded by the real projector; a job here is reset and staged
again, so it has items of two stage-in steps and one stage-out step.
"""

from __future__ import annotations

from typing import Any

import pytest

from lodestream.schemas.resources import App
from tests.fixtures.api import ApiHarness
from tests.support.staging import (
    INPUT,
    LOCATIONS,
    SITE,
    Staged,
    declare_locations,
    staged_job,
)


@pytest.fixture
async def staged(api: ApiHarness) -> Staged:
    return await staged_job(api)


async def site_transfers(api: ApiHarness, user: str = "alice", **params: Any) -> Any:
    response = await api.client.get(
        f"/sites/{SITE}/transfers", params=params, headers=api.user(user)
    )
    assert response.status_code == 200, response.text
    return response.json()


# --- GET /jobs/{id} ---------------------------------------------------------------------------


async def test_a_job_shows_the_items_of_its_newest_step_for_each_slot(
    api: ApiHarness, staged: Staged
) -> None:
    response = await api.client.get(f"/jobs/{staged.job}", headers=api.user("alice"))

    assert response.status_code == 200, response.text
    body = response.json()
    assert body["transfers"]["input"] == {  # what it asked for
        **INPUT,
        "recursive": False,
        "overwrite": None,
        "sha256": None,
    }
    items = body["transfer_items"]
    assert [(i["slot"], i["direction"], i["id"]) for i in items] == [
        ("input", "in", str(staged.input.id)),
        ("params", "in", str(staged.params.id)),
        ("results", "out", str(staged.results.id)),
    ]
    input_, params, results = items
    assert input_["step_id"] == params["step_id"] != results["step_id"]
    assert (input_["state"], input_["attempts"], input_["task_id"]) == ("submitted", 2, "task-3")
    assert (input_["location"], input_["remote_path"]) == ("archive", "/data/in.h5")
    assert (input_["reason"], input_["bytes_transferred"], input_["duration_s"]) == (None,) * 3
    assert (params["state"], params["attempts"], params["task_id"]) == ("pending", 0, None)
    assert params["remote_path"] == "/cfg/[run 1].json"
    assert (results["recursive"], results["local_path"]) == (True, "runs/results")
    assert input_["requested_at"] is not None
    assert input_["updated_at"] >= input_["requested_at"]


async def test_a_job_that_stages_nothing_has_no_items(api: ApiHarness) -> None:
    await api.register_site("alice", SITE)
    await api.register_app(App(site=SITE, name="plain"))
    response = await api.submit("alice", [{"site": SITE, "app": "plain", "workdir": "r/2"}])
    job = response.json()["jobs"][0]["id"]

    body = (await api.client.get(f"/jobs/{job}", headers=api.user("alice"))).json()

    assert body["transfer_items"] == []
    assert body["transfers"] == {}


async def test_another_users_job_shows_nothing_of_its_transfers(
    api: ApiHarness, staged: Staged
) -> None:
    response = await api.client.get(f"/jobs/{staged.job}", headers=api.user("bob"))

    assert response.status_code == 404
    assert "task-" not in response.text


async def test_the_job_list_is_unchanged(api: ApiHarness, staged: Staged) -> None:
    response = await api.client.get("/jobs", headers=api.user("alice"))

    [listed] = response.json()["items"]
    assert listed["id"] == staged.job
    assert "transfer_items" not in listed


# --- GET /sites/{name}/transfers --------------------------------------------------------------


async def test_a_site_lists_what_is_in_flight_newest_first(api: ApiHarness, staged: Staged) -> None:
    items = await site_transfers(api)

    assert [i["id"] for i in items] == [
        str(staged.results.id), str(staged.input.id), str(staged.params.id)
    ]  # fmt: skip
    assert {i["state"] for i in items} == {"pending", "submitted"}
    assert {(i["site"], i["job_id"]) for i in items} == {(SITE, staged.job)}


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        ({"state": "failed"}, ["first_input"]),
        ({"state": ["succeeded", "failed"]}, ["first_input", "first_params"]),
        ({"direction": "out"}, ["results"]),
        ({"direction": "in", "state": "submitted"}, ["input"]),
        ({"limit": 1}, ["results"]),
        (
            {"state": ["pending", "submitted", "succeeded", "failed"]},
            ["results", "input", "params", "first_input", "first_params"],
        ),
    ],
)
async def test_a_sites_items_by_state_and_direction(
    api: ApiHarness, staged: Staged, params: dict[str, Any], expected: list[str]
) -> None:
    items = await site_transfers(api, **params)

    assert [i["id"] for i in items] == [str(getattr(staged, name).id) for name in expected]


async def test_every_item_of_one_job_with_its_outcome(api: ApiHarness, staged: Staged) -> None:
    other = await staged_job(api, site="polaris")  # alice's, at another site
    every = ["pending", "submitted", "succeeded", "failed"]

    items = await site_transfers(api, job_id=staged.job, state=every)
    elsewhere = await site_transfers(api, job_id=other.job, state=every)

    assert len(items) == 5
    assert elsewhere == []
    by_id = {i["id"]: i for i in items}
    failed, done = by_id[str(staged.first_input.id)], by_id[str(staged.first_params.id)]
    assert (failed["state"], failed["reason"], failed["permanent"]) == (
        "failed", "no such file", True
    )  # fmt: skip
    assert (done["state"], done["bytes_transferred"], done["duration_s"]) == (
        "succeeded", 2048, 1.5
    )  # fmt: skip
    assert done["task_id"] == "task-1"


async def test_a_site_with_no_transfers_lists_none(api: ApiHarness) -> None:
    await api.register_site("alice", SITE)

    assert await site_transfers(api) == []


async def test_another_users_site_is_not_found(api: ApiHarness, staged: Staged) -> None:
    await api.register_site("bob", "polaris")

    theirs = await api.client.get(f"/sites/{SITE}/transfers", headers=api.user("bob"))
    nobodys = await api.client.get("/sites/nowhere/transfers", headers=api.user("alice"))

    for response, name in ((theirs, SITE), (nobodys, "nowhere")):
        assert response.status_code == 404
        assert response.json()["error"]["message"] == f"site {name!r} not found"
    assert "task-" not in theirs.text


async def test_a_removed_site_is_not_found(api: ApiHarness, staged: Staged) -> None:
    removed = await api.client.delete(f"/sites/{SITE}", headers=api.user("alice"))
    await api.wait_projected(removed.json()["seq"])

    response = await api.client.get(f"/sites/{SITE}/transfers", headers=api.user("alice"))

    assert response.status_code == 404


@pytest.mark.parametrize(
    ("path", "params", "message"),
    [
        (SITE, {"state": "done"}, "query.state.0: Input should be 'pending'"),
        (SITE, {"direction": "both"}, "query.direction: Input should be 'in' or 'out'"),
        (SITE, {"limit": 0}, "query.limit: Input should be greater than or equal to 1"),
        (SITE, {"limit": 1001}, "query.limit: Input should be less than or equal to 1000"),
        (SITE, {"job_id": "nope"}, "query.job_id"),
        ("Theta", {}, "path.name: a site name is 1-40 lowercase letters"),
    ],
)
async def test_invalid_queries_are_422(
    api: ApiHarness, path: str, params: dict[str, Any], message: str
) -> None:
    await api.register_site("alice", SITE)

    response = await api.client.get(
        f"/sites/{path}/transfers", params=params, headers=api.user("alice")
    )

    assert response.status_code == 422, response.text
    assert message in response.json()["error"]["message"]


# --- a site's locations -----------------------------------------------------------------------


async def test_a_site_shows_the_locations_it_declared(api: ApiHarness) -> None:
    await api.register_site("alice", SITE)
    before = (await api.client.get("/sites", headers=api.user("alice"))).json()
    await api.wait_projected(await declare_locations(api.js, SITE, LOCATIONS))

    after = (await api.client.get("/sites", headers=api.user("alice"))).json()

    assert [s["transfer_locations"] for s in before] == [{}]
    assert [s["transfer_locations"] for s in after] == [LOCATIONS]
