"""Bearer tokens: only the digest is stored; missing, unknown and revoked tokens get 401."""

from __future__ import annotations

import pytest
from sqlalchemy import Engine, select

from lodestream.infra.postgres.tables import api_tokens
from lodestream.services.api.deps import token_hash
from lodestream.services.api.users import check_user_name, create_user, revoke_tokens
from tests.fixtures.api import ApiHarness

PROTECTED = ["/jobs", "/sites", "/apps", "/events", f"/jobs/{'0' * 8}-0000-0000-0000-{'0' * 12}"]


@pytest.mark.parametrize("path", PROTECTED)
@pytest.mark.parametrize(
    ("headers", "message"),
    [
        ({}, "missing credentials: send 'Authorization: Bearer <token>'"),
        ({"Authorization": "Basic YWxpY2U6cHc="}, "missing credentials"),
        ({"Authorization": "Bearer not-a-token"}, "invalid or revoked token"),
    ],
)
async def test_requests_without_a_valid_token_are_unauthorized(
    api: ApiHarness, path: str, headers: dict[str, str], message: str
) -> None:
    response = await api.client.get(path, headers=headers)

    assert response.status_code == 401
    assert response.headers["www-authenticate"] == "Bearer"
    error = response.json()["error"]
    assert error["code"] == "unauthorized"
    assert error["message"].startswith(message)


async def test_a_revoked_token_is_unauthorized(api: ApiHarness) -> None:
    headers = api.user("alice")
    assert (await api.client.get("/sites", headers=headers)).status_code == 200

    assert revoke_tokens(api.settings.database_url, "alice") == 1

    assert (await api.client.get("/sites", headers=headers)).status_code == 401
    fresh = create_user(api.settings.database_url, "alice")
    response = await api.client.get("/sites", headers={"Authorization": f"Bearer {fresh}"})
    assert response.status_code == 200


async def test_a_submission_without_a_token_appends_nothing(api: ApiHarness) -> None:
    count = await api.message_count()
    body = {"jobs": [{"site": "theta", "app": "sim", "workdir": "w"}]}

    response = await api.client.post("/jobs", json=body)

    assert response.status_code == 401
    assert await api.message_count() == count


async def test_only_the_digest_is_stored(sa_engine: Engine, database_url: str) -> None:
    token = create_user(database_url, "alice")

    with sa_engine.connect() as conn:
        stored = conn.execute(select(api_tokens.c.token_hash, api_tokens.c.user_name)).all()

    assert [(row.token_hash, row.user_name) for row in stored] == [(token_hash(token), "alice")]
    assert token not in str(stored)


@pytest.mark.parametrize("name", ["", "a:b", "a b", "-a", "x" * 121, "user/1"])
def test_user_names_are_actor_safe(name: str) -> None:
    with pytest.raises(ValueError, match="invalid user name"):
        check_user_name(name)


async def test_health_needs_no_token(api: ApiHarness) -> None:
    assert (await api.client.get("/healthz")).json() == {"status": "ok", "credentials": None}
    assert (await api.client.get("/readyz")).status_code == 200


async def test_an_unknown_route_has_the_common_error_body(api: ApiHarness) -> None:
    response = await api.client.get("/nope")

    assert response.status_code == 404
    assert response.json() == {
        "error": {"code": "not_found", "message": "Not Found", "details": None}
    }
