"""A realistic log for the analytics benchmark, generated fast.

Jobs arrive at two sites as a Poisson stream; pilot sessions of 16 nodes each run them.
Each job takes one of four paths (the shares of :data:`PATHS`), with run times drawn from a
log-normal distribution:

* plain (75 %): created, preprocessed (ready and staged_in skipped), started (lease taken
  with it), run_done, finished (postprocess and stage-out skipped) — five events;
* staged (5 %): created, ready, staged_in, preprocessed, started, run_done, postprocessed,
  staged_out, finished — nine;
* retried (10 %): created, preprocessed, started, run_errored, restart_ready, started
  (attempt 2), run_done, finished — eight;
* failed (10 %): created, preprocessed, started, run_errored, failed — five.

Events are JSON documents made once by the pydantic models and turned into ``%s`` templates
(:class:`bench.workload.Template`), each checked to decode and pass the shared rule; the
whole log is sorted by time, as a real log is ordered.
"""

from __future__ import annotations

import heapq
import itertools
import math
import random
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any, Final

from bench.workload import Ids, Outgoing, Template
from lodestream.eventlog.append import H_EXPECTED_STREAM, H_MSG_ID
from lodestream.schemas.envelope import Event
from lodestream.schemas.events import (
    JobCreated,
    JobFailed,
    JobFinished,
    JobPostprocessed,
    JobPreprocessed,
    JobReady,
    JobRestartReady,
    JobRunDone,
    JobRunErrored,
    JobStagedIn,
    JobStagedOut,
    JobStarted,
    SessionClosed,
    SessionOpened,
)
from lodestream.schemas.events.job import (
    FailureData,
    FinishedData,
    RetryData,
    RunResultData,
    StartedData,
    StepData,
)
from lodestream.schemas.events.session import SessionOpenedData
from lodestream.schemas.resources import JobSpec, NodeInfo
from lodestream.schemas.subjects import EVENTS_STREAM
from lodestream.schemas.trust import event_from_message

Slots = dict[str, tuple[str, ...]]
SITES: Final = ("bench-a", "bench-b")
APPS: Final = ("sim", "reco", "calib", "train")
PATHS: Final = (("plain", 75), ("staged", 5), ("retried", 10), ("failed", 10))
EVENTS_PER_JOB: Final = (
    sum(n * share for n, (_, share) in zip((5, 9, 8, 5), PATHS, strict=True)) / 100
)
NODES_PER_SESSION: Final = 16
JOBS_PER_SESSION: Final = 2000
ARRIVALS_PER_S: Final = 50.0

_ENVELOPE: Final[Slots] = {"id": ("id",), "agg": ("aggregate_id",), "at": ("occurred_at",)}
_BY_PILOT: Final[Slots] = {**_ENVELOPE, "actor": ("actor",)}
_STARTED: Final[Slots] = {**_BY_PILOT, "session": ("data", "session_id")}
_CREATED: Final[Slots] = {**_ENVELOPE, "app": ("data", "app"), "workdir": ("data", "workdir"),
                   "campaign": ("data", "tags", "campaign")}  # fmt: skip
_SESSION: Final[Slots] = {**_BY_PILOT, "deadline": ("data", "deadline")}


class LogGenerator:
    """Templates for every event the paths use, at one site each."""

    def __init__(self, owner: str, seed: int = 14) -> None:
        self.ids = Ids()
        self.rng = random.Random(seed)
        self.templates = {site: self._templates(site, owner) for site in SITES}

    def _templates(self, site: str, owner: str) -> dict[str, tuple[Template, str]]:
        job, session = uuid.uuid4(), uuid.uuid4()
        pilot = f"launcher:{session}"
        spec = JobSpec.model_validate({"site": site, "app": "sim", "workdir": "w/x",
                                       "tags": {"campaign": "c0"}})  # fmt: skip
        run = RunResultData(return_code=0, runtime_s=1.0)
        made: dict[str, tuple[Event, dict[str, tuple[str, ...]]]] = {
            "created": (JobCreated.create(site=site, aggregate_id=job, actor=f"user:{owner}",
                                          data=spec), _CREATED),
            "ready": (JobReady.create(site=site, aggregate_id=job, actor="controller:bench"),
                      _ENVELOPE),
            "staged_in": (JobStagedIn.create(site=site, aggregate_id=job, actor=f"site:{site}"),
                          _ENVELOPE),
            "preprocessed": (JobPreprocessed.create(
                site=site, aggregate_id=job, actor="controller:bench",
                data=StepData(skipped=("job.ready", "job.staged_in"))), _ENVELOPE),
            "preprocessed_hook": (JobPreprocessed.create(
                site=site, aggregate_id=job, actor=f"site:{site}"), _ENVELOPE),
            "started": (JobStarted.create(site=site, aggregate_id=job, actor=pilot,
                data=StartedData(session_id=session, skipped=("job.leased",))), _STARTED),
            "started_2": (JobStarted.create(site=site, aggregate_id=job, actor=pilot,
                data=StartedData(session_id=session, skipped=("job.leased",), attempt=2)),
                _STARTED),
            "run_done": (JobRunDone.create(site=site, aggregate_id=job, actor=pilot, data=run),
                         _BY_PILOT),
            "run_done_2": (JobRunDone.create(site=site, aggregate_id=job, actor=pilot,
                data=RunResultData(return_code=0, runtime_s=1.0, attempt=2)), _BY_PILOT),
            "run_errored": (JobRunErrored.create(site=site, aggregate_id=job, actor=pilot,
                data=RunResultData(return_code=1, stderr_tail="Segmentation fault\n",
                                   runtime_s=1.0)), _BY_PILOT),
            "restart_ready": (JobRestartReady.create(site=site, aggregate_id=job,
                actor=f"site:{site}", data=RetryData(attempt=2, reason="retry after error")),
                _ENVELOPE),
            "failed": (JobFailed.create(site=site, aggregate_id=job, actor=f"site:{site}",
                data=FailureData(reason="run error on attempt 1 (retry budget exhausted)",
                                 cause=("Segmentation fault",))), _ENVELOPE),
            "postprocessed": (JobPostprocessed.create(site=site, aggregate_id=job,
                                                      actor=f"site:{site}"), _ENVELOPE),
            "staged_out": (JobStagedOut.create(site=site, aggregate_id=job, actor=f"site:{site}"),
                           _ENVELOPE),
            "finished": (JobFinished.create(site=site, aggregate_id=job, actor="controller:bench",
                data=FinishedData(skipped=("job.postprocessed", "job.staged_out"))), _ENVELOPE),
            "finished_staged": (JobFinished.create(site=site, aggregate_id=job,
                                                   actor="controller:bench"), _ENVELOPE),
            "opened": (SessionOpened.create(site=site, aggregate_id=session, actor=pilot,
                data=SessionOpenedData(hostname="login1", deadline=datetime.now(UTC),
                    heartbeat_ttl_s=10, nodes=tuple(NodeInfo(hostname=f"n{i}", cores=64)
                                                    for i in range(NODES_PER_SESSION)))),
                _SESSION),
            "closed": (SessionClosed.create(site=site, aggregate_id=session, actor=pilot),
                       _BY_PILOT),
        }  # fmt: skip
        return {
            name: (Template(event.model_dump(mode="json"), slots), event.subject.split(".")[2])
            for name, (event, slots) in made.items()
        }

    def event(self, site: str, name: str, aggregate: str, at: float, **values: str) -> Outgoing:
        template, kind = self.templates[site][name]
        event_id = self.ids.take()
        stamp = datetime.fromtimestamp(at, UTC).isoformat()
        payload = template.fill({"id": event_id, "agg": aggregate, "at": stamp, **values})
        step = name.removesuffix("_2")
        step = {"preprocessed_hook": "preprocessed", "finished_staged": "finished"}.get(step, step)
        subject = f"evt.{site}.{kind}.{aggregate}.{step}"
        return subject, payload, {H_MSG_ID: event_id, H_EXPECTED_STREAM: EVENTS_STREAM}

    def check(self) -> None:
        """Every template, filled, passes the shared rule on its subject."""
        for site in SITES:
            for name in self.templates[site]:
                values: dict[str, Any] = {"actor": f"launcher:{uuid.uuid4()}",
                                          "session": str(uuid.uuid4()), "app": "sim",
                                          "workdir": "w/1", "campaign": "c1",
                                          "deadline": datetime.now(UTC).isoformat()}  # fmt: skip
                subject, payload, _ = self.event(site, name, str(uuid.uuid4()), 1e9, **values)
                event_from_message(subject, payload)

    def jobs(self, count: int, start: float) -> Iterator[tuple[float, Outgoing]]:
        """``count`` jobs' events and their sessions', each with its time, job by job."""
        rng = self.rng
        sessions: dict[str, tuple[str, str, float]] = {}  # site → id, actor, last event
        at = start
        for i in range(count):
            at += rng.expovariate(ARRIVALS_PER_S)
            site = SITES[i % len(SITES)]
            if i % (JOBS_PER_SESSION * len(SITES)) < len(SITES):  # a new pilot takes over
                if site in sessions:
                    yield self._close(site, *sessions[site])
                session = str(uuid.uuid4())
                actor = f"launcher:{session}"
                sessions[site] = (session, actor, at)
                yield at, self.event(site, "opened", session, at, actor=actor,
                                     deadline=_iso(at + 86400))  # fmt: skip
            session, actor, end = sessions[site]
            events, last = self._job(site, i, at, session, actor)
            sessions[site] = (session, actor, max(end, last))
            yield from events
        for site, held in sessions.items():
            yield self._close(site, *held)

    def _close(self, site: str, session: str, actor: str, end: float) -> tuple[float, Outgoing]:
        return end + 1, self.event(site, "closed", session, end + 1, actor=actor)

    def _job(self, site: str, i: int, at: float, session: str, actor: str
             ) -> tuple[list[tuple[float, Outgoing]], float]:  # fmt: skip
        rng = self.rng
        job = self.ids.take()
        path = rng.choices([p for p, _ in PATHS], weights=[w for _, w in PATHS])[0]
        created = self.event(site, "created", job, at, app=APPS[i % len(APPS)],
                             workdir=f"bench/{i}", campaign=f"c{i % 7}")  # fmt: skip
        steps: list[tuple[str, float]] = []
        t = at
        if path == "staged":
            steps += [("ready", t := t + 0.05), ("staged_in", t := t + rng.uniform(1, 5)),
                      ("preprocessed_hook", t := t + 0.1)]  # fmt: skip
        else:
            steps.append(("preprocessed", t := t + 0.05))
        steps.append(("started", t := t + rng.expovariate(2.0)))
        run_s = math.exp(rng.gauss(1.5, 0.6))
        if path in ("retried", "failed"):
            steps.append(("run_errored", t := t + run_s / 3))
            if path == "failed":
                steps.append(("failed", t := t + 0.05))
                return self._fill(site, job, created, at, steps, session, actor), t
            steps += [("restart_ready", t := t + 0.05),
                      ("started_2", t := t + rng.expovariate(2.0)),
                      ("run_done_2", t := t + run_s)]  # fmt: skip
        else:
            steps.append(("run_done", t := t + run_s))
        if path == "staged":
            steps += [("postprocessed", t := t + 0.1), ("staged_out", t := t + rng.uniform(1, 5)),
                      ("finished_staged", t := t + 0.05)]  # fmt: skip
        else:
            steps.append(("finished", t := t + 0.05))
        return self._fill(site, job, created, at, steps, session, actor), t

    def _fill(self, site: str, job: str, created: Outgoing, at: float,
              steps: list[tuple[str, float]], session: str, actor: str
              ) -> list[tuple[float, Outgoing]]:  # fmt: skip
        out = [(at, created)]
        for name, when in steps:
            out.append((when, self.event(site, name, job, when, actor=actor, session=session)))
        return out


def _iso(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).isoformat()


def generate(events: int, owner: str, start: datetime | None = None) -> Iterator[Outgoing]:
    """About ``events`` events (whole jobs), in time order.

    Jobs are made in arrival order and their events held in a heap until the arrivals pass
    their time, so only the jobs in flight are in memory, not the whole log.
    """
    generator = LogGenerator(owner)
    generator.check()
    begin = (start or datetime.now(UTC) - timedelta(days=1)).timestamp()
    pending: list[tuple[float, int, Outgoing]] = []
    order = itertools.count()
    for at, outgoing in generator.jobs(math.ceil(events / EVENTS_PER_JOB), begin):
        while pending and pending[0][0] <= at:
            yield heapq.heappop(pending)[2]
        heapq.heappush(pending, (at, next(order), outgoing))
    while pending:
        yield heapq.heappop(pending)[2]
