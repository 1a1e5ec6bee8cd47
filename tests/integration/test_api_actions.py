"""POST /jobs/{id}/kill and /reset: the reason is optional, a malformed body is still refused."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from lodestream.client.config import ClientConfig
from lodestream.client.sdk import LodeClient
from lodestream.schemas.events import JobKilled as Killed
from lodestream.schemas.events import JobReset as Reset
from lodestream.services.api.routes.actions import DEFAULT_REASONS, ActionBody
from tests.fixtures.api import ApiHarness

SITE = "theta"
NO_BODY: dict[str, Any] = {}


@pytest.fixture
async def alice(api: ApiHarness) -> dict[str, str]:
    await api.register_site("alice", SITE)
    return api.user("alice")


async def new_job(api: ApiHarness) -> str:
    response = await api.submit("alice", [{"site": SITE, "app": "sim", "workdir": "runs/1"}])
    assert response.status_code == 201, response.text
    job_id: str = response.json()["jobs"][0]["id"]
    return job_id


async def reasons(api: ApiHarness, headers: dict[str, str], job_id: str) -> list[tuple[str, str]]:
    """The job's kill and reset events with their reasons, once the projector has them."""
    info = await api.js.stream_info("EVENTS")
    await api.wait_projected(int(info.state.last_seq))
    events = (await api.client.get(f"/jobs/{job_id}/events", headers=headers)).json()
    return [(e["type"], e["data"]["reason"]) for e in events if e["type"] != "job.created"]


@pytest.mark.parametrize(
    ("request_body", "expected"),
    [
        (NO_BODY, None),
        ({"json": {}}, None),
        ({"json": {"reason": ""}}, None),
        ({"json": None}, None),  # JSON null: as if there were no body
        ({"json": {"reason": "wrong parameters"}}, "wrong parameters"),
    ],
    ids=["no body", "empty object", "empty reason", "null", "with reason"],
)
async def test_kill_and_reset_take_an_optional_reason(
    api: ApiHarness, alice: dict[str, str], request_body: dict[str, Any], expected: str | None
) -> None:
    job_id = await new_job(api)

    killed = await api.client.post(f"/jobs/{job_id}/kill", headers=alice, **request_body)
    assert killed.status_code == 200, killed.text
    assert killed.json()["state"] == "KILLED"
    await api.wait_projected(killed.json()["seq"])  # reset is judged on the read model
    reset = await api.client.post(f"/jobs/{job_id}/reset", headers=alice, **request_body)
    assert reset.status_code == 200, reset.text
    assert reset.json()["state"] == "READY"

    assert await reasons(api, alice, job_id) == [
        ("job.killed", expected or DEFAULT_REASONS[Killed]),
        ("job.reset", expected or DEFAULT_REASONS[Reset]),
    ]


@pytest.mark.parametrize(
    ("request_body", "where"),
    [
        ({"content": b"{not json", "headers": {"content-type": "application/json"}}, "body"),
        ({"json": {"reason": 5}}, "body.reason"),
        ({"json": {"reason": "a\x00b"}}, "body.reason"),
        ({"json": {"why": "no field of that name"}}, "body.why"),
        ({"json": ["a list"]}, "body"),
        ({"json": "a string"}, "body"),
    ],
    ids=["not json", "reason not text", "reason with NUL", "unknown field", "list", "string"],
)
async def test_a_malformed_body_is_still_refused(
    api: ApiHarness, alice: dict[str, str], request_body: dict[str, Any], where: str
) -> None:
    job_id = await new_job(api)
    before = await api.message_count()
    headers = {**alice, **request_body.pop("headers", {})}

    for action in ("kill", "reset"):
        response = await api.client.post(
            f"/jobs/{job_id}/{action}", headers=headers, **request_body
        )
        assert response.status_code == 422, response.text
        assert response.json()["error"]["message"].startswith(f"invalid request: {where}")
    assert await api.message_count() == before


def test_the_openapi_document_says_the_body_is_optional(api: ApiHarness) -> None:
    document = api.app.openapi()
    for action in ("kill", "reset"):
        body = document["paths"][f"/jobs/{{job_id}}/{action}"]["post"]["requestBody"]
        assert body.get("required", False) is False
        schema = body["content"]["application/json"]["schema"]
        assert {"$ref": "#/components/schemas/ActionBody"} in schema["anyOf"]
        assert "Optional" in body.get("description", schema.get("description", ""))
    assert ActionBody.model_fields["reason"].default == ""


class ThroughTheApp(httpx.BaseTransport):
    """The synchronous SDK, called from a worker thread, served by the in-process API app."""

    def __init__(self, client: httpx.AsyncClient, loop: asyncio.AbstractEventLoop) -> None:
        self._client = client
        self._loop = loop

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        async def forward() -> httpx.Response:
            response = await self._client.request(
                request.method, str(request.url), headers=request.headers, content=request.read()
            )
            return httpx.Response(
                response.status_code, headers=response.headers, content=response.content
            )

        return asyncio.run_coroutine_threadsafe(forward(), self._loop).result(30)


async def test_the_sdk_kills_and_resets_with_and_without_a_reason(
    api: ApiHarness, alice: dict[str, str]
) -> None:
    quiet, told = await new_job(api), await new_job(api)
    sdk = LodeClient(ClientConfig(api_url="http://api", token=alice["Authorization"][7:]))
    sdk._http = httpx.Client(
        base_url="http://api",
        headers={"Authorization": alice["Authorization"]},
        transport=ThroughTheApp(api.client, asyncio.get_running_loop()),
    )
    with sdk:
        for job_id, reason in ((quiet, ""), (told, "duplicate")):
            killed = await asyncio.to_thread(sdk.kill_job, job_id, reason)
            assert killed["state"] == "KILLED"
            await api.wait_projected(killed["seq"])
        assert (await asyncio.to_thread(sdk.reset_job, quiet))["state"] == "READY"
        assert (await asyncio.to_thread(sdk.reset_job, told, "try again"))["state"] == "READY"

    assert await reasons(api, alice, quiet) == [
        ("job.killed", DEFAULT_REASONS[Killed]),
        ("job.reset", DEFAULT_REASONS[Reset]),
    ]
    assert await reasons(api, alice, told) == [
        ("job.killed", "duplicate"),
        ("job.reset", "try again"),
    ]
