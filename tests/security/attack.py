"""The attacker's and the observer's tools: plain nats-py and httpx, none of the project's clients.

An attacker holds one site's nkey seed (and the CA that the websocket's certificate chains
to) or one user's API token. It connects as the site would: ``wss://``, the nkey, the
site's inbox prefix. Its verdicts come from the server itself:

* a refused publish or subscribe is a ``Permissions Violation`` the server sends back on
  the connection. The server answers a PING only after everything sent before it, and
  nats-py runs ``error_cb`` before it reads the PONG, so after :func:`settle` the verdict
  on every earlier operation is in :class:`Violations`, with no timeout involved;
* a JetStream refusal is the error in the API's or the stream's JSON reply.

The observer is the control plane (user and password on the plain listener) reading the
stream, and Postgres read as-is: what the attack did, not what a service says it did.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
import uuid
import warnings
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any, Final

import httpx
import nats
import psycopg
from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from nats.js.errors import NotFoundError

from lodestream.schemas.subjects import EVENTS_STREAM
from tests.support.stack import Stack

WAIT_S: Final = 30.0
REPLY_TIMEOUT_S: Final = 2.0


class Violations:
    """``error_cb`` of an attacker's connection: every error the server sent, lower-cased."""

    def __init__(self) -> None:
        self.errors: list[str] = []

    async def record(self, exc: Exception) -> None:
        self.errors.append(str(exc).lower())

    def mark(self) -> int:
        return len(self.errors)

    def refused(self, action: str, subject: str, after: int) -> bool:
        """Whether the server refused ``action`` ("publish" or "subscription") on ``subject``."""
        wanted = f'permissions violation for {action} to "{subject.lower()}"'
        return any(wanted in error for error in self.errors[after:])


@contextlib.asynccontextmanager
async def site_connection(
    stack: Stack, site: str, violations: Violations | None = None, **options: Any
) -> AsyncIterator[Client]:
    """Connect with ``site``'s seed over wss, exactly as a site agent or pilot would."""
    nc = Client()
    with warnings.catch_warnings():
        # nats-py 2.16 hands aiohttp a float timeout, which aiohttp deprecates.
        warnings.filterwarnings("ignore", "parameter 'timeout'", DeprecationWarning)
        try:
            await nc.connect(
                servers=[options.pop("url", stack.websocket_url)],
                tls=ssl.create_default_context(cafile=str(stack.ca_file)),
                nkeys_seed=str(stack.seed_files[site]),
                inbox_prefix=f"_INBOX_{site}",
                error_cb=(violations or Violations()).record,
                allow_reconnect=False,
                **options,
            )
        except BaseException:
            await nc.close()  # a failed connect leaves nats-py's aiohttp session open
            raise
    try:
        yield nc
    finally:
        await nc.close()


@contextlib.asynccontextmanager
async def control_connection(stack: Stack) -> AsyncIterator[JetStreamContext]:
    """The control plane's view: the plain listener, user and password."""
    nc = await nats.connect(
        stack.client_url, user=stack.control_user, password=stack.control_password
    )
    try:
        yield nc.jetstream()
    finally:
        await nc.close()


# --- probes ---------------------------------------------------------------------------------


async def settle(nc: Client) -> None:
    """Until the server has answered everything sent so far.

    nats-py writes a flush's PING straight to the transport but queues publishes and
    subscriptions for its flusher task, so one PING can overtake them. The second PING is
    written after the flusher has sent them (it runs before the first PONG can be read).
    """
    await nc.flush()
    await nc.flush()


@dataclass(frozen=True, slots=True)
class Verdict:
    refused: bool  # by nats-server's permissions
    answer: str  # the reply (a JetStream API answer or PubAck), "" if none came

    @property
    def json(self) -> dict[str, Any]:
        parsed: dict[str, Any] = json.loads(self.answer) if self.answer.startswith("{") else {}
        return parsed


async def try_publish(
    nc: Client,
    violations: Violations,
    subject: str,
    payload: bytes = b"",
    headers: Mapping[str, str] | None = None,
    *,
    reply_timeout_s: float = REPLY_TIMEOUT_S,
) -> Verdict:
    """Publish with a reply inbox; the server's verdict, and its answer when it allowed it."""
    after = violations.mark()
    inbox = nc.new_inbox()
    sub = await nc.subscribe(inbox, max_msgs=1)
    try:
        await nc.publish(subject, payload, reply=inbox, headers=dict(headers or {}) or None)
        await settle(nc)
        if violations.refused("publish", subject, after):
            return Verdict(refused=True, answer="")
        try:
            msg = await sub.next_msg(timeout=reply_timeout_s)
        except TimeoutError:
            # No answer is expected to some allowed publishes (an ack); a refusal that came
            # late would show here.
            return Verdict(refused=violations.refused("publish", subject, after), answer="")
        status = (msg.headers or {}).get("Status")
        answer = msg.data.decode(errors="replace") or (f"status {status}" if status else "")
        return Verdict(refused=False, answer=answer)
    finally:
        with contextlib.suppress(Exception):
            await sub.unsubscribe()


async def try_subscribe(nc: Client, violations: Violations, subject: str) -> Verdict:
    after = violations.mark()
    sub = await nc.subscribe(subject)
    await settle(nc)
    refused = violations.refused("subscription", subject, after)
    with contextlib.suppress(Exception):
        await sub.unsubscribe()
    return Verdict(refused=refused, answer="")


async def js_publish(
    nc: Client, violations: Violations, subject: str, payload: bytes, **headers: str
) -> dict[str, Any]:
    """A JetStream publish as a site makes it; the PubAck or the error, as JSON."""
    verdict = await try_publish(nc, violations, subject, payload, headers or None)
    assert not verdict.refused, f"{subject} was refused by permissions"
    assert verdict.answer, f"no answer to a publish on {subject}"
    return verdict.json


# --- what the control plane sees ------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Stored:
    seq: int
    subject: str
    data: bytes
    msg_id: str | None = None


async def stored(
    js: JetStreamContext, filters: list[str], stream: str = EVENTS_STREAM
) -> list[Stored]:
    """Every message of ``stream`` on ``filters``, read with a throw-away consumer."""
    name = f"observer-{uuid.uuid4().hex[:12]}"
    info = await js.add_consumer(
        stream,
        ConsumerConfig(
            name=name, filter_subjects=filters, ack_policy=AckPolicy.NONE,
            deliver_policy=DeliverPolicy.ALL, inactive_threshold=30.0,
        ),
    )  # fmt: skip
    found: list[Stored] = []
    try:
        remaining = info.num_pending or 0
        if remaining:
            sub = await js.pull_subscribe_bind(name, stream=stream)
            try:
                while remaining > 0:
                    for msg in await sub.fetch(min(remaining, 1000), timeout=WAIT_S):
                        msg_id = (msg.headers or {}).get("Nats-Msg-Id")
                        seq = int(msg.metadata.sequence.stream)
                        found.append(Stored(seq, msg.subject, msg.data, msg_id))
                        remaining -= 1
            finally:
                await sub.unsubscribe()
    finally:
        with contextlib.suppress(NotFoundError):
            await js.delete_consumer(stream, name)
    return found


async def last_on(js: JetStreamContext, subject: str, stream: str = EVENTS_STREAM) -> int | None:
    """Sequence of the newest message on ``subject`` (a filter), None if there is none."""
    try:
        return (await js.get_last_msg(stream, subject)).seq
    except NotFoundError:
        return None


async def controller_done_with(js: JetStreamContext, seq: int) -> None:
    """Until the controller has acted on (and acked) the event at ``seq`` and all before it.

    ``seq`` must be an event the controller consumes (one of its filter subjects). It acks
    a message only after appending its consequences, so nothing more will come of it.
    """
    async with asyncio.timeout(WAIT_S):
        while await ack_floor(js, EVENTS_STREAM, "controller") < seq:
            await asyncio.sleep(0.05)


async def ack_floor(js: JetStreamContext, stream: str, consumer: str) -> int:
    """The stream sequence up to which ``consumer`` has acked everything it was given."""
    floor = (await js.consumer_info(stream, consumer)).ack_floor
    return floor.stream_seq if floor is not None else 0


async def quarantined(dsn: str, seqs: list[int], stream: str = EVENTS_STREAM) -> dict[int, str]:
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        cursor = await conn.execute(
            "SELECT seq, reason FROM rm.quarantine WHERE stream = %s AND seq = ANY(%s)",
            (stream, seqs),
        )
        return {int(seq): str(reason) for seq, reason in await cursor.fetchall()}


async def wait_quarantined(
    dsn: str, seqs: list[int], stream: str = EVENTS_STREAM
) -> dict[int, str]:
    async with asyncio.timeout(WAIT_S):
        while True:
            found = await quarantined(dsn, seqs, stream)
            if len(found) == len(set(seqs)):
                return found
            await asyncio.sleep(0.05)


# --- the HTTP API ---------------------------------------------------------------------------


class Api:
    """A user's view of the API, over real HTTP."""

    def __init__(self, stack: Stack, client: httpx.AsyncClient) -> None:
        self.stack = stack
        self.client = client

    def auth(self, user: str) -> dict[str, str]:
        return self.stack.auth(user)

    async def submit(self, user: str, site: str, *, wait: bool = True, **spec: Any) -> uuid.UUID:
        """Submit one job of ``site``; with ``wait``, return once the projector has it."""
        job = {"site": site, "app": "hello", "workdir": f"w/{uuid.uuid4().hex[:8]}"} | spec
        response = await self.client.post(
            "/jobs", json={"jobs": [job]}, params={"wait": str(wait).lower()},
            headers=self.auth(user),
        )  # fmt: skip
        assert response.status_code == (201 if wait else 202), response.text
        return uuid.UUID(response.json()["jobs"][0]["id"])

    async def job(self, user: str, job_id: uuid.UUID) -> dict[str, Any] | None:
        response = await self.client.get(f"/jobs/{job_id}", headers=self.auth(user))
        if response.status_code == 404:
            return None
        assert response.status_code == 200, response.text
        body: dict[str, Any] = response.json()
        return body

    async def history(self, user: str, job_id: uuid.UUID) -> list[str]:
        response = await self.client.get(f"/jobs/{job_id}/events", headers=self.auth(user))
        assert response.status_code == 200, response.text
        return [str(event["type"]) for event in response.json()]

    async def wait_state(
        self, user: str, job_id: uuid.UUID, state: str, timeout_s: float = WAIT_S
    ) -> dict[str, Any]:
        job: dict[str, Any] | None = None
        try:
            async with asyncio.timeout(timeout_s):
                while True:
                    job = await self.job(user, job_id)
                    if job is not None and job["state"] == state:
                        return job
                    await asyncio.sleep(0.05)
        except TimeoutError:
            current = job["state"] if job else "absent"
            raise AssertionError(f"job {job_id} is {current}, not {state}") from None

    async def wait_event(
        self, user: str, job_id: uuid.UUID, event_type: str, timeout_s: float = WAIT_S
    ) -> list[str]:
        async with asyncio.timeout(timeout_s):
            while event_type not in (events := await self.history(user, job_id)):
                await asyncio.sleep(0.05)
        return events


@contextlib.asynccontextmanager
async def api_client(stack: Stack) -> AsyncIterator[Api]:
    async with httpx.AsyncClient(base_url=stack.api_url, timeout=WAIT_S) as client:
        yield Api(stack, client)


async def pipeline_works(api: Api, owners: Mapping[str, str], timeout_s: float = WAIT_S) -> None:
    """A fresh job of every site goes from created to PREPROCESSED (projector and controller)."""
    ids = {site: await api.submit(owner, site) for site, owner in owners.items()}
    for site, job_id in ids.items():
        await api.wait_state(owners[site], job_id, "PREPROCESSED", timeout_s)
