"""The site's processing module: runs app hooks on ``process-<site>`` work, appends the outcome.

    job.staged_in     → preprocess()      → job.preprocessed | job.failed
    job.run_done      → postprocess()     → job.postprocessed | job.failed   (apps with the hook)
    job.run_errored   → handle_error()    → job.restart_ready | job.failed   (retry budget)
    job.run_timed_out → handle_timeout()  → job.restart_ready | job.failed   (retry budget)
    job.finished      → the cleaner removes the app's cleanup_files from the workdir

Each outcome is appended with compare-and-set on the event that asked for it
and an id derived from that event, so a redelivered message can never act
twice. Hooks are site code and may block: they run in worker threads.

A retry is not immediate: ``job.restart_ready`` records the app's backoff
(``backoff_s``) and when the next attempt is due (``retry_at``, counted from
the failure event's own time, so deciding again yields the same event), and
pilots lease the job no earlier (:mod:`lodestream.agents.launcher.work`).

Every delivery is checked with the shared rule (:mod:`lodestream.schemas.trust`) before any hook
runs: its subject, its site (this site's, everywhere the payload names one) and its
writer; and its type must be one of the ``process-<site>`` consumer's.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from lodestream.agents.site.apps import ApplicationDefinition, Decision, JobContext
from lodestream.agents.site.retries import RetryRules
from lodestream.eventlog import EventLog
from lodestream.eventlog.kernel import Append, commit_one
from lodestream.schemas.envelope import Event
from lodestream.schemas.errors import Untrusted
from lodestream.schemas.events import (
    JobFailed,
    JobPostprocessed,
    JobPreprocessed,
    JobRestartReady,
)
from lodestream.schemas.events.job import FailureData, RetryData, RunResultData, StepData
from lodestream.schemas.ids import derived_id
from lodestream.schemas.resources import JobSpec
from lodestream.schemas.retry import backoff_s, retry_at
from lodestream.schemas.subjects import parse_event_subject
from lodestream.schemas.topology import PROCESS
from lodestream.schemas.trust import check_own_site, event_from_message

log = logging.getLogger(__name__)


class Processing:
    def __init__(
        self,
        log_: EventLog,
        *,
        site: str,
        apps: dict[str, type[ApplicationDefinition]],
        data_dir: Path,
        retries: RetryRules,
    ) -> None:
        self._log = log_
        self._site = site
        self._apps = apps
        self._data_dir = data_dir
        self._retries = retries
        self.handled = 0

    @property
    def actor(self) -> str:
        return f"site:{self._site}"

    async def handle(self, msg: Any) -> None:
        """Act on one delivered message; the caller acks it afterwards.

        Raises :class:`Untrusted` for a message the shared rule refuses, or that hands no
        work to this module: the caller terminates it, logs and counts it.
        """
        if self._nothing_to_do(msg):
            return
        event = check_own_site(event_from_message(msg.subject, msg.data), self._site)
        if not PROCESS.carries(event.type):
            raise Untrusted(f"{event.type} hands no work to site processing")
        spec = getattr(event.data, "work", None)
        if not isinstance(spec, JobSpec):
            raise Untrusted(f"{event.type} for {event.aggregate_id} carries no work")
        seq = int(msg.metadata.sequence.stream)
        app = self._apps.get(spec.app)
        if event.type == "job.finished":
            if app is not None and app.spec.cleanup_files:
                workdir = self._data_dir / spec.workdir
                await asyncio.to_thread(_remove_globs, workdir, app.spec.cleanup_files)
            return
        outcome = await self._decide(event, spec, app)
        # None from commit_one: the job moved on (killed, or a redelivery already acted on).
        if outcome is not None and await commit_one(self._log, Append(outcome, seq)):
            self.handled += 1

    def _nothing_to_do(self, msg: Any) -> bool:
        """Whether the delivery is a run_done or finished of an app with no hook for it.

        Most jobs' run_done and finished come here only to be acked; telling so from the
        subject and the app's name saves validating the whole event. Nothing is *done* on
        this path, so the shared rule has nothing to guard; anything unexpected in the
        document goes the full way (and is checked there).
        """
        try:
            subject = parse_event_subject(msg.subject)
            kind = subject.event_type
            if subject.site != self._site or kind not in {"job.run_done", "job.finished"}:
                return False
            name = orjson.loads(msg.data)["data"]["work"]["app"]
        except (ValueError, KeyError, TypeError):  # SubjectError, JSONDecodeError included
            return False
        app = self._apps.get(name) if isinstance(name, str) else None
        if app is None:
            return False
        if kind == "job.finished":
            return not app.spec.cleanup_files
        return not _overrides(app, "postprocess")

    async def _decide(
        self, event: Event, spec: JobSpec, app: type[ApplicationDefinition] | None
    ) -> Event | None:
        data = event.data
        attempt = getattr(data, "attempt", 1)
        if app is None:
            return self._fail(event, f"app {spec.app!r} is not defined at site {self._site}")
        context = JobContext.from_spec(
            event.aggregate_id, spec, self._data_dir, attempt=attempt,
            max_attempts=self._retries.of(spec.app).max_attempts,
            return_code=data.return_code if isinstance(data, RunResultData) else None,
            stderr_tail=data.stderr_tail if isinstance(data, RunResultData) else "",
        )  # fmt: skip
        instance = app(context)
        match event.type:
            case "job.staged_in":
                return await self._hook(event, instance.preprocess, JobPreprocessed, spec)
            case "job.run_done" if _overrides(app, "postprocess"):
                return await self._hook(event, instance.postprocess, JobPostprocessed, spec)
            case "job.run_errored" | "job.run_timed_out":
                hook = instance.handle_error if event.type == "job.run_errored" else (
                    instance.handle_timeout)  # fmt: skip
                return await self._retry_or_fail(event, hook, spec, attempt)
        return None

    async def _hook(
        self, event: Event, hook: Callable[[], None], next_type: type[Event], spec: JobSpec
    ) -> Event:
        try:
            await asyncio.to_thread(hook)
        except Exception as exc:
            name = getattr(hook, "__name__", "hook")
            return self._fail(event, f"{name} failed: {type(exc).__name__}: {exc}")
        return next_type.create(
            site=self._site, aggregate_id=event.aggregate_id, actor=self.actor,
            data=StepData(work=spec), event_id=self._id(event, next_type),
            causation_id=event.id,
        )  # fmt: skip

    async def _retry_or_fail(
        self, event: Event, hook: Callable[[], Decision], spec: JobSpec, attempt: int
    ) -> Event:
        try:
            decision = await asyncio.to_thread(hook)
        except Exception as exc:
            return self._fail(event, f"{hook.__name__} failed: {type(exc).__name__}: {exc}")
        what = "error" if event.type == "job.run_errored" else "timeout"
        plan = self._retries.of(spec.app)
        if decision == Decision.RETRY and attempt < plan.max_attempts:
            wait = backoff_s(plan.backoff, event.aggregate_id, attempt)
            retry = RetryData(
                attempt=attempt + 1, reason=f"retry after {what}", work=spec,
                max_attempts=plan.max_attempts, backoff_s=wait,
                retry_at=retry_at(event.occurred_at, wait),
            )  # fmt: skip
            return JobRestartReady.create(
                site=self._site, aggregate_id=event.aggregate_id, actor=self.actor, data=retry,
                event_id=self._id(event, JobRestartReady), causation_id=event.id,
            )  # fmt: skip
        data = event.data
        detail = data.stderr_tail if isinstance(data, RunResultData) else ""
        exhausted = attempt >= plan.max_attempts
        why = "retry budget exhausted" if exhausted else f"{hook.__name__} decided FAIL"
        reason = f"run {what} on attempt {attempt} ({why})"
        cause = (*(data.cause if isinstance(data, RunResultData) else ()), detail[-500:])
        return self._fail(event, reason, cause=tuple(c for c in cause if c))

    def _fail(self, event: Event, reason: str, cause: tuple[str, ...] = ()) -> Event:
        return JobFailed.create(
            site=self._site, aggregate_id=event.aggregate_id, actor=self.actor,
            data=FailureData(reason=reason, cause=cause), event_id=self._id(event, JobFailed),
            causation_id=event.id,
        )  # fmt: skip

    def _id(self, cause: Event, kind: type[Event]) -> Any:
        return derived_id(str(cause.id), "site", str(getattr(kind, "event_type", "")))


def _overrides(app: type[ApplicationDefinition], hook: str) -> bool:
    return getattr(app, hook) is not getattr(ApplicationDefinition, hook)


def _remove_globs(workdir: Path, patterns: tuple[str, ...]) -> None:
    root = workdir.resolve()
    for pattern in patterns:
        for path in workdir.glob(pattern):
            resolved = path.resolve()
            if root not in resolved.parents:
                continue  # a symlink or pattern that escapes the workdir
            if resolved.is_file() or resolved.is_symlink():
                resolved.unlink(missing_ok=True)
