"""One public key, one principal, through the HTTP API with two users' tokens (issue 29, 3).

A key bound twice made nats-server refuse the whole authorization, and from then on no
credential change took effect for anyone; the API must refuse the second binding instead.
"""

from __future__ import annotations

import asyncio

import httpx
import pytest
from sqlalchemy import create_engine, select

from lodestream.infra.postgres.migrate import sqlalchemy_url
from lodestream.infra.postgres.tables import bound_keys, monitoring_keys
from lodestream.schemas.nkey import new_user_seed, user_public_key
from lodestream.services.api.main import create_app
from tests.fixtures.api import ApiHarness, api_client, api_settings
from tests.fixtures.nats import RunningNats

KEY_PATH = "/users/me/monitoring-key"


def new_key() -> str:
    return user_public_key(new_user_seed())


async def post_site(api: ApiHarness, user: str, name: str, key: str) -> httpx.Response:
    return await api.client.post(
        "/sites", json={"name": name, "public_key": key}, params={"wait": "true"},
        headers=api.user(user),
    )  # fmt: skip


async def put_monitor(api: ApiHarness, user: str, key: str) -> httpx.Response:
    return await api.client.put(KEY_PATH, json={"public_key": key}, headers=api.user(user))


def bindings(database_url: str) -> set[tuple[str, str, str]]:
    engine = create_engine(sqlalchemy_url(database_url))
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                select(bound_keys.c.public_key, bound_keys.c.kind, bound_keys.c.holder)
            )
            return {(str(k), str(kind), str(h)) for k, kind, h in rows}
    finally:
        engine.dispose()


async def test_another_users_site_key_is_refused_as_a_monitoring_key(
    api: ApiHarness, database_url: str
) -> None:
    key = new_key()
    assert (await post_site(api, "ada", "alpha", key)).status_code == 201

    refused = await put_monitor(api, "bob", key)

    assert refused.status_code == 409, refused.text
    assert "already bound to a site" in refused.json()["error"]["message"]
    assert (await api.client.get(KEY_PATH, headers=api.user("bob"))).json()["public_key"] is None
    assert bindings(database_url) == {(key, "site", "alpha")}
    # The owner of the site is refused too, told which of its sites holds the key.
    own = await put_monitor(api, "ada", key)
    assert own.status_code == 409
    assert "your site 'alpha'" in own.json()["error"]["message"]


async def test_a_site_with_a_key_already_bound_is_refused_and_not_registered(
    api: ApiHarness, database_url: str
) -> None:
    site_key, monitor_key = new_key(), new_key()
    assert (await post_site(api, "ada", "alpha", site_key)).status_code == 201
    assert (await put_monitor(api, "ada", monitor_key)).status_code == 200

    for key, why in ((site_key, "a site"), (monitor_key, "monitoring credential")):
        refused = await post_site(api, "bob", "beta", key)
        assert refused.status_code == 409, refused.text
        assert why in refused.json()["error"]["message"]
    assert (await api.client.get("/sites", headers=api.user("bob"))).json() == []
    # Rebinding an existing site to a bound key is refused the same way.
    assert (await post_site(api, "bob", "beta", new_key())).status_code == 201
    rebind = await api.client.put(
        "/sites/beta/key", json={"public_key": site_key}, headers=api.user("bob")
    )
    assert rebind.status_code == 409, rebind.text
    assert {(k, kind) for k, kind, _ in bindings(database_url)} >= {
        (site_key, "site"), (monitor_key, "monitor")
    }  # fmt: skip


async def test_of_concurrent_bindings_of_one_key_exactly_one_wins(
    api: ApiHarness, database_url: str
) -> None:
    key = new_key()
    users = [f"user{i}" for i in range(8)]
    for user in users:
        api.user(user)  # tokens first: the race is between the bindings only
    calls = [put_monitor(api, user, key) for user in users[:4]]
    calls += [post_site(api, user, f"site{i}", key) for i, user in enumerate(users[4:])]

    responses = await asyncio.gather(*calls)

    codes = sorted(r.status_code for r in responses)
    assert codes.count(409) == len(users) - 1, [r.text for r in responses]
    assert len([c for c in codes if c in {200, 201}]) == 1
    assert len([b for b in bindings(database_url) if b[0] == key]) == 1


async def test_a_binding_whose_change_did_not_land_leaves_the_key_free(
    api: ApiHarness, database_url: str
) -> None:
    await api.register_site("ada", "alpha")  # the name is taken, without a key
    key = new_key()

    taken = await post_site(api, "bob", "alpha", key)

    assert taken.status_code == 409
    assert "is taken" in taken.json()["error"]["message"]
    assert bindings(database_url) == set()
    assert (await post_site(api, "bob", "beta", key)).status_code == 201


async def test_replacing_and_removing_frees_the_old_keys(
    api: ApiHarness, database_url: str
) -> None:
    first, second, site_key = new_key(), new_key(), new_key()
    assert (await put_monitor(api, "ada", first)).status_code == 200
    assert (await put_monitor(api, "ada", second)).status_code == 200
    assert (await post_site(api, "ada", "alpha", site_key)).status_code == 201

    assert (await put_monitor(api, "bob", first)).status_code == 200  # ada's old key is free
    removed = await api.client.delete("/sites/alpha", headers=api.user("ada"))
    assert removed.status_code == 200, removed.text
    assert (await put_monitor(api, "carl", site_key)).status_code == 200

    engine = create_engine(sqlalchemy_url(database_url))
    try:
        with engine.connect() as conn:
            stored = dict(
                conn.execute(
                    select(monitoring_keys.c.user_name, monitoring_keys.c.public_key)
                ).all()
            )
    finally:
        engine.dispose()
    assert stored == {"ada": second, "bob": first, "carl": site_key}
    assert bindings(database_url) == {
        (second, "monitor", "ada"), (first, "monitor", "bob"), (site_key, "monitor", "carl")
    }  # fmt: skip


@pytest.fixture
def nats_server(secure_nats: RunningNats) -> RunningNats:
    return secure_nats


async def test_the_control_planes_own_key_is_refused(
    nats_server: RunningNats, database_url: str, api: ApiHarness
) -> None:
    control = new_key()
    settings = api_settings(nats_server, database_url, control_public_keys=[control])
    async with api_client(create_app(settings)) as client:
        headers = api.user("mallory")
        for response in (
            await client.put(KEY_PATH, json={"public_key": control}, headers=headers),
            await client.post("/sites", json={"name": "gamma", "public_key": control},
                              headers=headers),
        ):  # fmt: skip
            assert response.status_code == 409, response.text
            assert "control plane" in response.json()["error"]["message"]
    assert bindings(database_url) == set()
