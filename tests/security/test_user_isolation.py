"""User bob (owner of site beta) against user ada's site alpha and her jobs, over real HTTP.

Every read of ada's things answers as if they did not exist (404, or a list without them);
every write is refused (404, 409 for a name taken, 422 for a reference bob may not make)
and appends nothing to the log.
"""

from __future__ import annotations

import uuid
from typing import Any

import httpx

from tests.security.attack import Api, api_client, control_connection, pipeline_works
from tests.support.stack import SITE_OWNERS, Stack

ADA, BOB = SITE_OWNERS["alpha"], SITE_OWNERS["beta"]


async def all_pages(api: Api, user: str, path: str, **params: Any) -> list[dict[str, Any]]:
    """Every item of a paged listing (``/jobs`` by offset, ``/events`` by sequence)."""
    items: list[dict[str, Any]] = []
    params = {"limit": 1000, **params}
    while True:
        response = await api.client.get(path, params=params, headers=api.auth(user))
        assert response.status_code == 200, response.text
        page = response.json()
        items += page["items"]
        if path == "/events":
            if not page["items"]:
                return items
            params["after_seq"] = page["next_after_seq"]
        elif page["next_offset"] is None:
            return items
        else:
            params["offset"] = page["next_offset"]


async def attempts_by(api: Api, user: str, job: uuid.UUID) -> dict[str, httpx.Response]:
    """Everything ``user`` tries against ada's job and site, by name."""
    auth = api.auth(user)
    get, post = api.client.get, api.client.post
    beta_job = {"site": "beta", "app": "hello", "workdir": "w"}
    return {
        "read job": await get(f"/jobs/{job}", headers=auth),
        "read events": await get(f"/jobs/{job}/events", headers=auth),
        "list apps of alpha": await get("/apps", params={"site": "alpha"}, headers=auth),
        "list alpha's transfers": await get("/sites/alpha/transfers", headers=auth),
        "kill": await post(f"/jobs/{job}/kill", json={}, headers=auth),
        "reset": await post(f"/jobs/{job}/reset", json={}, headers=auth),
        "submit to alpha": await post(
            "/jobs", json={"jobs": [beta_job | {"site": "alpha"}]}, headers=auth
        ),
        "child of ada's job": await post(
            "/jobs", json={"jobs": [beta_job | {"parent_ids": [str(job)]}]}, headers=auth
        ),
        "reuse ada's job id": await post(
            "/jobs", json={"jobs": [beta_job | {"id": str(job)}]}, headers=auth
        ),
        "register alpha": await post("/sites", json={"name": "alpha"}, headers=auth),
        "rebind alpha's key": await api.client.put(
            "/sites/alpha/key", json={"public_key": api.stack.public_keys["beta"]}, headers=auth
        ),
        "remove alpha": await api.client.delete("/sites/alpha", headers=auth),
    }


EXPECTED = {
    "read job": {404},
    "read events": {404},
    "list apps of alpha": {404},
    "list alpha's transfers": {404},
    "kill": {404},
    "reset": {404},
    "submit to alpha": {404},
    "child of ada's job": {404, 422},
    # 409 says that the id exists (a UUID nobody can guess); nothing is appended either way.
    "reuse ada's job id": {404, 409, 422},
    "register alpha": {409},
    "rebind alpha's key": {404},
    "remove alpha": {404},
}


async def test_a_user_cannot_read_or_change_another_users_site_and_jobs(
    shared_stack: Stack,
) -> None:
    marker = f"secret-{uuid.uuid4().hex}"
    async with api_client(shared_stack) as api, control_connection(shared_stack) as js:
        job = await api.submit(ADA, "alpha", parameters={"who": marker})
        before = await api.wait_state(ADA, job, "PREPROCESSED")
        last_seq = (await js.stream_info("EVENTS")).state.last_seq

        for user in (BOB, "mallory"):  # a site owner, and a user with no site at all
            answers = await attempts_by(api, user, job)
            statuses = {name: r.status_code for name, r in answers.items()}
            assert all(statuses[n] in EXPECTED[n] for n in EXPECTED), statuses
            assert not any(marker in r.text for r in answers.values())
            listed = [j["id"] for j in await all_pages(api, user, "/jobs")]
            assert str(job) not in listed
            # Naming another user's site in a listing is 404, as in a submission.
            foreign = await api.client.get("/jobs", params={"site": "alpha"},
                                           headers=api.auth(user))  # fmt: skip
            assert foreign.status_code == 404, foreign.text
            assert marker not in foreign.text
            events = await all_pages(api, user, "/events", after_seq=0)
            assert all(e["site"] != "alpha" for e in events)
            sites = (await api.client.get("/sites", headers=api.auth(user))).json()
            assert "alpha" not in [s["name"] for s in sites]
        for headers in ({}, {"Authorization": "Bearer not-a-token"}):
            assert (await api.client.get(f"/jobs/{job}", headers=headers)).status_code == 401

        assert (await js.stream_info("EVENTS")).state.last_seq == last_seq
        assert await api.job(ADA, job) == before
        sites = (await api.client.get("/sites", headers=api.auth(ADA))).json()
        assert [(s["name"], s["public_key"]) for s in sites] == [
            ("alpha", shared_stack.public_keys["alpha"])
        ]
        await pipeline_works(api, SITE_OWNERS)
