"""/sites and GET /apps against the real log and read models."""

from __future__ import annotations

import pytest

from lodestream.infra.nats.auth import new_user_seed, user_public_key
from lodestream.schemas.ids import derived_id
from lodestream.schemas.resources import App, AppParameter
from tests.fixtures.api import ApiHarness


async def test_a_registered_site_is_listed(api: ApiHarness) -> None:
    response = await api.client.post(
        "/sites",
        json={"name": "theta", "description": "ALCF Theta"},
        params={"wait": "true"},
        headers=api.user("alice"),
    )

    assert response.status_code == 201
    assert response.json() == {"name": "theta", "seq": response.json()["seq"]}
    sites = (await api.client.get("/sites", headers=api.user("alice"))).json()
    assert [(s["name"], s["description"]) for s in sites] == [("theta", "ALCF Theta")]


async def test_the_site_event_is_owned_by_the_caller(api: ApiHarness) -> None:
    seq = await api.register_site("alice", "theta")

    stored = await api.js.get_msg("EVENTS", seq=seq)

    assert stored.subject == f"evt.theta.site.{derived_id('site', 'theta')}.registered"
    assert stored.data is not None
    assert b'"actor":"user:alice"' in stored.data
    assert b'"owner":"alice"' in stored.data


async def test_a_taken_name_is_a_conflict_without_naming_the_owner(api: ApiHarness) -> None:
    await api.register_site("alice", "theta")
    count = await api.message_count()

    theirs = await api.client.post("/sites", json={"name": "theta"}, headers=api.user("bob"))
    mine = await api.client.post("/sites", json={"name": "theta"}, headers=api.user("alice"))

    assert theirs.status_code == 409
    assert theirs.json()["error"]["message"] == "site name 'theta' is taken; choose another name"
    assert "alice" not in theirs.text
    assert mine.status_code == 409
    assert mine.json()["error"]["message"] == "site 'theta' is already registered to you"
    assert await api.message_count() == count


@pytest.mark.parametrize("name", ["Theta", "the.ta", "-theta", "theta-", "t" * 41, "", "a b"])
async def test_a_name_that_is_not_a_slug_is_invalid(api: ApiHarness, name: str) -> None:
    count = await api.message_count()

    response = await api.client.post("/sites", json={"name": name}, headers=api.user("alice"))

    assert response.status_code == 422
    error = response.json()["error"]
    assert error["code"] == "invalid"
    assert error["message"] == (
        f"invalid request: body.name: invalid site name {name!r}: "
        "use 1-40 lowercase letters, digits and inner hyphens"
    )
    assert await api.message_count() == count


async def test_apps_of_the_callers_sites(api: ApiHarness) -> None:
    await api.register_site("alice", "theta")
    await api.register_site("alice", "polaris")
    await api.register_app(
        App(site="theta", name="sim", description="MD", parameters={"steps": AppParameter()})
    )
    await api.register_app(App(site="polaris", name="fit"))
    alice = api.user("alice")

    every = (await api.client.get("/apps", headers=alice)).json()
    theta = (await api.client.get("/apps", params={"site": "theta"}, headers=alice)).json()

    assert [(a["site"], a["name"]) for a in every] == [("polaris", "fit"), ("theta", "sim")]
    assert theta[0]["parameters"] == {"steps": {"required": True, "default": None, "help": ""}}
    assert theta[0]["description"] == "MD"


async def test_a_change_to_a_site_the_read_model_has_not_caught_up_with_is_a_conflict(
    api: ApiHarness,
) -> None:
    """A second removal before the first is projected would be an illegal event on the log."""
    await api.register_site("alice", "theta")
    await api.projector.stop()
    alice = api.user("alice")
    key = {"public_key": user_public_key(new_user_seed())}

    first = await api.client.delete("/sites/theta", headers=alice)
    count = await api.message_count()
    again = await api.client.delete("/sites/theta", headers=alice)
    rebind = await api.client.put("/sites/theta/key", json=key, headers=alice)

    assert first.status_code == 200, first.text
    for response in (again, rebind):
        assert response.status_code == 409, response.text
        assert response.json()["error"]["message"] == (
            "site 'theta' changed meanwhile (the change may not be visible yet); retry"
        )
    assert await api.message_count() == count
