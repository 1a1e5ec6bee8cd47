"""The SDK's typed reads and its async client, against a scripted HTTP transport.

The async client runs ``LodeClient``'s own method bodies against answers it fetched with
``await`` (``client/asyncclient.py``); these tests pin that it sends what the sync client
sends, reads the answers the same way, and raises the same errors. Against a real API:
``tests/integration/test_sdk_async.py``.
"""

from __future__ import annotations

import inspect
import subprocess
import sys
import uuid
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from lodestream.client.asyncclient import AsyncLodeClient
from lodestream.client.config import ClientConfig
from lodestream.client.errors import ApiError, JobIdUnresolved
from lodestream.client.sdk import App, Job, LodeClient

CONFIG = ClientConfig(api_url="http://api.test", token="t")
JOB_ID = "0190aaaa-0000-7000-8000-00000000beef"
JOB: dict[str, Any] = {
    "id": JOB_ID, "site": "alpha", "owner": "ada", "app": "sim", "state": "READY",
    "workdir": "w", "parameters": {"steps": 5, "xs": [1, 2]}, "tags": {}, "data": {},
    "resources": {}, "transfers": {}, "parent_ids": [], "lease_seq": None,
    "lease_session": None, "attempts": 0, "return_code": None, "last_error": None,
    "created_seq": 1, "last_seq": 2, "created_at": "2025-01-02T00:00:00Z",
    "updated_at": "2025-01-02T00:00:01Z", "stage_times": {},
}  # fmt: skip
APP: dict[str, Any] = {
    "site": "alpha", "name": "sim", "description": "", "parameters": {"steps": {"type": "int"}},
    "transfers": {}, "python": True, "updated_at": "2025-01-02T00:00:00Z",
}  # fmt: skip


def api(requests: list[httpx.Request]) -> Callable[[httpx.Request], httpx.Response]:
    """A tiny API: two pages of jobs, one job, its id by prefix, the apps, and 404s."""

    def handle(request: httpx.Request) -> httpx.Response:
        requests.append(request)
        path, params = request.url.path, request.url.params
        if path == "/jobs" and "id_prefix" in params:
            return httpx.Response(200, json={"items": [JOB], "next_offset": None})
        if path == "/jobs" and "id_suffix" in params:
            return httpx.Response(200, json={"items": [], "next_offset": None})
        if path == "/jobs":
            offset = int(params["offset"])
            return httpx.Response(200, json={"items": [JOB], "next_offset": offset + 1
                                             if offset == 0 else None})  # fmt: skip
        if path == f"/jobs/{JOB_ID}":
            return httpx.Response(200, json={**JOB, "transfer_items": []})
        if path == "/apps":
            return httpx.Response(200, json=[APP])
        return httpx.Response(404, json={"error": {"code": "not_found", "message": "no such"}})

    return handle


def sync_client(requests: list[httpx.Request]) -> LodeClient:
    client = LodeClient(CONFIG)
    client._http = httpx.Client(
        base_url=CONFIG.api_url, transport=httpx.MockTransport(api(requests))
    )
    return client


def async_client(requests: list[httpx.Request]) -> AsyncLodeClient:
    client = AsyncLodeClient(CONFIG)
    transport = httpx.MockTransport(api(requests))
    client._http = httpx.AsyncClient(base_url=CONFIG.api_url, transport=transport)
    return client


def test_typed_reads_return_the_apis_models() -> None:
    with sync_client([]) as lode:
        jobs = list(lode.jobs(state="READY"))
        assert [type(j) for j in jobs] == [Job, Job]
        assert jobs[0].parameters == {"steps": 5, "xs": [1, 2]}
        assert lode.job(JOB_ID).id == uuid.UUID(JOB_ID)
        assert lode.apps() == [App.model_validate(APP)]


async def test_the_async_client_sends_what_the_sync_one_sends() -> None:
    sent_sync: list[httpx.Request] = []
    sent_async: list[httpx.Request] = []
    with sync_client(sent_sync) as lode:
        expected = (lode.get_job(JOB_ID), lode.resolve_job_id("beef"), lode.job(JOB_ID))
    async with async_client(sent_async) as lode_async:
        got = (
            await lode_async.get_job(JOB_ID),
            await lode_async.resolve_job_id("beef"),  # two requests, one answer
            await lode_async.job(JOB_ID),
        )
        assert [job.id async for job in lode_async.jobs()] == [uuid.UUID(JOB_ID)] * 2
    assert got == expected
    assert [str(r.url) for r in sent_async[: len(sent_sync)]] == [str(r.url) for r in sent_sync]


async def test_the_async_client_raises_what_the_sync_one_raises() -> None:
    async with async_client([]) as lode:
        with pytest.raises(ApiError) as info:
            await lode.get_batch_job("nope")
        assert (info.value.status, info.value.code) == (404, "not_found")
        with pytest.raises(JobIdUnresolved, match="neither a job id"):
            await lode.resolve_job_id("zz")


def test_the_async_client_has_every_method_of_the_sync_one() -> None:
    public = {n for n, _ in inspect.getmembers(LodeClient, inspect.isfunction) if n[0] != "_"}
    missing = {n for n in public - {"close", "from_config"} if not hasattr(AsyncLodeClient, n)}
    assert not missing
    for name in ("get_job", "job", "submit_jobs"):
        assert inspect.iscoroutinefunction(getattr(AsyncLodeClient(CONFIG), name))


def test_the_sdk_needs_no_server_dependency() -> None:
    code = (
        "import sys; import lodestream.client.sdk as sdk; sdk.AsyncLodeClient; "
        "print(sorted(m for m in ('fastapi', 'sqlalchemy', 'uvicorn', 'psycopg', 'alembic') "
        "if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


async def test_a_replayed_method_that_changes_its_requests_is_refused() -> None:
    calls = iter(["/healthz", "/readyz"])

    def fickle(client: LodeClient) -> Any:
        return client._request("GET", next(calls)), client._request("GET", "/healthz")

    async with async_client([]) as lode:
        with pytest.raises(RuntimeError, match="not deterministic"):
            await lode.call(fickle)
