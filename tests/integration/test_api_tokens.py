"""``/users/me/tokens``: a user's tokens listed by id (never the secret), and revoked: a
revoked token is refused from its next request on, the others keep working."""

from __future__ import annotations

import asyncio
import time

from lodestream.services.api.users import create_user
from tests.fixtures.api import ApiHarness

CUT_OFF_S = 2.0


async def test_tokens_are_listed_by_id_and_one_revoked_is_cut_off(api: ApiHarness) -> None:
    first = api.user("ada")
    second_token = create_user(api.settings.database_url, "ada")
    second = {"Authorization": f"Bearer {second_token}"}
    api.user("bob")

    listed = (await api.client.get("/users/me/tokens", headers=first)).json()
    assert len(listed) == 2
    assert [t["current"] for t in listed] == [True, False]
    assert all(len(t["id"]) == 12 and t["id"] not in second_token for t in listed)
    assert api.tokens["ada"] not in str(listed)

    revoked = await api.client.delete(f"/users/me/tokens/{listed[1]['id']}", headers=first)
    assert revoked.status_code == 200, revoked.text
    started = time.monotonic()
    while (await api.client.get("/users/me", headers=second)).status_code != 401:
        assert time.monotonic() - started < CUT_OFF_S, "the revoked token still works"
        await asyncio.sleep(0.05)
    assert (await api.client.get("/users/me", headers=first)).status_code == 200
    assert [t["id"] for t in (await api.client.get("/users/me/tokens", headers=first)).json()
            ] == [listed[0]["id"]]  # fmt: skip

    # Another user's token is not found by its id; an id that is not one is a 422.
    bobs = (await api.client.get("/users/me/tokens", headers=api.user("bob"))).json()[0]["id"]
    assert (await api.client.delete(f"/users/me/tokens/{bobs}", headers=first)).status_code == 404
    assert (await api.client.delete("/users/me/tokens/xyz", headers=first)).status_code == 422
