"""The controller's consumers: EVENTS (what to react to) and HB (which pilots died).

Every message is acked only after its consequences are appended. Acks are
explicit and per message, so a crash leaves exactly the unacknowledged
messages to be redelivered; deciding again yields the same event ids and the
same expected sequences, so nothing is appended twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import uuid
from collections import OrderedDict
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from nats.errors import Error as NatsError
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from nats.js.errors import NotFoundError

from lodestream.eventlog import EventLog
from lodestream.eventlog.consumers import ensure_site_consumers, remove_site_consumers
from lodestream.eventlog.kernel import (
    Append,
    BatchDecide,
    BatchDecision,
    Committed,
    DeliveryCounts,
    batches,
    commit,
)
from lodestream.eventlog.pull import PullLoop, pull_consumer
from lodestream.eventlog.transient import transient
from lodestream.schemas.envelope import Event
from lodestream.schemas.errors import IllegalTransition, Untrusted, first_line
from lodestream.schemas.events import (
    AppRegistered,
    AppRemoved,
    AppUpdated,
    JobAwaitingParents,
    JobCreated,
    JobFailed,
    JobFinished,
    JobKilled,
    JobPostprocessed,
    JobReady,
    JobReset,
    JobRunDone,
    JobStagedOut,
    SiteRegistered,
    SiteRemoved,
)
from lodestream.schemas.fold import apply, check_creation
from lodestream.schemas.resources import App, JobSpec
from lodestream.schemas.subjects import (
    EVENTS_STREAM,
    HB_IN_STREAM,
    HB_STREAM,
    aggregate_filter,
    heartbeat_subject,
    parse_event_subject,
)
from lodestream.schemas.topology import CONTROLLER
from lodestream.schemas.trust import (
    WRITERS,
    HeartbeatExpired,
    event_from_message,
    heartbeat_message,
)
from lodestream.services.controller import decide, staging
from lodestream.services.controller.backlog import BacklogFeed, newest_batch_seq
from lodestream.services.controller.reads import ReadModel

log = logging.getLogger(__name__)

FINAL_EVENTS = frozenset({"job.finished", "job.failed", "job.killed"})
SPEC_CACHE_SIZE = 200_000
STARTUP_WAIT_S = 300.0
AWAITED_MAX = 1_000_000


async def ensure_durable(
    js: JetStreamContext, stream: str, durable: str, filters: list[str] | None
) -> None:
    config = ConsumerConfig(
        durable_name=durable,
        ack_policy=AckPolicy.EXPLICIT,
        deliver_policy=DeliverPolicy.ALL,
        ack_wait=10.0,
        max_ack_pending=20_000,
        filter_subjects=filters,
        description="lodestream controller",
    )
    try:
        info = await js.consumer_info(stream, durable)
    except NotFoundError:
        await js.add_consumer(stream, config)
        return
    # A newer controller may decide on more event types than the one that made the durable:
    # widen its filter in place (the server updates a durable's filter and keeps its position
    # and pending acks), so an upgrade loses nothing already delivered.
    if sorted(info.config.filter_subjects or []) != sorted(filters or []):
        log.info("controller: updating %s's filter to %s", durable, filters)
        await js.add_consumer(stream, config)


JobKey = tuple[str, uuid.UUID]
"""A job as the controller knows it: its own site and id, never what an event claims."""


def _ended_job(subject: str) -> JobKey | None:
    """The job a ``job.finished|failed|killed`` subject is about (None for any other subject)."""
    try:
        parsed = parse_event_subject(subject)
        if parsed.event_type not in FINAL_EVENTS:
            return None
        return parsed.site, uuid.UUID(parsed.aggregate_id)
    except ValueError:  # SubjectError included: the projector quarantines such messages
        return None


def _key(event: Event) -> JobKey:
    return event.site, event.aggregate_id


def _site_written(event: Event) -> bool:
    """A type a site key may append: the controller acts on it only once the projector has."""
    return "site" in WRITERS.get(event.type, frozenset())


class Controller:
    def __init__(
        self,
        js: JetStreamContext,
        dsn: str,
        *,
        durable: str = "controller",
        batch: int = 500,
        scaler_period_s: float = 10.0,
    ) -> None:
        self._js = js
        self._heartbeat_ttl_s: float | None = None  # HB's max age, read when first needed
        self._log = EventLog(js)
        self._reads = ReadModel(dsn)
        # The elastic queues' backlog, on a connection of its own (its queries must not
        # interleave with a batch's); 0 turns it off.
        self.backlog = (
            BacklogFeed(ReadModel(dsn), self._log, newest_batch_seq(js), period_s=scaler_period_s)
            if scaler_period_s > 0
            else None
        )
        self._durable = durable
        self._batch = batch
        self._apps: dict[tuple[str, str], App] = {}
        # Live sites and their owners, as the projector folds them (same events, same order):
        # a job.created the projector would refuse is not acted on here either.
        self._owners: dict[str, str] = {}
        self._specs: OrderedDict[JobKey, JobSpec] = OrderedDict()
        # Jobs that a job not yet released waits on. Only their end needs the read model (to
        # find the children); every other job's end is decided without waiting for the projector.
        # A superset is safe (it costs a query); None means "too many to track: always query".
        self._awaited: set[uuid.UUID] | None = set()
        self.committed = Committed()  # every append's fate (landed, duplicate, lost CAS)
        # Messages the shared rule refused (counted, logged, acked in their batch), and
        # batches left for redelivery because Postgres or NATS was away.
        self.counts = DeliveryCounts()

    @property
    def appended(self) -> int:
        return self.committed.appended

    @property
    def conflicts(self) -> int:
        return self.committed.lost

    @property
    def retried(self) -> int:
        return self.counts.retried

    @property
    def refused(self) -> int:
        return self.counts.refused

    async def run(self, stop: asyncio.Event) -> None:
        delay = 0.5
        while not stop.is_set():
            try:
                await self._start()
                break
            except Exception as exc:
                if not transient(exc):
                    raise
                # Postgres or NATS not there yet (or restarting): wait, do not crash-loop.
                log.warning("controller: cannot start yet (%s); retrying", first_line(exc))
                await self._reads.close()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), delay)
                delay = min(delay * 2, 10.0)
        if stop.is_set():
            await self._reads.close()
            return
        feeds = [
            self._consume(EVENTS_STREAM, self._durable, self._on_events, stop),
            self._consume(HB_STREAM, f"{self._durable}-hb", self._on_heartbeats, stop),
        ]
        if self.backlog is not None:
            feeds.append(self.backlog.run(stop))
        try:
            await asyncio.gather(*feeds)
        finally:
            await self._reads.close()
            if self.backlog is not None:
                await self.backlog.close()

    async def _start(self) -> None:
        # Everything before the stream's end is in the read model once the projector gets
        # there; everything after comes to us (unacked or new), including every job.created.
        info = await self._js.stream_info(EVENTS_STREAM)
        await self._reads.wait_for(int(info.state.last_seq), timeout_s=STARTUP_WAIT_S)
        self._awaited = await self._reads.awaited_parents()
        self._apps = await self._reads.apps()
        self._owners = await self._reads.live_sites()
        for site in self._owners:
            await ensure_site_consumers(self._js, site)
        await ensure_durable(self._js, EVENTS_STREAM, self._durable, CONTROLLER.filter_subjects())
        await ensure_durable(self._js, HB_STREAM, f"{self._durable}-hb", None)

    async def _consume(
        self, stream: str, durable: str, decide: BatchDecide, stop: asyncio.Event
    ) -> None:
        sub = await pull_consumer(self._js, stream, durable)
        pulling = PullLoop(sub, name=f"controller {stream}", batch=self._batch, timeout_s=0.5)
        handle = batches(decide, self._log, f"controller {stream}", committed=self.committed,
                         counts=self.counts, recover=self._reads.close)  # fmt: skip
        try:
            await pulling.run(handle, stop)
        finally:
            await sub.stop()

    # --- EVENTS ---------------------------------------------------------------------------

    async def _on_events(self, msgs: list[Any]) -> BatchDecision:
        ended = [(msg, _ended_job(msg.subject)) for msg in msgs]
        items = self._decoded([msg for msg, job in ended if job is None])
        self._await_parents_of(e for _, e in items)
        # Only now, so that a job.created earlier in this batch makes its parents awaited. The
        # end of a job nobody waits on (the most common delivery) is not even decoded.
        ends = [msg for msg, job in ended if job is not None and self._is_awaited(job[1])]
        items = sorted(items + self._decoded(ends), key=lambda item: item[0])
        appends: list[Append] = []
        needs_reads = any(self._needs_reads(e) for _, e in items)
        if needs_reads:
            await self._reads.wait_for(max(seq for seq, _ in items))
            items = await self._accepted(items)
        for seq, event in items:
            appends += await self._decide(seq, event)
        # Their children are decided: once that is committed, nobody waits on these jobs.
        finals = [e.aggregate_id for _, e in items if e.type in FINAL_EVENTS]
        return BatchDecision(appends, functools.partial(self._forget_awaited, finals))

    def _forget_awaited(self, ended: list[uuid.UUID]) -> None:
        if self._awaited is not None:
            self._awaited.difference_update(ended)

    def _decoded(self, msgs: list[Any]) -> list[tuple[int, Event]]:
        items: list[tuple[int, Event]] = []
        for msg in msgs:
            seq = msg.metadata.sequence.stream
            try:
                items.append((seq, event_from_message(msg.subject, msg.data)))
            except Untrusted as exc:
                # The projector quarantines it too (same rule); there is nothing to decide.
                self.counts.refused += 1
                log.warning("controller: refused seq %d (%s): %s", seq, msg.subject, exc)
        return items

    async def _accepted(self, items: list[tuple[int, Event]]) -> list[tuple[int, Event]]:
        """Drop what a site wrote that the projector refused (an illegal transition).

        A site key may append its own types on its own subjects, in any state; only the fold
        knows whether the step was legal. The read model has reached these sequences, so a
        site-written event that is not among the job's applied events was quarantined.
        """
        # Transfer items are judged by their rows alone (settle_step reads the step's states,
        # not the event), so only job events need the check.
        checked = [seq for seq, event in items if _site_written(event) and event.kind == "job"]
        if not checked:
            return items
        applied = await self._reads.applied(checked)
        kept = []
        for seq, event in items:
            if _site_written(event) and event.kind == "job" and seq not in applied:
                self.counts.refused += 1
                log.warning("controller: %s seq %d was quarantined; not acting on it",
                            event.type, seq)  # fmt: skip
                continue
            kept.append((seq, event))
        return kept

    def _await_parents_of(self, events: Iterable[Event]) -> None:
        if self._awaited is None:
            return
        for event in events:
            if isinstance(event, JobCreated):
                self._awaited.update(event.data.parent_ids)
        if len(self._awaited) > AWAITED_MAX:
            log.warning("controller: over %d awaited parents; reading children always", AWAITED_MAX)
            self._awaited = None

    def _needs_reads(self, event: Event) -> bool:
        if isinstance(event, JobCreated):
            return bool(event.data.parent_ids)
        if event.type in FINAL_EVENTS:
            return self._is_awaited(event.aggregate_id)
        # What a site wrote is acted on only once the fold has accepted it (see _accepted).
        return event.type == "job.awaiting_parents" or (
            event.kind in {"job", "xfer"}
            and _site_written(event)
            and CONTROLLER.carries(event.type)
        )

    def _is_awaited(self, job_id: uuid.UUID) -> bool:
        return self._awaited is None or job_id in self._awaited

    async def _decide(self, seq: int, event: Event) -> list[Append]:
        if event.kind in {"app", "site"}:
            await self._learn(event)
            return []
        if event.kind == "xfer":
            return await self._settle_transfer(event)
        if isinstance(event, JobCreated):
            return await self._created(seq, event)
        spec = await self._spec(_key(event))
        if spec is None:  # no such job at this site: nothing to decide, whatever it claims
            return []
        return await self._follow_up(seq, event, spec)

    async def _created(self, seq: int, event: JobCreated) -> list[Append]:
        created = event.data
        try:
            check_creation(event, self._owners.get(event.site))
            apply(None, event, seq)  # a skip the projector quarantines: nothing to do either
        except IllegalTransition as exc:
            self.counts.refused += 1
            log.warning("controller: not creating job %s: %s", event.aggregate_id, exc)
            return []
        self._remember(_key(event), created)
        if event.runnable:  # launch-<site> hands it to the pilots as it is
            return []
        parents = await self._reads.states(list(created.parent_ids))
        return decide.on_created_or_waiting(
            event, event.aggregate_id, seq, created, self._app(created),
            parents=parents, waiting=False,
        )  # fmt: skip

    async def _follow_up(self, seq: int, event: Event, spec: JobSpec) -> list[Append]:
        """What follows a step of a job the controller knows; dispatched on the event's class."""
        app, job = self._app(spec), event.aggregate_id
        out: list[Append] = []
        match event:
            case JobAwaitingParents():
                parents = await self._reads.states(list(spec.parent_ids))
                out = decide.on_created_or_waiting(
                    event, job, seq, spec, app, parents=parents, waiting=True
                )
            case JobFinished() | JobFailed() | JobKilled() if self._is_awaited(job):
                out = await self._parent_done(event)
            case JobRunDone():
                out = decide.on_run_done(event, seq, spec, app)
            case JobPostprocessed():
                out = decide.on_postprocessed(event, seq, spec, app)
                out += staging.request_items(event, job, spec, app, "out")
            case JobStagedOut():
                out = decide.on_staged_out(event, seq, spec)
            case JobReset():
                out = decide.advance(event, job, seq, spec, app, from_ready=True)
                out += staging.request_items(event, job, spec, app, "in")
            case JobReady():  # READY with files to stage in: the step begins (advance() leaves it)
                out = staging.request_items(event, job, spec, app, "in")
        return out

    async def _parent_done(self, event: Event) -> list[Append]:
        children = await self._reads.waiting_children(event.aggregate_id)
        wanted = sorted({p for _, _, child in children for p in child.parent_ids})
        parents = await self._reads.states(wanted)
        return decide.on_parent_done(event, children, parents, self._apps)

    async def _settle_transfer(self, event: Event) -> list[Append]:
        """An item settled (its site wrote it; the projector has folded it): end its step?"""
        if event.type not in {"xfer.succeeded", "xfer.failed"}:
            return []
        step = await self._reads.step(event.site, event.aggregate_id)
        if step is None:
            return []
        spec = await self._spec((event.site, step.job_id))
        return staging.settle_step(event, step, spec) if spec is not None else []

    async def _learn(self, event: Event) -> None:
        """Apps and sites: what the controller must know, and the consumers it must provide."""
        match event:
            case AppRegistered(data=app) | AppUpdated(data=app):
                self._apps[(app.site, app.name)] = app
            case AppRemoved(data=data):
                self._apps.pop((event.site, data.name), None)
            case SiteRegistered(data=registered):
                self._owners.setdefault(event.site, registered.owner)
                await ensure_site_consumers(self._js, event.site)
            case SiteRemoved():
                self._owners.pop(event.site, None)
                await remove_site_consumers(self._js, event.site)

    def _app(self, spec: JobSpec) -> App | None:
        return self._apps.get((spec.site, spec.app))

    def _remember(self, key: JobKey, spec: JobSpec) -> None:
        self._specs[key] = spec
        if len(self._specs) > SPEC_CACHE_SIZE:
            self._specs.popitem(last=False)

    async def _spec(self, key: JobKey) -> JobSpec | None:
        spec = self._specs.get(key)
        if spec is None:
            spec = await self._reads.spec(*key)
            if spec is not None:
                self._remember(key, spec)
        return spec

    # --- HB -------------------------------------------------------------------------------

    async def _on_heartbeats(self, msgs: list[Any]) -> BatchDecision:
        """Expire the sessions whose heartbeat aged out. Each expiry commits its own rounds
        (a round decides on what the last one left), so the batch has nothing more."""
        for msg in msgs:
            try:
                beat = heartbeat_message(msg.subject, msg.headers, msg.data)
            except Untrusted as exc:
                self.counts.refused += 1
                log.warning("controller: refused heartbeat %s: %s", msg.subject, exc)
                continue
            if isinstance(beat, HeartbeatExpired):
                await self._expire(beat.site, beat.session_id, msg.metadata.sequence.stream)
        return BatchDecision(())

    async def _expire(self, site: str, session_id: uuid.UUID, marker_seq: int) -> None:
        """Fence every job the dead session holds; retry until none is left or it moved on."""
        if await self._beating_in_hbin(site, session_id):
            log.warning("session %s: HB aged out its heartbeat, but HBIN holds a newer one: "
                        "HB's sourcing lags (a leader moved); not expired", session_id)  # fmt: skip
            return
        for _ in range(5):
            info = await self._js.stream_info(EVENTS_STREAM)
            caught_up = int(info.state.last_seq)
            await self._reads.wait_for(caught_up)
            held = await self._reads.held_by(site, session_id)
            batch = await self._reads.session_batch(site, session_id) if held else None
            session_seq = await self._reads.session_seq(site, session_id)
            if session_seq is not None:
                session_seq = await self._newest_of_session(
                    site, session_id, session_seq, caught_up
                )
            appends = decide.on_session_expired(
                site, session_id, marker_seq, held, datetime.now(UTC), batch=batch,
                session_seq=session_seq,
            )  # fmt: skip
            if not await self._commit(appends):
                return
        log.warning("session %s: leases still moving after 5 expiry rounds", session_id)

    async def _newest_of_session(
        self, site: str, session_id: uuid.UUID, applied: int, caught_up: int
    ) -> int:
        """The sequence ``session.expired`` is compare-and-set on: the session's newest event
        the read model applied (``applied``), or the newest message on the session's
        subjects if that is later and the read model has caught up past it.

        A site can write on its own sessions' subjects what the projector quarantines; that
        message is still the subjects' newest, and a compare-and-set on ``applied`` would
        lose every round. Every message on them after ``applied`` and up to ``caught_up``
        was quarantined (else the read model would show it), so the expiry goes on top of
        the newest. One after ``caught_up`` is news: the next round decides on it.
        """
        try:
            newest = await self._js.get_last_msg(
                EVENTS_STREAM, aggregate_filter(site, "session", session_id)
            )
        except (NatsError, TimeoutError):  # none (404), or unreadable: the read model's
            return applied
        seq = int(newest.seq or 0)
        return seq if applied < seq <= caught_up else applied

    async def _beating_in_hbin(self, site: str, session_id: uuid.UUID) -> bool:
        """Whether ``HBIN`` holds a heartbeat of the session less than half a TTL old.

        HB receives heartbeats by sourcing HBIN, and the source stalls while a cluster moves
        a leader: HB can age out a live pilot's heartbeat while its newer ones wait in HBIN
        (found with a partitioned node). Such a heartbeat reaches HB when the source resumes,
        and HB's own timer marks the session again if the pilot then dies. Half a TTL: the
        heartbeat HB aged out is at least a TTL old, so a newer one cannot be mistaken for
        it across small clock differences between nodes. When HBIN cannot be read, the
        marker's verdict stands. The TTL is HB's own max age, whatever this process was told.
        """
        try:
            if self._heartbeat_ttl_s is None:
                max_age = (await self._js.stream_info(HB_STREAM)).config.max_age
                self._heartbeat_ttl_s = float(max_age or 0)
            stored = await self._js.get_msg(
                HB_IN_STREAM, subject=heartbeat_subject(site, session_id)
            )
        except (NatsError, TimeoutError):
            return False
        if stored.time is None:
            return False
        age_s = (datetime.now(UTC) - stored.time).total_seconds()
        return age_s < self._heartbeat_ttl_s / 2

    # --- appending ------------------------------------------------------------------------

    async def _commit(self, appends: list[Append]) -> int:
        """Commit ``appends`` now (see :func:`~lodestream.eventlog.kernel.commit`); return
        how many lost their compare-and-set (the aggregate moved on)."""
        done = await commit(self._log, appends)
        self.committed.add(done)
        return done.lost
