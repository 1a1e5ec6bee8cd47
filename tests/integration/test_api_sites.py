"""/sites and GET /apps against the real log and read models."""

from __future__ import annotations

import pytest

from lodestream.eventlog import EventLog
from lodestream.schemas.events import ScalerBacklog, ScalerDecided
from lodestream.schemas.events.scaler import (
    ScalerBacklogData,
    ScalerDecidedData,
    ScalerLimits,
    scaler_id,
)
from lodestream.schemas.ids import derived_id
from lodestream.schemas.nkey import new_user_seed, user_public_key
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
    assert theta[0]["parameters"] == {
        "steps": {"required": True, "default": None, "help": "", "type": None}
    }
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


async def test_a_sites_elastic_queue_shows_its_backlog_and_latest_decisions(
    api: ApiHarness,
) -> None:
    await api.register_site("alice", "theta")
    alice = api.user("alice")
    empty = await api.client.get("/sites/theta/scaler", headers=alice)
    assert empty.status_code == 200, empty.text
    assert empty.json() == {"site": "theta", "backlog": None, "backlog_at": None, "decisions": []}

    log = EventLog(api.js)
    backlog = ScalerBacklog.create(
        site="theta", aggregate_id=scaler_id("theta"), actor="controller:main",
        data=ScalerBacklogData(as_of_seq=3, runnable_jobs=4, node_footprint=2.0),
    )  # fmt: skip
    await log.append(backlog, expect=None)
    last = 0
    for reason in ("first", "second", "third"):
        decided = ScalerDecided.create(
            site="theta", aggregate_id=scaler_id("theta"), actor="site:theta",
            data=ScalerDecidedData(backlog_id=backlog.id, backlog=backlog.data,
                                   limits=ScalerLimits(max_nodes=2), reason=reason),
        )  # fmt: skip
        last = (await log.append(decided, expect=None)).seq
    await api.wait_projected(last)

    body = (await api.client.get("/sites/theta/scaler", params={"limit": 2}, headers=alice)).json()
    assert body["backlog"]["runnable_jobs"] == 4
    assert [d["reason"] for d in body["decisions"]] == ["third", "second"]
    newest = body["decisions"][0]
    assert (newest["seq"], newest["backlog_id"]) == (last, str(backlog.id))
    assert newest["backlog"]["node_footprint"] == 2.0
    assert newest["limits"]["max_nodes"] == 2
    assert (newest["windows"], newest["requests"], newest["deletions"]) == (None, [], [])

    theirs = await api.client.get("/sites/theta/scaler", headers=api.user("bob"))
    assert theirs.status_code == 404
