"""The API's trust boundary: what Postgres or NATS cannot take is refused up front, whole.

Every refused request gets a clear 4xx naming the field or the limit, and the
log is unchanged (the EVENTS stream holds as many messages as before). The
OpenAPI document states the same rules (tests/integration/test_api_fuzz.py
holds the API to it).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import httpx
import pytest

from lodestream.eventlog import EventLog
from lodestream.schemas.events.job import JobCreated
from lodestream.schemas.ids import uuid7
from lodestream.schemas.nkey import new_user_seed, user_public_key
from lodestream.schemas.resources import (
    MAX_PARENTS,
    NUL_FREE_PATTERN,
    TAG_KEY_PATTERN,
    WORKDIR_PATTERN,
    App,
    AppParameter,
    AppTransferSlot,
    JobSpec,
)
from lodestream.schemas.subjects import SITE_SLUG_PATTERN
from lodestream.services.api.appends import message_size
from lodestream.services.api.main import create_app
from lodestream.services.api.models import MAX_PAGE_SIZE, TAG_FILTER_PATTERN
from lodestream.settings import Settings
from tests.fixtures.api import ApiHarness

SITE = "theta"
NUL = "\x00"


def job(**fields: Any) -> dict[str, Any]:
    return {"site": SITE, "app": "sim", "workdir": "runs/1", "parameters": {"n": "1"}, **fields}


@pytest.fixture
async def alice(api: ApiHarness) -> dict[str, str]:
    await api.register_site("alice", SITE)
    await api.register_app(
        App(
            site=SITE,
            name="sim",
            parameters={"n": AppParameter()},
            transfers={"input": AppTransferSlot(direction="in", local_path="in.h5")},
        )
    )
    return api.user("alice")


async def refused(
    api: ApiHarness, method: str, url: str, headers: dict[str, str], **request: Any
) -> httpx.Response:
    """Send a request that must change nothing on the log; return its response."""
    before = await api.message_count()
    response = await api.client.request(method, url, headers=headers, **request)
    assert await api.message_count() == before, f"{method} {url} appended: {response.text}"
    return response


def error(response: httpx.Response, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    body: dict[str, Any] = response.json()["error"]
    return body


# --- 1. nothing unstorable: NUL, integers beyond 64 bits, non-finite numbers ------------------


NUL_REFUSED = "must not contain NUL (\\u0000), which Postgres cannot store"


@pytest.mark.parametrize(
    ("fields", "where", "message"),
    [
        # Parameters are JSON values, walked as `data` is: the message names the key.
        (
            {"parameters": {"n": f"1{NUL}"}},
            "body.jobs.1.parameters",
            "parameters['n'] contains NUL (\\u0000), which Postgres cannot store",
        ),
        ({"parameters": {"n": "1", f"x{NUL}": "2"}}, "body.jobs.1.parameters.x", NUL_REFUSED),
        ({"tags": {"run": f"a{NUL}"}}, "body.jobs.1.tags.run", NUL_REFUSED),
        (
            {"launch_params": {"--cpu-bind": NUL}},
            "body.jobs.1.launch_params.--cpu-bind",
            "a launch_params value is",
        ),
        ({"data": {f"k{NUL}": 1}}, "body.jobs.1.data.k", NUL_REFUSED),
        (
            {"data": {"k": [1, {"deep": ["ok", f"n{NUL}"]}]}},
            "body.jobs.1.data",
            "data['k'][1]['deep'][1] contains NUL (\\u0000), which Postgres cannot store",
        ),
        (
            {"transfers": {"input": {"location": f"g{NUL}", "path": "/p"}}},
            "body.jobs.1.transfers.input.location",
            NUL_REFUSED,
        ),
        (
            {"transfers": {"input": {"location": "g", "path": f"/p{NUL}"}}},
            "body.jobs.1.transfers.input.path",
            NUL_REFUSED,
        ),
        ({"workdir": f"runs/{NUL}"}, "body.jobs.1.workdir", "without '..' or control characters"),
        ({"app": f"sim{NUL}"}, "body.jobs.1.app", "an app name is"),
    ],
)
async def test_a_nul_anywhere_in_a_job_is_refused(
    api: ApiHarness, alice: dict[str, str], fields: dict[str, Any], where: str, message: str
) -> None:
    response = await refused(api, "POST", "/jobs", alice, json={"jobs": [job(), job(**fields)]})

    body = error(response, 422)
    assert body["code"] == "invalid"
    assert body["message"].startswith(f"invalid submission: {where}")
    assert message in body["message"]


LAUNCH_VALUE = "a launch_params value is '' (a switch) or one word"


@pytest.mark.parametrize(
    ("params", "where", "message"),
    [
        # The audit's exploit: a value given to srun's -l switch became --export of its own.
        (
            {"-l": "--export=ALL,BASH_ENV=$(touch${IFS}pwned)"},
            "body.jobs.1.launch_params.-l",
            LAUNCH_VALUE,
        ),
        (
            {"--cpu-bind": "cores --export=ALL"},
            "body.jobs.1.launch_params.--cpu-bind",
            LAUNCH_VALUE,
        ),
        ({"-bind-to": "-launcher-exec"}, "body.jobs.1.launch_params.-bind-to", LAUNCH_VALUE),
        ({"--cpu-bind": "'x'"}, "body.jobs.1.launch_params.--cpu-bind", LAUNCH_VALUE),
        ({"--cpu-bind": "a\nb"}, "body.jobs.1.launch_params.--cpu-bind", LAUNCH_VALUE),
        # A key without dashes failed at run, on every retry.
        ({"mpi": "pmi2"}, "body.jobs.1.launch_params.mpi", "a launch_params key is an option"),
        ({"--a b": ""}, "body.jobs.1.launch_params.--a b", "a launch_params key is an option"),
    ],
)
async def test_launch_params_that_could_read_as_syntax_are_refused(
    api: ApiHarness, alice: dict[str, str], params: dict[str, str], where: str, message: str
) -> None:
    response = await refused(
        api, "POST", "/jobs", alice, json={"jobs": [job(), job(launch_params=params)]}
    )

    body = error(response, 422)
    assert body["message"].startswith(f"invalid submission: {where}"), body["message"]
    assert message in body["message"]


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (str(2**63), "is an integer outside [-9223372036854775808, 9223372036854775807]"),
        (str(-(2**63) - 1), "is an integer outside"),
        ("1" + "0" * 40, "is an integer outside"),
        ("NaN", "is not a finite number"),
        ("-Infinity", "is not a finite number"),
        ("1e999", "is not a finite number"),
    ],
)
async def test_numbers_json_cannot_carry_back_are_refused(
    api: ApiHarness, alice: dict[str, str], raw: str, message: str
) -> None:
    body = '{"jobs": [{"site": "theta", "app": "sim", "workdir": "w", "parameters": {"n": "1"}, '
    body += f'"data": {{"x": {{"y": [{raw}]}}}}}}]}}'

    response = await refused(
        api, "POST", "/jobs", {**alice, "content-type": "application/json"}, content=body
    )

    assert error(response, 422)["message"].startswith(
        f"invalid submission: body.jobs.0.data: data['x']['y'][0] {message}"
    )


async def test_the_largest_numbers_postgres_and_the_codec_keep_are_accepted(
    api: ApiHarness, alice: dict[str, str]
) -> None:
    data = {"big": 2**63 - 1, "small": -(2**63), "float": -1.5, "none": None}

    response = await api.submit("alice", [job(data=data)])

    assert response.status_code == 201, response.text
    shown = await api.client.get(f"/jobs/{response.json()['jobs'][0]['id']}", headers=alice)
    assert shown.json()["data"] == data


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("num_nodes", 2**63),
        ("wall_time_min", 2**31),
        ("gpus_per_rank", -1),
        ("threads_per_core", 9),
    ],
)
async def test_resources_outside_their_bounds_are_refused(
    api: ApiHarness, alice: dict[str, str], field: str, value: int
) -> None:
    response = await refused(api, "POST", "/jobs", alice, json={"jobs": [job(**{field: value})]})

    assert error(response, 422)["message"].startswith(f"invalid submission: body.jobs.0.{field}:")


async def test_a_nul_in_a_kill_reason_or_site_description_is_refused(
    api: ApiHarness, alice: dict[str, str]
) -> None:
    job_id = (await api.submit("alice", [job()])).json()["jobs"][0]["id"]

    kill = await refused(api, "POST", f"/jobs/{job_id}/kill", alice, json={"reason": NUL})
    site = await refused(api, "POST", "/sites", alice, json={"name": "s", "description": NUL})

    assert error(kill, 422)["message"] == f"invalid request: body.reason: {NUL_REFUSED}"
    assert error(site, 422)["message"] == f"invalid request: body.description: {NUL_REFUSED}"


@pytest.mark.parametrize(
    ("url", "params", "where"),
    [
        ("/jobs", {"tag": f"run:{NUL}"}, "query.tag.0: a tag filter is key:value"),
        ("/jobs", {"site": NUL}, "query.site: a site name is"),
        ("/jobs", {"app": NUL}, "query.app: an app name is"),
        ("/apps", {"site": NUL}, "query.site: a site name is"),
        ("/jobs", {"offset": 2**63}, "query.offset: Input should be less than or equal to"),
        ("/events", {"after_seq": 2**63}, "query.after_seq: Input should be less than or equal"),
    ],
)
async def test_a_query_postgres_cannot_run_is_invalid(
    api: ApiHarness, alice: dict[str, str], url: str, params: dict[str, Any], where: str
) -> None:
    response = await api.client.get(url, params=params, headers=alice)

    assert error(response, 422)["message"].startswith(f"invalid request: {where}")


async def test_a_body_that_is_not_utf8_is_invalid(api: ApiHarness, alice: dict[str, str]) -> None:
    headers = {**alice, "content-type": "application/json"}

    site = await refused(api, "POST", "/sites", headers, content=b'{"name": "\xff"}')
    jobs = await refused(api, "POST", "/jobs", headers, content=b'{"jobs": "\xff"}')

    assert error(site, 422)["code"] == "invalid"
    assert error(jobs, 422)["code"] == "invalid"


# --- 2. workdir ---------------------------------------------------------------------------------

WORKDIR_RULE = (
    "must be a relative path below the site's data/ (not data/ itself), without '..'"
    " or control characters"
)


@pytest.mark.parametrize(
    ("workdir", "message"),
    [
        *((path, WORKDIR_RULE) for path in (".", "./", "././/.", "a/..", "/etc")),
        *((path, WORKDIR_RULE) for path in ("a\nb", "a\tb", "a\x7fb")),
        ("", "String should have at least 1 character"),
    ],
)
async def test_a_workdir_that_is_no_directory_of_its_own_is_refused(
    api: ApiHarness, alice: dict[str, str], workdir: str, message: str
) -> None:
    response = await refused(api, "POST", "/jobs", alice, json={"jobs": [job(workdir=workdir)]})

    assert error(response, 422)["message"].startswith(
        f"invalid submission: body.jobs.0.workdir: {message}"
    )


# --- 3. larger than the log takes -------------------------------------------------------------


def max_payload(api: ApiHarness) -> int:
    limit: int = api.app.state.context.nc.max_payload
    return limit


async def test_a_job_over_the_servers_max_payload_is_too_large(
    api: ApiHarness, alice: dict[str, str]
) -> None:
    limit = max_payload(api)
    jobs = [job(), job(data={"blob": "x" * limit}), job(), job(data={"blob": "y" * limit})]

    response = await refused(api, "POST", "/jobs", alice, json={"jobs": jobs})

    body = error(response, 413)
    assert body["code"] == "too_large"
    assert f"the event log accepts at most {limit} bytes per event" in body["message"]
    assert body["message"].startswith("jobs[1] would be a ")
    assert "(and 1 more)" in body["message"]
    assert "nothing was appended" in body["message"]
    assert body["details"]["limit"] == limit
    assert [j["index"] for j in body["details"]["jobs"]] == [1, 3]
    assert all(j["size"] > limit for j in body["details"]["jobs"])


async def test_a_job_just_under_the_limit_is_accepted(
    api: ApiHarness, alice: dict[str, str]
) -> None:
    # Some 150 bytes of headroom: the event's id and timestamp vary a little in length.
    spec = job(data={"blob": ""})
    event = JobCreated.create(
        site=SITE, aggregate_id=uuid7(), actor="user:alice", data=JobSpec.model_validate(spec)
    )
    pad = max_payload(api) - message_size(event, 0) - 150

    response = await api.submit("alice", [job(data={"blob": "x" * pad})])

    assert response.status_code == 201, response.text[:300]


async def test_message_size_is_what_the_server_counts(api: ApiHarness) -> None:
    """An append of exactly max_payload bytes (headers included) goes through."""
    limit = max_payload(api)
    at = dt.datetime(2026, 1, 2, 3, 4, 5, 123456, tzinfo=dt.UTC)
    event_id, job_id = uuid7(), uuid7()

    def created(blob: str) -> JobCreated:
        spec = JobSpec(site=SITE, app="sim", workdir="w", data={"blob": blob})
        return JobCreated.create(
            site=SITE,
            aggregate_id=job_id,
            actor="user:alice",
            data=spec,
            event_id=event_id,
            occurred_at=at,
        )

    event = created("x" * (limit - message_size(created(""), 0)))
    assert message_size(event, 0) == limit

    appended = await EventLog(api.js).append(event, expect=0)

    assert appended.seq > 0


# --- 4. site keys -----------------------------------------------------------------------------


def corrupt(key: str) -> str:
    """The same key with its last character changed: the pattern still matches, the CRC not."""
    return key[:-1] + ("A" if key[-1] != "A" else "B")


async def test_a_key_with_a_bad_checksum_is_refused(api: ApiHarness, alice: dict[str, str]) -> None:
    bad = corrupt(user_public_key(new_user_seed()))

    bound = await refused(api, "PUT", f"/sites/{SITE}/key", alice, json={"public_key": bad})
    registered = await refused(
        api, "POST", "/sites", alice, json={"name": "polaris", "public_key": bad}
    )

    for response in (bound, registered):
        assert error(response, 422)["message"] == (
            "invalid request: body.public_key: not a valid nkey: its checksum does not match "
            "(copy the public key again, whole)"
        )


@pytest.mark.parametrize(
    ("key", "message"),
    [
        ("U" + "A" * 54, "String should match pattern"),
        ("S" + "A" * 55, "String should match pattern"),
        ("U7" + "A" * 54, "its prefix byte is not a user's"),
    ],
)
async def test_a_key_that_is_not_a_user_nkey_is_refused(
    api: ApiHarness, alice: dict[str, str], key: str, message: str
) -> None:
    response = await refused(api, "PUT", f"/sites/{SITE}/key", alice, json={"public_key": key})

    assert message in error(response, 422)["message"]


async def test_a_valid_key_is_bound_and_registered(api: ApiHarness, alice: dict[str, str]) -> None:
    before = await api.message_count()
    key, other = user_public_key(new_user_seed()), user_public_key(new_user_seed())

    bound = await api.client.put(f"/sites/{SITE}/key", json={"public_key": key}, headers=alice)
    registered = await api.client.post(
        "/sites", json={"name": "polaris", "public_key": other}, headers=alice
    )
    # One key, one principal (issue 29): the first site's key is not a second site's.
    twice = await api.client.post("/sites", json={"name": "vega", "public_key": key}, headers=alice)

    assert bound.status_code == 200, bound.text
    assert registered.status_code == 201, registered.text
    assert twice.status_code == 409, twice.text
    assert await api.message_count() == before + 2


# --- 5. the OpenAPI document says all of this -------------------------------------------------


def operations(document: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [
        (method.upper(), path, operation)
        for path, item in document["paths"].items()
        for method, operation in item.items()
    ]


def test_every_operation_documents_its_errors_with_the_error_body() -> None:
    document = create_app(Settings()).openapi()
    error_body = {"$ref": "#/components/schemas/ErrorBody"}

    for method, path, operation in operations(document):
        statuses = set(operation["responses"])
        label = f"{method} {path}"
        if operation.get("security"):
            assert "401" in statuses, label
            assert "503" in statuses, label
        if operation.get("parameters") or operation.get("requestBody"):
            assert "422" in statuses, label
        if "{" in path:
            assert "404" in statuses, label
        if "requestBody" in operation:
            assert "413" in statuses, label
        for status, response in operation["responses"].items():
            if int(status) >= 400 and path != "/readyz":
                assert response["content"]["application/json"]["schema"] == error_body, label
    assert {m for m, p, o in operations(document) if "409" in o["responses"]} >= {"POST", "PUT"}


def test_the_document_states_the_limits_the_validators_enforce() -> None:
    document = create_app(Settings()).openapi()
    schemas = document["components"]["schemas"]
    query = {p["name"]: p["schema"] for p in document["paths"]["/jobs"]["get"]["parameters"]}
    body = document["paths"]["/jobs"]["post"]["requestBody"]["content"]["application/json"]
    spec = body["schema"]["properties"]["jobs"]["items"]["properties"]
    key_path = document["paths"]["/sites/{name}/key"]["put"]["parameters"][0]["schema"]

    assert (query["limit"]["minimum"], query["limit"]["maximum"]) == (1, MAX_PAGE_SIZE)
    assert query["offset"]["maximum"] == 2**63 - 1
    assert query["site"]["anyOf"][0]["pattern"] == SITE_SLUG_PATTERN
    assert query["tag"]["anyOf"][0]["items"]["pattern"] == TAG_FILTER_PATTERN
    assert spec["parent_ids"]["uniqueItems"] is True
    assert spec["parent_ids"]["maxItems"] == MAX_PARENTS
    assert spec["workdir"]["pattern"] == WORKDIR_PATTERN
    assert spec["tags"]["patternProperties"][TAG_KEY_PATTERN]["pattern"] == NUL_FREE_PATTERN
    assert schemas["SiteCreate"]["properties"]["name"]["pattern"] == SITE_SLUG_PATTERN
    assert schemas["SiteKey"]["properties"]["public_key"]["format"] == "nkey-user"
    assert schemas["ActionBody"]["properties"]["reason"]["pattern"] == NUL_FREE_PATTERN
    assert key_path["pattern"] == SITE_SLUG_PATTERN
