"""The API against its own OpenAPI document (schemathesis), and one user against another's data.

Two users each own a site, an app and a job. The fuzz run is authenticated as
bob and mixes alice's ids into the path parameters: every response must be
documented, match its schema and never be a 5xx, and nothing of alice's may
come back to bob. The app is served by uvicorn on a loopback port in the
test's event loop; schemathesis (synchronous, Hypothesis-driven) calls it from
a worker thread.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Final

import hypothesis
import nkeys
import pytest
import schemathesis
from hypothesis import HealthCheck, given
from hypothesis import strategies as st
from hypothesis.strategies import SearchStrategy
from schemathesis.checks import not_a_server_error
from schemathesis.core.result import Ok
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)
from schemathesis.specs.openapi.formats import unregister_string_format
from sqlalchemy import Engine, text

from lodestream.schemas.events.xfer import TransferSubmittedData
from lodestream.schemas.ids import uuid7
from lodestream.schemas.nkey import USER_PUBLIC_KEY_FORMAT, new_user_seed, user_public_key
from lodestream.schemas.resources import App, AppParameter
from lodestream.schemas.subjects import EVENTS_STREAM
from tests.fixtures.api import ApiHarness, served
from tests.support.staging import report, request

Case = schemathesis.Case[Any]
Operation = schemathesis.APIOperation[Any, Any, Any, Any]


def no_server_error(
    ctx: schemathesis.CheckContext, response: schemathesis.Response, case: Case
) -> bool | None:
    """``not_a_server_error``, but for the documented 504 of a wait the caller itself cut short."""
    query = case.query or {}
    asked = str(query.get("wait")).lower() == "true" and "wait_timeout" in query
    if response.status_code == 504 and asked and response.json()["error"]["code"] == "timeout":
        return None
    return not_a_server_error(ctx, response, case)


CHECKS: Final = [
    no_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]
STREAMING: Final = frozenset({"/events/stream"})
MAX_EXAMPLES: Final = 25  # per operation and flavour of path parameters: CI-sized
ALICE_MARKER: Final = "alice-private-7f3a"  # in alice's job: must never reach bob


@dataclass(frozen=True)
class Owner:
    name: str
    site: str
    job: str
    headers: dict[str, str]


@dataclass(frozen=True)
class World:
    alice: Owner
    bob: Owner


async def own(api: ApiHarness, name: str, site: str, **job: Any) -> Owner:
    """A user with a site, an app ``sim`` there and one job of it with a transfer item in
    flight, all projected."""
    await api.register_site(name, site)
    await api.register_app(App(site=site, name="sim", parameters={"n": AppParameter()}))
    spec = {"site": site, "app": "sim", "workdir": f"{name}/1", "parameters": {"n": "1"}, **job}
    response = await api.submit(name, [spec])
    assert response.status_code == 201, response.text
    job_id = response.json()["jobs"][0]["id"]
    remote = {"location": "archive", "path": f"/{name}/in"}
    item = await request(api.js, site, job_id, "input", "in", remote, uuid7())
    await api.wait_projected(await report(api.js, item, TransferSubmittedData(task_id="t-1")))
    return Owner(name, site, job_id, api.user(name))


@pytest.fixture
async def world(api: ApiHarness) -> World:
    alice = await own(api, "alice", "alice-site", tags={"secret": ALICE_MARKER})
    bob = await own(api, "bob", "bob-site")
    return World(alice, bob)


# --- no cross-user read: one test per route -------------------------------------------------


async def test_bob_lists_only_his_jobs(api: ApiHarness, world: World) -> None:
    for params in ({}, {"tag": f"secret:{ALICE_MARKER}"}):
        response = await api.client.get("/jobs", params=params, headers=world.bob.headers)
        assert response.status_code == 200
        ids = [job["id"] for job in response.json()["items"]]
        assert ids == ([world.bob.job] if not params else [])
    # Alice's site named in a listing: 404, as a submission to it would be.
    foreign = await api.client.get(
        "/jobs", params={"site": world.alice.site}, headers=world.bob.headers
    )
    assert foreign.status_code == 404
    assert ALICE_MARKER not in foreign.text


@pytest.mark.parametrize("suffix", ["", "/events"])
async def test_bob_cannot_read_alices_job(api: ApiHarness, world: World, suffix: str) -> None:
    response = await api.client.get(f"/jobs/{world.alice.job}{suffix}", headers=world.bob.headers)
    mine = await api.client.get(f"/jobs/{world.bob.job}{suffix}", headers=world.bob.headers)

    assert response.status_code == 404
    assert response.json()["error"]["message"] == f"job {world.alice.job} not found"
    assert mine.status_code == 200


async def test_bob_feed_holds_only_his_events(api: ApiHarness, world: World) -> None:
    response = await api.client.get("/events", headers=world.bob.headers)

    assert response.status_code == 200
    assert {e["job_id"] for e in response.json()["items"]} == {world.bob.job}
    assert ALICE_MARKER not in response.text


async def test_bob_lists_only_his_sites(api: ApiHarness, world: World) -> None:
    for params in ({}, {"include_removed": "true"}):
        response = await api.client.get("/sites", params=params, headers=world.bob.headers)
        assert [s["name"] for s in response.json()] == [world.bob.site]


async def test_bob_lists_only_his_apps(api: ApiHarness, world: World) -> None:
    every = await api.client.get("/apps", headers=world.bob.headers)
    theirs = await api.client.get(
        "/apps", params={"site": world.alice.site}, headers=world.bob.headers
    )

    assert [(a["site"], a["name"]) for a in every.json()] == [(world.bob.site, "sim")]
    assert theirs.status_code == 404


async def test_bob_sees_only_his_transfers(api: ApiHarness, world: World) -> None:
    bobs = f"/sites/{world.bob.site}/transfers"
    mine = await api.client.get(bobs, headers=world.bob.headers)
    theirs = await api.client.get(f"/sites/{world.alice.site}/transfers", headers=world.bob.headers)
    job = await api.client.get(f"/jobs/{world.bob.job}", headers=world.bob.headers)

    assert [i["job_id"] for i in mine.json()] == [world.bob.job]
    assert [i["job_id"] for i in job.json()["transfer_items"]] == [world.bob.job]
    assert theirs.status_code == 404
    other = await api.client.get(bobs, params={"job_id": world.alice.job, "state": "submitted"},
                                 headers=world.bob.headers)  # fmt: skip
    assert other.json() == []


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("POST", "/jobs/{job}/kill", {"reason": "mine now"}),
        ("POST", "/jobs/{job}/reset", {}),
        ("PUT", "/sites/{site}/key", {"public_key": None}),
        ("DELETE", "/sites/{site}", None),
    ],
)
async def test_bob_cannot_change_alices_things(
    api: ApiHarness, world: World, method: str, path: str, body: dict[str, Any] | None
) -> None:
    if body is not None and "public_key" in body:
        body = {"public_key": user_public_key(new_user_seed())}
    before = await api.message_count()
    url = path.format(job=world.alice.job, site=world.alice.site)

    response = await api.client.request(method, url, json=body, headers=world.bob.headers)

    assert response.status_code == 404, response.text
    assert await api.message_count() == before


# --- fuzzing ----------------------------------------------------------------------------------


@contextlib.contextmanager
def nkey_format() -> Iterator[None]:
    """Valid user keys for ``format: nkey-user`` (random 56 letters fail the checksum)."""
    keys = st.binary(min_size=32, max_size=32).map(
        lambda raw: user_public_key(nkeys.encode_seed(raw, nkeys.PREFIX_BYTE_USER))
    )
    schemathesis.openapi.format(USER_PUBLIC_KEY_FORMAT, keys)
    try:
        yield
    finally:
        unregister_string_format(USER_PUBLIC_KEY_FORMAT)


def fuzz(document: dict[str, Any], base_url: str, world: World) -> None:
    """Every operation as bob: random, bob's and alice's ids in its path; removals last."""
    schema = schemathesis.openapi.from_dict(document, config=schemathesis.Config())
    operations = sorted(
        (result.ok() for result in schema.get_all_operations() if isinstance(result, Ok)),
        key=lambda operation: operation.method.upper() == "DELETE",
    )
    assert len(operations) == sum(len(item) for item in document["paths"].values())
    # A stream's body never ends, so no response could be validated: test_api_stream.py
    # covers its refusals, scoping and resume.
    operations = [op for op in operations if op.path not in STREAMING]
    for operation in operations:
        for strategy in strategies(operation, world):
            _fuzzer(strategy, base_url, world)()


def strategies(operation: Operation, world: World) -> Iterator[SearchStrategy[Case]]:
    names = {parameter.name for parameter in operation.path_parameters}
    yield operation.as_strategy()
    for owner in (world.bob, world.alice) if names else ():
        fixed = {"job_id": owner.job, "name": owner.site}
        yield operation.as_strategy(path_parameters={k: v for k, v in fixed.items() if k in names})
    if (operation.method.upper(), operation.path) == ("POST", "/jobs"):
        # Random jobs that pass the catalog checks reach the log: whatever is accepted there
        # must be storable (test_fuzz_the_api_as_bob checks nothing was quarantined).
        yield operation.as_strategy().map(lambda case: _at_site(case, world.bob.site))


def _at_site(case: Case, site: str) -> Case:
    body: dict[str, list[dict[str, Any]]] = case.body  # type: ignore[assignment]
    for job in body["jobs"]:
        value = next(iter(job.get("parameters", {}).values()), "1")
        job.update(site=site, app="sim", parameters={"n": value}, transfers={}, parent_ids=[])
    return case


def _fuzzer(strategy: SearchStrategy[Case], base_url: str, world: World) -> Callable[[], None]:
    @hypothesis.settings(
        max_examples=MAX_EXAMPLES,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    )
    @given(case=strategy)
    def run(case: Case) -> None:
        response = case.call_and_validate(
            base_url=base_url, headers=world.bob.headers, checks=CHECKS
        )
        _nothing_of_alice(response, world)

    return run


def _nothing_of_alice(response: schemathesis.Response, world: World) -> None:
    # An error may echo what bob sent (alice's id in a path); a success must not hold it.
    assert ALICE_MARKER not in response.text
    if response.status_code < 300:
        for secret in (world.alice.job, world.alice.site, world.alice.name):
            assert secret not in response.text, f"bob got {secret!r} back: {response.text[:500]}"


async def quarantined(engine: Engine) -> list[str]:
    def reasons() -> list[str]:
        with engine.connect() as conn:
            return [
                str(r) for r in conn.execute(text("SELECT reason FROM rm.quarantine")).scalars()
            ]

    return await asyncio.to_thread(reasons)


async def test_fuzz_the_api_as_bob(api: ApiHarness, world: World, sa_engine: Engine) -> None:
    document = api.app.openapi()
    with nkey_format():
        async with served(api) as base_url:
            await asyncio.to_thread(fuzz, document, base_url, world)

    await api.wait_projected((await api.js.stream_info(EVENTS_STREAM)).state.last_seq)
    assert await quarantined(sa_engine) == []
    shown = await api.client.get(f"/jobs/{world.alice.job}", headers=world.alice.headers)
    assert shown.json()["state"] == "PREPROCESSED"  # "sim" has no preprocess hook: runnable
    assert shown.json()["last_seq"] == shown.json()["created_seq"]  # bob changed nothing
