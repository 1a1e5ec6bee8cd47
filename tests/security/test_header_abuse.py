"""JetStream control headers in what site beta publishes on its own subjects.

Permissions cannot see headers, so the streams must refuse the dangerous ones (rollup, TTL)
themselves, and the compare-and-set and de-duplication headers, which the streams must
honour for the control plane, are probed for what they let one site learn or suppress.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import orjson
import pytest
from nats.aio.client import Client
from nats.js import JetStreamContext

from lodestream.schemas.events.session import Heartbeat
from lodestream.schemas.ids import derived_id
from lodestream.schemas.subjects import EVENTS_STREAM, HB_IN_STREAM, HB_STREAM
from tests.security.attack import (
    Violations,
    api_client,
    control_connection,
    js_publish,
    last_on,
    pipeline_works,
    site_connection,
    stored,
)
from tests.support.stack import SITE_OWNERS, Stack

ADA = SITE_OWNERS["alpha"]
ROLLUP_NOT_PERMITTED = 10111
TTL_DISABLED = 10166
WRONG_LAST_SEQUENCE = 10071
WRONG_LAST_MSG_ID = 10070
STREAM_HEADERS = [
    {"Nats-Rollup": "all"},
    {"Nats-Rollup": "sub"},
    {"Nats-TTL": "1s"},
    {"Nats-TTL": "never"},
]


def error_code(answer: dict[str, object]) -> object:
    error = answer.get("error")
    return error.get("err_code") if isinstance(error, dict) else None


def description(answer: dict[str, object]) -> str:
    error = answer.get("error")
    return str(error.get("description")) if isinstance(error, dict) else ""


@contextlib.asynccontextmanager
async def heartbeating(nc: Client, site: str, session: uuid.UUID) -> AsyncIterator[None]:
    """``site`` heartbeats ``session`` every 0.2 s, as a live pilot does, until the block ends."""
    js = nc.jetstream()

    async def beat() -> None:
        while True:
            body = Heartbeat(session_id=session, site=site, at=datetime.now(UTC))
            await js.publish(f"hb.{site}.{session}", orjson.dumps(body.model_dump(mode="json")))
            await asyncio.sleep(0.2)

    task = asyncio.create_task(beat())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def heartbeat_in_hb(js: JetStreamContext, subject: str) -> Heartbeat:
    """The heartbeat HB holds on ``subject``, once it holds one (not an expiry marker)."""
    async with asyncio.timeout(30):
        while True:
            for message in await stored(js, [subject], HB_STREAM):
                if message.data:  # a marker has no body
                    return Heartbeat.model_validate_json(message.data)
            await asyncio.sleep(0.05)


@pytest.mark.parametrize(
    "headers", STREAM_HEADERS, ids=["rollup-all", "rollup-sub", "ttl", "ttl-never"]
)
async def test_rollup_and_ttl_headers_on_betas_events_are_refused(
    shared_stack: Stack, headers: dict[str, str]
) -> None:
    violations = Violations()
    job = uuid.uuid4()
    async with (
        control_connection(shared_stack) as js,
        site_connection(shared_stack, "beta", violations) as beta,
    ):
        messages = (await js.stream_info(EVENTS_STREAM)).state.messages
        answer = await js_publish(beta, violations, f"evt.beta.job.{job}.started", b"{}", **headers)
        assert error_code(answer) in {ROLLUP_NOT_PERMITTED, TTL_DISABLED}, answer
        assert await last_on(js, f"evt.beta.job.{job}.>") is None
        # A rollup would have purged the stream: nothing of anyone's is gone.
        assert (await js.stream_info(EVENTS_STREAM)).state.messages >= messages


async def test_rollup_and_ttl_on_heartbeats_are_refused_and_alphas_survive(
    shared_stack: Stack,
) -> None:
    """HBIN, where sites write, refuses the headers; alpha's heartbeats are neither purged
    there nor in HB (which sources HBIN, and would apply a rollup it was handed)."""
    beta_violations, alpha_violations = Violations(), Violations()
    alpha_session = uuid.uuid4()
    alpha_subject = f"hb.alpha.{alpha_session}"
    async with (
        control_connection(shared_stack) as js,
        site_connection(shared_stack, "alpha", alpha_violations) as alpha,
        site_connection(shared_stack, "beta", beta_violations) as beta,
    ):
        async with heartbeating(alpha, "alpha", alpha_session):
            await heartbeat_in_hb(js, alpha_subject)
        # Alpha is quiet now: its last heartbeat stays in HBIN (no TTL there) as it is.
        alpha_beat = await last_on(js, alpha_subject, HB_IN_STREAM)
        held = (await js.stream_info(HB_IN_STREAM)).state.messages
        for headers in STREAM_HEADERS:
            subject = f"hb.beta.{uuid.uuid4()}"
            answer = await js_publish(beta, beta_violations, subject, b"{}", **headers)
            assert answer.get("stream") == HB_IN_STREAM, answer
            assert error_code(answer) in {ROLLUP_NOT_PERMITTED, TTL_DISABLED}, answer
            assert await last_on(js, subject, HB_IN_STREAM) is None
            assert await stored(js, [subject], HB_STREAM) == []
        assert await last_on(js, alpha_subject, HB_IN_STREAM) == alpha_beat
        assert (await js.stream_info(HB_IN_STREAM)).state.messages >= held

        # Alpha's next heartbeats reach HB, and are alpha's own.
        async with heartbeating(alpha, "alpha", alpha_session):
            async with asyncio.timeout(30):
                while (await last_on(js, alpha_subject, HB_IN_STREAM) or 0) <= (alpha_beat or 0):
                    await asyncio.sleep(0.05)
            beat = await heartbeat_in_hb(js, alpha_subject)
        assert (beat.site, beat.session_id) == ("alpha", alpha_session)
        assert alpha_violations.errors == []
    async with api_client(shared_stack) as api:
        await pipeline_works(api, SITE_OWNERS)


async def test_cas_headers_naming_alphas_subjects_store_nothing(shared_stack: Stack) -> None:
    """Beta's own subject, with compare-and-set evaluated against alpha's subjects: refused."""
    violations = Violations()
    async with (
        api_client(shared_stack) as api,
        control_connection(shared_stack) as js,
        site_connection(shared_stack, "beta", violations) as beta,
    ):
        job_id = await api.submit(ADA, "alpha")
        await api.wait_state(ADA, job_id, "PREPROCESSED")
        for filter_subject in ("evt.alpha.>", f"evt.alpha.job.{job_id}.*"):
            subject = f"evt.beta.job.{uuid.uuid4()}.started"
            answer = await js_publish(
                beta, violations, subject, b"{}",
                **{"Nats-Expected-Last-Subject-Sequence": "0",
                   "Nats-Expected-Last-Subject-Sequence-Subject": filter_subject},
            )  # fmt: skip
            assert error_code(answer) == WRONG_LAST_SEQUENCE, answer
            assert await last_on(js, subject) is None
        await pipeline_works(api, SITE_OWNERS)


@pytest.mark.xfail(
    strict=True,
    raises=AssertionError,
    reason="nats-server evaluates Nats-Expected-Last-Subject-Sequence-Subject against any "
    "filter the publisher names and answers 10071 'wrong last sequence: <N>' with the newest "
    "sequence on it: a site learns the last sequence of another site's subjects "
    "(evt.alpha.>) and of any of its jobs (evt.alpha.job.<id>.*: existence and progress)",
)
async def test_cas_headers_reveal_nothing_of_alpha(shared_stack: Stack) -> None:
    violations = Violations()
    async with (
        api_client(shared_stack) as api,
        control_connection(shared_stack) as js,
        site_connection(shared_stack, "beta", violations) as beta,
    ):
        job_id = await api.submit(ADA, "alpha")
        await api.wait_state(ADA, job_id, "PREPROCESSED")
        revealed: dict[str, int] = {}
        for filter_subject in ("evt.alpha.>", f"evt.alpha.job.{job_id}.*"):
            answer = await js_publish(
                beta, violations, f"evt.beta.job.{uuid.uuid4()}.started", b"{}",
                **{"Nats-Expected-Last-Subject-Sequence": "0",
                   "Nats-Expected-Last-Subject-Sequence-Subject": filter_subject},
            )  # fmt: skip
            found = re.search(r"(\d+)\s*$", description(answer))
            revealed[filter_subject] = int(found.group(1)) if found else 0
        actual = {s: await last_on(js, s) for s in revealed}
        print(f"\nbeta learnt {revealed}; alpha's subjects are at {actual}")
        assert revealed[f"evt.alpha.job.{job_id}.*"] != actual[f"evt.alpha.job.{job_id}.*"]
        assert revealed["evt.alpha.>"] != actual["evt.alpha.>"]


@pytest.mark.xfail(
    strict=True,
    raises=AssertionError,
    reason="Nats-Expected-Last-Msg-Id is checked against the newest message of the whole "
    "stream, and the refusal (10070 'wrong last msg ID: <id>') quotes its Nats-Msg-Id: a "
    "site reads the event id of another site's latest event",
)
async def test_expected_last_msg_id_reveals_no_event_id_of_alpha(shared_stack: Stack) -> None:
    violations = Violations()
    async with (
        api_client(shared_stack) as api,
        control_connection(shared_stack) as js,
        site_connection(shared_stack, "beta", violations) as beta,
    ):
        revealed = ""
        for _ in range(20):  # until the stream's newest message is alpha's (the stack is shared)
            job_id = await api.submit(ADA, "alpha")
            await api.wait_state(ADA, job_id, "PREPROCESSED")
            answer = await js_publish(
                beta, violations, f"evt.beta.job.{uuid.uuid4()}.started", b"{}",
                **{"Nats-Expected-Last-Msg-Id": "nothing-like-this"},
            )  # fmt: skip
            assert error_code(answer) == WRONG_LAST_MSG_ID, answer
            revealed = description(answer).rpartition(" ")[2]
            alpha_ids = {m.msg_id for m in await stored(js, [f"evt.alpha.job.{job_id}.>"])}
            if revealed in alpha_ids:
                break
        alpha_ids = {m.msg_id for m in await stored(js, ["evt.alpha.>"])}
        print(f"\nbeta learnt event id {revealed} (an alpha event: {revealed in alpha_ids})")
        assert revealed not in alpha_ids


async def test_a_site_cannot_suppress_a_users_idempotent_submission(shared_stack: Stack) -> None:
    violations = Violations()
    key = f"nightly-scan-{uuid.uuid4().hex[:6]}"
    job_id = derived_id("job", ADA, key, "0")
    event_id = derived_id("job.created", str(job_id), key)
    async with (
        api_client(shared_stack) as api,
        site_connection(shared_stack, "beta", violations) as beta,
    ):
        ack = await js_publish(beta, violations, f"evt.beta.job.{uuid.uuid4()}.started", b"{}",
                               **{"Nats-Msg-Id": str(event_id)})  # fmt: skip
        assert "error" not in ack, ack
        response = await api.client.post(
            "/jobs",
            json={"jobs": [{"site": "alpha", "app": "hello", "workdir": "w"}],
                  "idempotency_key": key},
            params={"wait": "true"},
            headers=api.auth(ADA),
        )  # fmt: skip
        print(f"\nsubmission answered {response.status_code}: {response.text[:200]}")
        # The ids of an idempotent submission are keyed with a control-plane secret, so the
        # id beta computed from (user, key) is not the one the API uses: nothing pre-empted.
        assert response.status_code == 201, response.text
        (submitted,) = response.json()["jobs"]
        assert submitted["duplicate"] is False
        assert uuid.UUID(submitted["id"]) != job_id
        assert await api.job(ADA, uuid.UUID(submitted["id"])) is not None
        await pipeline_works(api, SITE_OWNERS)
