"""What a chaos run must leave behind, read from the log (the truth) and the read model."""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from nats.js import JetStreamContext

from lodestream.schemas.codec import decode
from lodestream.schemas.envelope import Event
from lodestream.schemas.events.job import RetryData, RunResultData, StartedData
from lodestream.schemas.subjects import EVENTS_STREAM, HB_STREAM
from lodestream.services.projector.rebuild import Rebuild, read_stream
from tests.chaos.workload import Wave
from tests.support.projection import table_digest

RERUN_EXPLAINED_BY = frozenset({"job.lease_expired", "job.run_timed_out"})
# Tables whose rows are a pure fold of EVENTS (sessions also fold HB, which ages out).
COMPARED_TABLES = ("jobs", "job_events", "sites", "apps", "quarantine")
RUNS_FILE = "runs.log"  # the chaos app appends one line to it each time it starts


@dataclass(frozen=True, slots=True)
class LogEvent:
    seq: int
    event: Event

    def __str__(self) -> str:
        data = self.event.data
        extra = ""
        if isinstance(data, StartedData):
            extra = f" session={data.session_id} attempt={data.attempt}"
        elif isinstance(data, RunResultData) and data.cause:
            extra = f" cause={list(data.cause)}"
        elif (reason := getattr(data, "reason", "")) != "":
            extra = f" reason={reason!r}"
        return f"  seq {self.seq:>6} {self.event.type:<22} by {self.event.actor}{extra}"


@dataclass
class Log:
    """Every event of ``EVENTS``, job events grouped by job, in stream order."""

    jobs: dict[uuid.UUID, list[LogEvent]]
    event_ids: Counter[uuid.UUID]
    last_seq: int

    def history(self, job_id: uuid.UUID) -> str:
        return "\n".join(str(e) for e in self.jobs.get(job_id, []))

    def count(self, job_id: uuid.UUID, event_type: str) -> int:
        return sum(1 for e in self.jobs.get(job_id, []) if e.event.type == event_type)

    def created(self) -> list[uuid.UUID]:
        return [job for job in self.jobs if self.count(job, "job.created")]


async def read_log(js: JetStreamContext) -> Log:
    info = await js.stream_info(EVENTS_STREAM)
    last = int(info.state.last_seq)
    jobs: dict[uuid.UUID, list[LogEvent]] = defaultdict(list)
    ids: Counter[uuid.UUID] = Counter()
    async for raws in read_stream(js, EVENTS_STREAM, 1, last, 1000):
        for raw in raws:
            event = decode(raw.data)
            ids[event.id] += 1
            if event.kind == "job":
                jobs[event.aggregate_id].append(LogEvent(raw.seq, event))
    return Log(dict(jobs), ids, last)


def unexplained_reruns(events: list[LogEvent]) -> list[str]:
    """Each ``job.started`` after the first needs, since the one before it, the end of that
    run's lease: its lease expired or its run timed out, for the session that started it."""
    problems = []
    session: uuid.UUID | None = None
    since: list[LogEvent] = []
    for item in events:
        data = item.event.data
        if isinstance(data, StartedData):
            if session is not None and not any(ends_lease(e.event, session) for e in since):
                seen = [e.event.type for e in since]
                problems.append(f"seq {item.seq}: started again after only {seen}")
            session, since = data.session_id, []
        else:
            since.append(item)
    return problems


def early_starts(events: list[LogEvent]) -> list[str]:
    """Starts before the retry they follow was due: no pilot may lease a job before the
    ``retry_at`` of its last ``job.restart_ready`` (all clocks here are one machine's)."""
    problems = []
    due = None
    for item in events:
        data = item.event.data
        if isinstance(data, RetryData):
            due = data.retry_at
        elif isinstance(data, StartedData):
            if due is not None and item.event.occurred_at < due:
                problems.append(f"seq {item.seq}: started {due - item.event.occurred_at} early")
            due = None
    return problems


def ends_lease(event: Event, session: uuid.UUID) -> bool:
    """Whether ``event`` ends the lease of ``session``: the controller expiring it, or the
    pilot of that session giving its run up (drain)."""
    if event.type not in RERUN_EXPLAINED_BY:
        return False
    data: Any = event.data
    if getattr(data, "session_id", None) == session or event.actor == f"launcher:{session}":
        return True
    return any(str(session) in cause for cause in getattr(data, "cause", ()))


def rerun_causes(events: list[LogEvent]) -> list[str]:
    """Why a job ran more than once: the causes of its expiries and timeouts."""
    causes = []
    for item in events:
        if item.event.type in RERUN_EXPLAINED_BY:
            data: Any = item.event.data
            cause = getattr(data, "cause", ()) or (getattr(data, "reason", ""),)
            causes.append(f"{item.event.type} by {item.event.actor}: {'; '.join(cause)}")
    return causes


def runs_recorded(data_dir: Path, workdir: str) -> int:
    """How many times the app started in ``workdir`` (lines of its marker file)."""
    try:
        return len((data_dir / workdir / RUNS_FILE).read_text().splitlines())
    except FileNotFoundError:
        return 0


JobRow = tuple[str, int, int, int | None]  # state, last_seq, attempts, return_code


async def job_rows(dsn: str) -> dict[uuid.UUID, JobRow]:
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        cursor = await conn.execute(
            "SELECT id, state, last_seq, attempts, return_code FROM rm.jobs ORDER BY id"
        )
        return {r[0]: (str(r[1]), int(r[2]), int(r[3]), r[4]) for r in await cursor.fetchall()}


async def job_event_counts(dsn: str) -> dict[uuid.UUID, int]:
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        cursor = await conn.execute("SELECT job_id, count(*) FROM rm.job_events GROUP BY job_id")
        return {r[0]: int(r[1]) for r in await cursor.fetchall()}


async def final_states(dsn: str, ids: list[uuid.UUID]) -> Counter[str]:
    """States of ``ids`` in the read model; a job not there counts as ``MISSING``."""
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        cursor = await conn.execute("SELECT id, state FROM rm.jobs WHERE id = ANY(%s)", (ids,))
        found = {r[0]: str(r[1]) for r in await cursor.fetchall()}
    return Counter(found.get(job, "MISSING") for job in ids)


async def check(
    log: Log, dsn: str, ids: list[uuid.UUID], waves: list[Wave], data_dir: Path
) -> list[str]:
    """Everything the log and the read model must say; one line per problem."""
    problems: list[str] = []
    states = await final_states(dsn, ids)
    rows = await job_rows(dsn)
    if states != Counter({"JOB_FINISHED": len(ids)}):
        problems.append(f"final states {dict(states)}, wanted all {len(ids)} JOB_FINISHED")
        unfinished = [job for job in ids if rows.get(job, ("MISSING",))[0] != "JOB_FINISHED"]
        problems += [f"job {job} is {rows.get(job, ('MISSING',))[0]}:\n{log.history(job)}"
                     for job in unfinished[:10]]  # fmt: skip
    created = log.created()
    if not len(created) == len(ids) == len(rows) or set(created) != set(ids):
        problems.append(f"submitted {len(ids)}, job.created on the log {len(created)}, "
                        f"rows in rm.jobs {len(rows)}")  # fmt: skip
    duplicated = [str(event_id) for event_id, n in log.event_ids.items() if n > 1]
    if duplicated:
        problems.append(f"event ids stored more than once: {duplicated[:10]}")
    workdirs = {job.aggregate_id: job.data.workdir for wave in waves for job in wave.jobs}
    for job in ids:
        events = log.jobs.get(job, [])
        trouble = unexplained_reruns(events) + early_starts(events)
        started = log.count(job, "job.started")
        runs = runs_recorded(data_dir, workdirs[job])
        if runs > started:
            trouble.append(f"the app ran {runs} times but started {started} times")
        elif runs < started and not rerun_causes(events):
            trouble.append(f"started {started} times, ran {runs}, and no lease expired")
        if rows.get(job, ("",))[0] == "JOB_FINISHED" and runs == 0:
            trouble.append("finished without ever running")
        if log.count(job, "job.finished") > 1:
            trouble.append("finished more than once")
        if trouble:
            problems.append(f"job {job}: {'; '.join(trouble)}\n{log.history(job)}")
    problems += parents_first(log, waves)
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        cursor = await conn.execute("SELECT seq, subject, reason FROM rm.quarantine ORDER BY seq")
        problems += [f"quarantined: {row}" for row in await cursor.fetchall()]
    return problems


def parents_first(log: Log, waves: list[Wave]) -> list[str]:
    """A child starts only after its parent finished (DAG release)."""
    problems = []
    for job in (job for wave in waves for job in wave.jobs if job.data.parent_ids):
        (parent,) = job.data.parent_ids
        finished = [e.seq for e in log.jobs.get(parent, []) if e.event.type == "job.finished"]
        started = [e.seq for e in log.jobs.get(job.aggregate_id, [])
                   if e.event.type == "job.started"]  # fmt: skip
        if started and (not finished or min(started) < finished[0]):
            problems.append(f"job {job.aggregate_id} started before its parent {parent} finished")
    return problems


async def compare_with_rebuild(js: JetStreamContext, dsn: str, timeout_s: float) -> list[str]:
    """The live projector's tables against a fold of the log from sequence 1."""
    rows, counts, digest = await job_rows(dsn), await job_event_counts(dsn), await table_digest(dsn)
    try:
        async with asyncio.timeout(timeout_s):
            await Rebuild(js, dsn).run()
    except TimeoutError:
        streams = {name: (await js.stream_info(name)).state for name in (EVENTS_STREAM, HB_STREAM)}
        return [f"the rebuild did not finish within {timeout_s:g} s; streams: {streams}"]
    rebuilt_rows, rebuilt_counts = await job_rows(dsn), await job_event_counts(dsn)
    rebuilt_digest = await table_digest(dsn)
    problems = []
    differing = [job for job in rows.keys() | rebuilt_rows.keys()
                 if rows.get(job) != rebuilt_rows.get(job)]  # fmt: skip
    for job in differing[:10]:
        problems.append(f"rm.jobs {job}: live {rows.get(job)} != rebuilt {rebuilt_rows.get(job)}")
    if counts != rebuilt_counts:
        problems.append(f"rm.job_events: live {sum(counts.values())} rows, "
                        f"rebuilt {sum(rebuilt_counts.values())}")  # fmt: skip
    for table in COMPARED_TABLES:
        if digest[table] != rebuilt_digest[table]:
            problems.append(f"rm.{table}: live {digest[table]} != rebuilt {rebuilt_digest[table]}")
    return problems


def summary(
    log: Log, ids: list[uuid.UUID], waves: list[Wave], data_dir: Path, *, rounds: int
) -> str:
    starts = {job: log.count(job, "job.started") for job in ids}
    twice = {job: n for job, n in starts.items() if n > 1}
    causes: Counter[str] = Counter()
    for job in twice:
        for cause in rerun_causes(log.jobs[job]):
            causes[cause.split(":")[0]] += 1
    runs = sum(runs_recorded(data_dir, job.data.workdir) for wave in waves for job in wave.jobs)
    lines = [
        f"chaos: {len(ids)} jobs, {rounds} round(s), {log.last_seq} events on the log",
        f"job.started events {sum(starts.values())}, runs the app recorded {runs}",
        f"jobs started more than once: {len(twice)} (starts: {dict(Counter(twice.values()))})",
        f"why: {dict(causes)}",
    ]
    lines += [f"job {job}:\n{log.history(job)}" for job in list(twice)[:3]]
    return "\n".join(lines)
