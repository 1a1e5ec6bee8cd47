"""The forwarder: the events a leaf-node site kept during a cut, appended to the hub.

The site agent runs it when the site's processes connect to a leaf node
(``nats.hub_domain`` in ``settings.yml``). It takes the ``OUTBOX`` stream's events
(:mod:`lodestream.eventlog.outbox`) one at a time, in the order they were kept, checks
each with the shared rule, and appends it to the hub's ``EVENTS`` with the
compare-and-set it was made under, as the site's own key: the hub's permissions and its
compare-and-set decide, exactly as for an append made while the link was up.

* taken (or already there: the event id is the ``Nats-Msg-Id``, and ``EventLog`` knows a
  retry of an append that had landed): acked, and gone from the outbox;
* refused by compare-and-set (the hub expired the lease during the cut, or a kill came
  first): the hub's word is final; logged, counted and acked. The pilot learns it from
  the log itself (its check of its running jobs, or its session's);
* refused by the shared rule (not something this site may send): dropped, logged, counted;
* the hub not answering (the link is still down): the same event is tried again, with
  backoff capped at ``RETRY.cap_s``, and nothing after it goes first.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass, field
from typing import Any

import nats.errors
from nats.js import JetStreamContext

from lodestream.agents.site.retry import Backoff, stopped_within
from lodestream.eventlog import EventLog
from lodestream.eventlog.kernel import ACK, HOLD, TERM, Append, commit_one, settle
from lodestream.eventlog.outbox import (
    FORWARDER,
    OUTBOX_STREAM,
    ensure_outbox,
    event_subject,
    expected,
)
from lodestream.eventlog.transient import transient
from lodestream.schemas.errors import Untrusted, first_line
from lodestream.schemas.trust import check_own_site, event_from_message

log = logging.getLogger(__name__)

NAME = "forwarder"  # in the consumer kernel's log lines
RETRY = Backoff(first_s=0.2, cap_s=1.0)
FETCH_WAIT_S = 1.0


@dataclass(slots=True)
class ForwardReport:
    forwarded: int = 0
    duplicates: int = 0
    refused: int = 0
    untrusted: int = 0
    retries: int = 0
    # time.monotonic() of the last event the hub took: when the outbox drained after a cut.
    last_forwarded_at: float | None = None
    refused_subjects: list[str] = field(default_factory=list)


class Forwarder:
    def __init__(self, local: JetStreamContext, hub: JetStreamContext, site: str) -> None:
        self._local = local
        self._hub_log = EventLog(hub)
        self._site = site
        self.report = ForwardReport()

    async def run(self, stop: asyncio.Event) -> None:
        sub = None
        try:
            while not stop.is_set():
                try:
                    if sub is None:
                        await ensure_outbox(self._local, self._site)
                        sub = await self._local.pull_subscribe_bind(FORWARDER, stream=OUTBOX_STREAM)
                    msgs = await sub.fetch(1, timeout=FETCH_WAIT_S)
                except (nats.errors.TimeoutError, TimeoutError):
                    continue  # nothing kept
                except Exception as exc:  # the leaf itself away: the site's own server
                    log.warning("forwarder: cannot read the outbox: %s", exc or type(exc).__name__)
                    await stopped_within(stop, RETRY.cap_s)
                    continue
                for msg in msgs:
                    await self._forward(msg, stop)
        finally:
            # A pull subscription left open never drains: the agent's closing drain of the
            # connection then waited for it until its service manager killed it.
            if sub is not None:
                with contextlib.suppress(nats.errors.Error):
                    await sub.unsubscribe()

    async def _forward(self, msg: Any, stop: asyncio.Event) -> None:
        try:
            subject = event_subject(msg.subject)
            event = check_own_site(event_from_message(subject, msg.data), self._site)
            expect = expected(msg.headers)  # a garbled header is as untrusted as a payload
        except (Untrusted, ValueError) as exc:
            self.report.untrusted += 1
            log.warning("forwarder: dropped %s: %s", msg.subject, exc)
            await settle(msg, TERM, NAME)
            return
        tries = 0
        while not stop.is_set():
            try:
                appended = await commit_one(self._hub_log, Append(event, expect))
            except Exception as exc:
                if not transient(exc):
                    self._refused(subject, f"the hub refused {subject}: {first_line(exc)}")
                    await settle(msg, ACK, NAME)
                    return
                tries += 1
                self.report.retries += 1
                if tries == 1:
                    log.warning("forwarder: the hub does not answer (%s); holding %s",
                                first_line(exc), subject)  # fmt: skip
                await settle(msg, HOLD, NAME)  # ours until the hub answers; nothing overtakes it
                await stopped_within(stop, RETRY.delay(tries))
                continue
            if appended is None:  # lost its compare-and-set: the hub moved on during the cut
                self._refused(subject, f"the hub refused {subject} kept during the cut: "
                              "its job moved on")  # fmt: skip
            else:
                if appended.duplicate:
                    self.report.duplicates += 1
                else:
                    self.report.forwarded += 1
                self.report.last_forwarded_at = time.monotonic()
            await settle(msg, ACK, NAME)
            return

    def _refused(self, subject: str, why: str) -> None:
        self.report.refused += 1
        self.report.refused_subjects.append(subject)
        log.warning("forwarder: %s", why)
