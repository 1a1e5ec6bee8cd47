"""What site beta's key may do on the bus, probed action by action against the live stack.

Every probe is judged by the server: a ``Permissions Violation`` is a denial, anything else
an allowance (with JetStream's answer recorded). The allowed set must be exactly what a site
needs: its own event types on its own subjects, its heartbeats, its own consumers (fetch,
ack, info), its inbox and its jobs' kills, and a direct get of its own subjects. The
counts per group are printed as a table (``pytest -s`` or ``-rA`` shows it).
"""

from __future__ import annotations

import json
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import pytest
from nats.errors import Error as NatsError

from lodestream.schemas.subjects import EVENTS_STREAM, HB_IN_STREAM, HB_STREAM
from lodestream.schemas.topology import SITE_CONSUMERS
from lodestream.schemas.trust import WRITERS
from tests.security.attack import (
    Verdict,
    Violations,
    api_client,
    control_connection,
    last_on,
    pipeline_works,
    site_connection,
    stored,
    try_publish,
    try_subscribe,
)
from tests.security.forge import subject
from tests.support.stack import SITE_OWNERS, Stack

CONSUMERS = tuple(feed.purpose for feed in SITE_CONSUMERS)
# Consumer names beta might try that no row of the table gives it: never granted.
UNKNOWN = ("evil-beta", "launches-beta", "beta", "launch-beta-2")
NEXT = json.dumps({"batch": 1, "no_wait": True}).encode()


@dataclass(frozen=True, slots=True)
class Probe:
    group: str
    action: str  # "publish" or "subscribe"
    subject: str
    needed: bool  # the site legitimately needs this
    payload: bytes = b""


def event_probes() -> list[Probe]:
    job = uuid.uuid4()
    probes = [
        Probe("events", "publish", subject(site, event_type, job),
              needed=site == "beta" and "site" in writers, payload=b"{}")
        for site in ("beta", "alpha")
        for event_type, writers in sorted(WRITERS.items())
    ]  # fmt: skip
    probes += [
        Probe("events", "publish", f"evt.beta.job.{job}.started.more", needed=False),
        Probe("events", "publish", f"evt.beta.nokind.{job}.started", needed=False),
        Probe("events", "publish", f"evt.alpha.job.{job}.killed", needed=False),
    ]
    return probes


def heartbeat_probes() -> list[Probe]:
    session = uuid.uuid4()
    return [
        Probe("heartbeats", "publish", f"hb.beta.{session}", needed=True, payload=b"{}"),
        Probe("heartbeats", "publish", f"hb.alpha.{session}", needed=False),
        Probe("heartbeats", "publish", f"hb.beta.{session}.more", needed=False),
    ]


def subscribe_probes() -> list[Probe]:
    denied = ["evt.>", "evt.alpha.>", "evt.beta.>", "evt.alpha.job.*.killed",
              "evt.*.job.*.killed", "hb.>", "hb.*.*", "hb.alpha.*", "$SYS.>", "_INBOX.>",
              "_INBOX_alpha.>", ">", "$JS.API.>", "$JS.ACK.>", "$JS.EVENT.>", "_INBOX_beta",
              "_INBOX_alpha.*.*"]  # fmt: skip
    return [Probe("subscribe", "subscribe", s, needed=False) for s in denied] + [
        Probe("subscribe", "subscribe", "_INBOX_beta.>", needed=True),
        Probe("subscribe", "subscribe", "evt.beta.job.*.killed", needed=True),
        # Its own pilots' heartbeats (what their caches hold), never another site's.
        Probe("subscribe", "subscribe", "hb.beta.*", needed=True),
    ]


def consumer_probes() -> list[Probe]:
    api = "$JS.API.CONSUMER"
    create = json.dumps({"stream_name": EVENTS_STREAM, "config": {"name": "evil-beta"}}).encode()
    denied = [
        (f"{api}.CREATE.{EVENTS_STREAM}", create),
        (f"{api}.CREATE.{EVENTS_STREAM}.evil-beta", create),
        (f"{api}.CREATE.{EVENTS_STREAM}.launch-beta", create),
        (f"{api}.CREATE.{EVENTS_STREAM}.evil-beta.evt.alpha.>", create),
        (f"{api}.DURABLE.CREATE.{EVENTS_STREAM}.launch-beta", create),
        (f"{api}.DURABLE.CREATE.{EVENTS_STREAM}.evil", create),
        (f"{api}.CREATE.{HB_STREAM}.evil-beta", create),
        (f"{api}.LIST.{EVENTS_STREAM}", b"{}"),
        (f"{api}.NAMES.{EVENTS_STREAM}", b"{}"),
        (f"{api}.LIST.{HB_STREAM}", b"{}"),
        (f"{api}.DELETE.{HB_STREAM}.controller-hb", b""),
        (f"{api}.INFO.{HB_STREAM}.controller-hb", b""),
    ]
    for name in ("launch-alpha", "process-alpha", "controller", "projector", "launch-beta"):
        for verb in ("DELETE", "INFO", "PAUSE", "UNPIN", "LEADER.STEPDOWN"):
            if (verb, name) != ("INFO", "launch-beta"):
                denied.append((f"{api}.{verb}.{EVENTS_STREAM}.{name}", b""))
    probes = [Probe("consumer admin", "publish", s, False, payload) for s, payload in denied]
    probes += [
        Probe("consumer admin", "publish", f"{api}.INFO.{EVENTS_STREAM}.{p}-beta", needed=True)
        for p in CONSUMERS
    ]
    return probes


def fetch_probes() -> list[Probe]:
    nxt = f"$JS.API.CONSUMER.MSG.NEXT.{EVENTS_STREAM}"
    ack = "1.999999999.999999999.1700000000000000000.0"
    probes = [
        Probe("fetch/ack", "publish", f"{nxt}.{p}-beta", needed=True, payload=NEXT)
        for p in CONSUMERS
    ]
    probes += [
        Probe("fetch/ack", "publish", f"$JS.ACK.{EVENTS_STREAM}.{p}-beta.{ack}", True, b"+ACK")
        for p in CONSUMERS
    ]
    others = (*(f"{p}-alpha" for p in CONSUMERS), *UNKNOWN)
    for name in (*others, "controller", "projector"):
        probes.append(Probe("fetch/ack", "publish", f"{nxt}.{name}", False, NEXT))
        probes.append(Probe("fetch/ack", "publish", f"$JS.ACK.{EVENTS_STREAM}.{name}.{ack}", False,
                            b"+ACK"))  # fmt: skip
    probes += [
        Probe("fetch/ack", "publish", f"$JS.API.CONSUMER.MSG.NEXT.{HB_STREAM}.controller-hb",
              False, NEXT),
        Probe("fetch/ack", "publish", f"$JS.ACK.{HB_STREAM}.controller-hb.{ack}", False, b"+ACK"),
    ]  # fmt: skip
    return probes


def stream_read_probes() -> list[Probe]:
    by_seq = json.dumps({"seq": 1}).encode()
    direct = f"$JS.API.DIRECT.GET.{EVENTS_STREAM}"
    job = uuid.uuid4()
    probes = [
        Probe("stream read", "publish", f"$JS.API.STREAM.MSG.GET.{s}", False, by_seq)
        for s in (EVENTS_STREAM, HB_STREAM, HB_IN_STREAM)
    ]
    probes += [
        Probe("stream read", "publish", f"$JS.API.DIRECT.GET.{s}", False, by_seq)
        for s in (EVENTS_STREAM, HB_STREAM, HB_IN_STREAM)
    ]
    for tail in ("evt.alpha.>", f"evt.alpha.job.{job}.created", "evt.*.job.*.created", ">",
                 "evt.>", "evt.*.>", "hb.>"):  # fmt: skip
        probes.append(Probe("stream read", "publish", f"{direct}.{tail}", needed=False))
    probes += [
        Probe("stream read", "publish", f"$JS.API.DIRECT.GET.{HB_STREAM}.hb.alpha.>", False),
        Probe("stream read", "publish", f"{direct}.evt.beta.>", needed=True),
    ]
    return probes


def stream_admin_probes() -> list[Probe]:
    api = "$JS.API.STREAM"
    config = json.dumps({"name": EVENTS_STREAM, "subjects": ["evt.>"], "allow_rollup_hdrs": True})
    probes = [
        Probe("stream admin", "publish", f"{api}.{verb}.{stream}", False, config.encode())
        for stream in (EVENTS_STREAM, HB_STREAM, HB_IN_STREAM)
        for verb in ("INFO", "UPDATE", "DELETE", "PURGE", "MSG.DELETE", "SNAPSHOT",
                     "LEADER.STEPDOWN", "PEER.REMOVE")
    ]  # fmt: skip
    probes += [
        Probe("stream admin", "publish", f"{api}.CREATE.EVIL", False, b'{"name":"EVIL"}'),
        Probe("stream admin", "publish", f"{api}.RESTORE.EVIL", False, b"{}"),
        Probe("stream admin", "publish", f"{api}.NAMES", False, b"{}"),
        Probe("stream admin", "publish", f"{api}.LIST", False, b"{}"),
        Probe("stream admin", "publish", "$JS.API.ACCOUNT.PURGE.$G", False),
        Probe("stream admin", "publish", "$JS.API.META.LEADER.STEPDOWN", False),
        Probe("stream admin", "publish", "$JS.API.SERVER.REMOVE", False),
    ]
    return probes


def system_probes() -> list[Probe]:
    denied = ["$SYS.REQ.SERVER.PING", "$SYS.REQ.SERVER.PING.CONNZ", "$SYS.REQ.SERVER.PING.JSZ",
              "$SYS.REQ.ACCOUNT.$G.CONNZ", "$SYS.REQ.ACCOUNT.PING.STATZ", "$SYS.REQ.USER.INFO",
              "$SYS.REQ.SERVER.PING.IDZ"]  # fmt: skip
    # $JS.API.INFO is granted on purpose (nats-py's JetStream context may ask it); it shows
    # account-wide totals only (streams, consumers, bytes): see the report.
    return [Probe("system", "publish", s, needed=False) for s in denied] + [
        Probe("system", "publish", "$JS.API.INFO", needed=True)
    ]


def all_probes() -> list[Probe]:
    return [
        *event_probes(), *heartbeat_probes(), *subscribe_probes(), *consumer_probes(),
        *fetch_probes(), *stream_read_probes(), *stream_admin_probes(), *system_probes(),
    ]  # fmt: skip


def table(results: list[tuple[Probe, Verdict]]) -> str:
    denied = Counter(p.group for p, v in results if v.refused)
    allowed = Counter(p.group for p, v in results if not v.refused)
    groups = list(dict.fromkeys(p.group for p, _ in results))
    lines = [f"{'group':<16}{'denied':>8}{'allowed':>9}"]
    lines += [f"{g:<16}{denied[g]:>8}{allowed[g]:>9}" for g in groups]
    lines.append(f"{'total':<16}{sum(denied.values()):>8}{sum(allowed.values()):>9}")
    lines += ["allowed:"] + [
        f"  {p.action:<9} {p.subject}  -> {v.answer[:100] or '(no reply)'}"
        for p, v in results
        if not v.refused
    ]
    return "\n".join(lines)


async def test_site_key_is_refused_on_the_control_plane_listener(shared_stack: Stack) -> None:
    for site in ("beta", "alpha"):
        violations = Violations()
        with pytest.raises(NatsError, match=r"(?i)authorization violation"):
            async with site_connection(
                shared_stack, site, violations, url=shared_stack.client_url,
                max_reconnect_attempts=0,
            ):  # fmt: skip
                pass
        assert any("authorization violation" in e for e in violations.errors)
    async with api_client(shared_stack) as api:
        await pipeline_works(api, SITE_OWNERS)


async def test_betas_key_may_do_exactly_what_a_site_needs(
    shared_stack: Stack, record_property: Callable[[str, object], None]
) -> None:
    violations = Violations()
    results: list[tuple[Probe, Verdict]] = []
    async with control_connection(shared_stack) as js:
        streams = (EVENTS_STREAM, HB_STREAM, HB_IN_STREAM)
        streams_before = {name: (await js.stream_info(name)).config for name in streams}
        consumers_before = sorted(c.name for c in await js.consumers_info(EVENTS_STREAM))
        alpha_before = await last_on(js, "evt.alpha.>") or 0
        alpha_beats = await last_on(js, "hb.alpha.>", HB_IN_STREAM)
        async with site_connection(shared_stack, "beta", violations) as beta:
            for probe in all_probes():
                if probe.action == "subscribe":
                    verdict = await try_subscribe(beta, violations, probe.subject)
                else:
                    verdict = await try_publish(beta, violations, probe.subject, probe.payload)
                results.append((probe, verdict))
            assert beta.is_connected
        report = table(results)
        print(f"\nsite beta's permissions, probed:\n{report}")
        record_property("permission_matrix", report)

        allowed = {p for p, v in results if not v.refused}
        assert allowed == {p for p, _ in results if p.needed}, report
        # Nothing any probe did reached another site or the streams' settings.
        # The controller may still append alpha's consequences of earlier tests (a session
        # expiring); nothing else may have reached alpha's subjects.
        for message in await stored(js, ["evt.alpha.>"]):
            if message.seq > alpha_before:
                actor = str(json.loads(message.data).get("actor", ""))
                assert actor.startswith("controller:"), (message.subject, message.data)
        assert await last_on(js, "hb.alpha.>", HB_IN_STREAM) == alpha_beats
        for name, config in streams_before.items():
            assert (await js.stream_info(name)).config == config
        assert sorted(c.name for c in await js.consumers_info(EVENTS_STREAM)) == consumers_before
    async with api_client(shared_stack) as api:
        await pipeline_works(api, SITE_OWNERS)
