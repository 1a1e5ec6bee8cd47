"""Synthetic logs for the analytics tests: real events at chosen times, in log order.

Each method appends one event (valid under the shared rule, with the actor its writer
signs with) at ``T0 + at`` seconds and returns what a later step needs. :meth:`Log.raws`
gives the messages as the stream would hold them, :meth:`Log.loaded` the replay of them.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any, Final

from lodestream.client.analytics.intake import Raw
from lodestream.client.analytics.replay import Replay
from lodestream.client.analytics.selection import Selection
from lodestream.client.analytics.summary import Loaded
from lodestream.schemas.codec import encode
from lodestream.schemas.envelope import Event
from lodestream.schemas.events import (
    BatchJobFinished,
    BatchJobRequested,
    BatchJobRunning,
    BatchJobSubmitted,
    JobCreated,
    JobFailed,
    JobFinished,
    JobLeased,
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
from lodestream.schemas.events.app import AppRegistered
from lodestream.schemas.events.batch import BatchFinishedData, BatchRequestData, BatchSubmittedData
from lodestream.schemas.events.job import (
    CreatedData,
    FailureData,
    FinishedData,
    LeaseData,
    RetryData,
    RunResultData,
    StartedData,
    StepData,
)
from lodestream.schemas.events.session import SessionOpenedData
from lodestream.schemas.resources import App, NodeInfo
from lodestream.schemas.states import CREATED_RUNNABLE, FINISHED_AT_RUN_END

T0: Final = datetime(2026, 1, 1, tzinfo=UTC)
T0_S: Final = T0.timestamp()
OWNER: Final = "ada"


class Log:
    def __init__(self) -> None:
        self.events: list[tuple[int, Event]] = []
        self.sites: dict[uuid.UUID, str] = {}

    @staticmethod
    def at(seconds: float) -> datetime:
        return T0 + timedelta(seconds=seconds)

    def add(self, event: Event) -> Event:
        self.events.append((len(self.events) + 1, event))
        return event

    def _job(self, cls: type[Event], job: uuid.UUID, at: float, actor: str,
             data: Any = None) -> Event:  # fmt: skip
        site = self.sites[job]
        return self.add(cls.create(site=site, aggregate_id=job, actor=actor, data=data,
                                   occurred_at=self.at(at)))  # fmt: skip

    # --- jobs -------------------------------------------------------------------------

    def created(
        self,
        at: float,
        *,
        site: str = "alpha",
        app: str = "demo",
        tags: Mapping[str, str] | None = None,
        num_nodes: int = 1,
        packing: int = 1,
        runnable: bool = False,
    ) -> uuid.UUID:
        """A job; ``runnable``: created PREPROCESSED by the api (its steps skipped in it)."""
        job = uuid.uuid4()
        self.sites[job] = site
        spec = CreatedData.model_validate({
            "site": site, "app": app, "workdir": f"w/{job}", "tags": dict(tags or {}),
            "num_nodes": num_nodes, "node_packing_count": packing,
            "skipped": CREATED_RUNNABLE if runnable else (),
        })  # fmt: skip
        self._job(JobCreated, job, at, f"user:{OWNER}", spec)
        return job

    def ready(self, job: uuid.UUID, at: float) -> None:
        self._job(JobReady, job, at, "controller:main", StepData())

    def staged_in(self, job: uuid.UUID, at: float) -> None:
        self._job(JobStagedIn, job, at, "site:" + self.sites[job], StepData())

    def preprocessed(self, job: uuid.UUID, at: float, *, skipped: bool = True) -> None:
        steps = ("job.ready", "job.staged_in") if skipped else ()
        self._job(JobPreprocessed, job, at, "controller:main", StepData(skipped=steps))

    def leased(self, job: uuid.UUID, at: float, session: uuid.UUID) -> None:
        self._job(JobLeased, job, at, f"launcher:{session}", LeaseData(session_id=session))

    def started(
        self, job: uuid.UUID, at: float, session: uuid.UUID, *, attempt: int = 1,
        lease_taken: bool = True,
    ) -> None:  # fmt: skip
        skipped = ("job.leased",) if lease_taken else ()
        data = StartedData(session_id=session, skipped=skipped, attempt=attempt)
        self._job(JobStarted, job, at, f"launcher:{session}", data)

    def run_done(self, job: uuid.UUID, at: float, session: uuid.UUID, runtime_s: float) -> None:
        data = RunResultData(return_code=0, runtime_s=runtime_s)
        self._job(JobRunDone, job, at, f"launcher:{session}", data)

    def run_errored(
        self, job: uuid.UUID, at: float, session: uuid.UUID, *, code: int,
        cause: tuple[str, ...] = (), stderr: str = "", attempt: int = 1,
    ) -> None:  # fmt: skip
        data = RunResultData(return_code=code, cause=cause, stderr_tail=stderr, attempt=attempt)
        self._job(JobRunErrored, job, at, f"launcher:{session}", data)

    def restart_ready(self, job: uuid.UUID, at: float, attempt: int) -> None:
        data = RetryData(attempt=attempt, reason="retry after error")
        self._job(JobRestartReady, job, at, "site:" + self.sites[job], data)

    def postprocessed(self, job: uuid.UUID, at: float) -> None:
        self._job(JobPostprocessed, job, at, "site:" + self.sites[job], StepData())

    def staged_out(self, job: uuid.UUID, at: float) -> None:
        self._job(JobStagedOut, job, at, "site:" + self.sites[job], StepData())

    def finished(self, job: uuid.UUID, at: float, *, skipped: bool = False) -> None:
        steps = ("job.postprocessed", "job.staged_out") if skipped else ()
        self._job(JobFinished, job, at, "controller:main", FinishedData(skipped=steps))

    def finished_by_pilot(
        self, job: uuid.UUID, at: float, session: uuid.UUID, *, runtime_s: float | None = None,
        attempt: int = 1,
    ) -> None:  # fmt: skip
        run = RunResultData(return_code=0, runtime_s=runtime_s, attempt=attempt)
        data = FinishedData(skipped=FINISHED_AT_RUN_END, run=run, attempt=attempt)
        self._job(JobFinished, job, at, f"launcher:{session}", data)

    def failed(self, job: uuid.UUID, at: float, reason: str, cause: tuple[str, ...] = ()) -> None:
        data = FailureData(reason=reason, cause=cause)
        self._job(JobFailed, job, at, "site:" + self.sites[job], data)

    # --- pilots -----------------------------------------------------------------------

    def session_opened(
        self, at: float, nodes: int, *, site: str = "alpha", batch: uuid.UUID | None = None
    ) -> uuid.UUID:
        session = uuid.uuid4()
        data = SessionOpenedData(
            batch_job_id=batch, hostname="login1",
            nodes=tuple(NodeInfo(hostname=f"n{i}", cores=8) for i in range(nodes)),
            deadline=self.at(at + 3600), heartbeat_ttl_s=10,
        )  # fmt: skip
        self.add(SessionOpened.create(site=site, aggregate_id=session, actor=f"launcher:{session}",
                                      data=data, occurred_at=self.at(at)))  # fmt: skip
        return session

    def session_closed(self, session: uuid.UUID, at: float, *, site: str = "alpha") -> None:
        self.add(SessionClosed.create(site=site, aggregate_id=session, actor=f"launcher:{session}",
                                      occurred_at=self.at(at)))  # fmt: skip

    def batch_job(
        self, nodes: int, requested: float, running: float, finished: float, *, site: str = "alpha"
    ) -> uuid.UUID:
        batch = uuid.uuid4()

        def add(cls: type[Event], at: float, actor: str, data: Any = None) -> None:
            self.add(cls.create(site=site, aggregate_id=batch, actor=actor, data=data,
                                occurred_at=self.at(at)))  # fmt: skip

        add(BatchJobRequested, requested, f"user:{OWNER}",
            BatchRequestData(num_nodes=nodes, wall_time_min=60))  # fmt: skip
        add(BatchJobSubmitted, requested + 0.5, f"site:{site}",
            BatchSubmittedData(scheduler_id="123", scheduler="slurm"))  # fmt: skip
        add(BatchJobRunning, running, f"site:{site}")
        add(BatchJobFinished, finished, f"site:{site}", BatchFinishedData(exit_code=0))
        return batch

    # --- as the stream holds it ------------------------------------------------------

    def raws(self) -> list[Raw]:
        return [Raw(seq, event.subject, encode(event)) for seq, event in self.events]

    def loaded(self, selection: Selection | None = None, extra: list[Raw] | None = None) -> Loaded:
        replay = Replay(selection)
        replay.take(sorted(self.raws() + (extra or []), key=lambda r: r.seq))
        return replay.loaded()


def hand_log() -> Log:
    """The log whose figures ``test_analytics_figures`` computed by hand (see its docstring)."""
    log = Log()
    batch = log.batch_job(4, requested=0, running=5, finished=55)
    session = log.session_opened(0, nodes=4, batch=batch)
    a = log.created(0, app="reco", tags={"beam": "1"})
    b = log.created(0, num_nodes=2, tags={"beam": "2"})
    log.ready(a, 2)
    log.staged_in(a, 5)
    log.preprocessed(a, 6, skipped=False)
    log.leased(a, 8, session)
    log.started(a, 10, session, lease_taken=False)
    c = log.created(10, packing=2, tags={"beam": "1"})
    log.preprocessed(b, 12)
    log.preprocessed(c, 12)
    log.started(b, 14, session)
    log.started(c, 20, session)
    d = log.created(20)
    log.preprocessed(d, 21)
    log.started(d, 22, session)
    log.run_errored(d, 23, session, code=1, cause=("task failed",), stderr="boom\n")
    log.finished_by_pilot(b, 24, session, runtime_s=8.0)
    log.run_errored(c, 24, session, code=3, cause=("task failed",), stderr="disk full\n")
    log.failed(d, 24, "run error on attempt 1 (retry budget exhausted)", ("task failed", "boom"))
    log.restart_ready(c, 25, attempt=2)
    log.started(c, 28, session, attempt=2)
    log.run_done(a, 30, session, runtime_s=19.0)
    log.postprocessed(a, 31)
    log.staged_out(a, 35)
    log.finished(a, 36)
    log.finished_by_pilot(c, 58, session, runtime_s=27.0, attempt=2)
    log.session_closed(session, 60)
    return log


def varied_log() -> list[Raw]:
    """Messages as a stream stores them (sequences 1, 2, …) for what a replay split by
    aggregate must merge exactly: :func:`hand_log`, a second site's jobs, sessions and batch
    jobs with other apps and tags, a job begun before the log, an illegal transition, an
    event of another kind, and more refusals than a summary lists (at low and high sequences,
    garbled on many jobs' subjects, forged on another site's subject)."""
    log = hand_log()
    batch = log.batch_job(2, requested=1, running=3, finished=90, site="beta")
    session = log.session_opened(3, nodes=2, site="beta", batch=batch)
    for i in range(8):
        job = log.created(4 + i, site="beta", app="sim", tags={"run": str(i % 3)}, runnable=True)
        log.started(job, 5 + i, session)
        if i % 4 == 3:
            log.run_errored(job, 9 + i, session, code=2, cause=("task failed",), stderr="nan\n")
            log.failed(job, 10 + i, "run error (retry budget exhausted)", ("task failed", "nan"))
        elif i % 4 != 2:  # the others still run when the log ends
            log.finished_by_pilot(job, 9 + i, session, runtime_s=3.0 + i)
    waiting = log.created(40, site="beta")
    log.run_done(waiting, 41, session, runtime_s=1.0)  # illegal: it never started
    log.sites[orphan := uuid.uuid4()] = "beta"
    log.started(orphan, 42, session)  # of a job created before what is read
    app = App(site="beta", name="sim")
    log.add(AppRegistered.create(site="beta", aggregate_id=uuid.uuid4(), actor="site:beta",
                                 data=app, occurred_at=log.at(43)))  # fmt: skip
    log.session_closed(session, 95, site="beta")
    raws = log.raws()
    forged = raws[3].subject.replace(".alpha.", ".beta.", 1)
    garbled = [f"evt.{site}.job.{uuid.uuid4()}.finished" for site in ("alpha", "beta") * 60]
    # Refusals at the start, in the middle and at the end of the log.
    messages = [(garbled[0], b"{oops"), *((r.subject, r.data) for r in raws[:20]),
                (forged, raws[3].data), *((r.subject, r.data) for r in raws[20:]),
                *((subject, b"[]") for subject in garbled[1:])]  # fmt: skip
    return [Raw(seq, subject, data) for seq, (subject, data) in enumerate(messages, start=1)]
