"""``LodeExecutor``: a ``concurrent.futures.Executor`` whose futures are jobs at your sites.

    from lodestream.client.sdk import LodeExecutor

    with LodeExecutor(site="mysite") as lode:
        futures = [lode.submit("square", x=str(i)) for i in range(1000)]
        print(sum(f.result() for f in futures))

``submit`` queues the job and returns at once; one thread sends what is queued in requests of
up to ``batch_size`` jobs, another follows the API's feed of your job events (one connection,
pushed, whatever the number of futures) and settles each future when its job is final, folding
the events with the rule the API's ``/jobs/{id}/result`` uses (``schemas.results``).

The log holds every job's state, so futures outlive the process that made them:
:meth:`LodeExecutor.attach` gives futures for jobs submitted earlier (by id or by the tag every
executor puts on its jobs, ``lode_executor``), settled at once for jobs that ended meanwhile.
"""

from __future__ import annotations

import itertools
import queue
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Executor
from concurrent.futures import wait as wait_for
from dataclasses import dataclass, field
from typing import Any, Final

from lodestream.client.errors import ApiError
from lodestream.client.futures import CallFailed, LodeFuture, resolve
from lodestream.client.sdk import LodeClient
from lodestream.schemas.results import JobOutcome, apply

EXECUTOR_TAG: Final = "lode_executor"
BATCH_SIZE: Final = 1000
# Events of jobs whose ids a submission in flight has not returned yet are kept this long
# (by count), so a job that ends before its submission's answer is read still settles.
EARLY_EVENTS: Final = 100_000


@dataclass(slots=True)
class _Tracked:
    future: LodeFuture
    python: bool
    workdir: str
    outcome: JobOutcome


@dataclass(slots=True)
class _Queued:
    future: LodeFuture
    job: dict[str, Any]
    python: bool


@dataclass(slots=True)
class _State:
    """What the feed and the submitter share, under ``lock``."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    tracked: dict[str, _Tracked] = field(default_factory=dict)
    early: OrderedDict[str, JobOutcome] = field(default_factory=OrderedDict)
    in_flight: int = 0


class LodeExecutor(Executor):
    """Runs apps of your sites as jobs; each :meth:`submit` returns a :class:`LodeFuture`."""

    def __init__(
        self,
        client: LodeClient | None = None,
        *,
        site: str | None = None,
        tags: Mapping[str, str] | None = None,
        workdir_prefix: str = "executor",
        batch_size: int = BATCH_SIZE,
    ) -> None:
        """``client``: the API to use (``LodeClient.from_config()`` when None); ``site``: where
        jobs run unless ``submit`` names one; ``tags``: put on every job; jobs' workdirs are
        ``<workdir_prefix>/<executor id>/<n>`` unless ``submit`` names one."""
        self._client = client if client is not None else LodeClient.from_config()
        self.site = site
        self.tags = dict(tags or {})
        self.id = uuid.uuid4().hex[:16]
        self._workdir_prefix = workdir_prefix
        self._batch_size = batch_size
        self._count = 0
        self._apps: dict[tuple[str, str], Mapping[str, Any]] = {}
        self._state = _State()
        self._queue: queue.Queue[_Queued | None] = queue.Queue()
        self._closed = False
        # Its own connection: closing it is how the feed thread is stopped.
        self._feed_client = LodeClient(self._client.config)
        position = int(self._client.job_results([])["position"])
        self._feed = threading.Thread(target=self._follow, args=(position,), daemon=True,
                                      name=f"lode-executor-feed-{self.id}")  # fmt: skip
        self._submitter = threading.Thread(target=self._submit_loop, daemon=True,
                                           name=f"lode-executor-submit-{self.id}")  # fmt: skip
        self._feed.start()
        self._submitter.start()

    # --- the Executor interface -------------------------------------------------------------

    def submit(  # type: ignore[override]
        self,
        app: str,
        /,
        *args: Any,
        site: str | None = None,
        tags: Mapping[str, str] | None = None,
        workdir: str | None = None,
        job: Mapping[str, Any] | None = None,
        **params: Any,
    ) -> LodeFuture:
        """Run ``app`` with ``params`` (positional ``args`` fill the app's parameters in the
        order it declares them): JSON values (str, int, float, bool, list, dict, None), each
        of the type the app declares for it; a Python-function app's ``run()`` gets them as
        they are. ``job`` adds other job fields (``num_nodes``,
        ``gpus_per_rank``, ``transfers``, …). The future's result is a Python-function app's
        return value, or a :class:`JobResult` for a shell app; a job that ends FAILED or
        KILLED raises :class:`JobFailed`."""
        where, definition = self._target(site, app)
        values = {**_positional(app, definition, args), **params}
        return self._enqueue(where, app, {"parameters": values}, definition, tags=tags,
                             workdir=workdir, job=job)  # fmt: skip

    def map(  # type: ignore[override]
        self,
        app: str,
        /,
        *iterables: Iterable[Any],
        timeout: float | None = None,
        chunksize: int = 1,
        site: str | None = None,
        tags: Mapping[str, str] | None = None,
    ) -> Iterator[Any]:
        """``app`` once per element of ``zip(*iterables)`` (its positional parameters), the
        results in order, as ``concurrent.futures`` maps: every job is submitted now, and the
        iterator raises the first failure it reaches (the rest are cancelled then).

        ``chunksize`` > 1 (Python-function apps only) puts that many calls in one job
        (``calls``): a warm worker makes them one after another, so each call costs the
        stack a fraction of a job. A call that raised raises :class:`CallFailed` where the
        iterator reaches it; a job that failed as a whole (killed, out of time, its worker
        lost) raises :class:`JobFailed` at its first call.
        """
        if chunksize < 1:
            raise ValueError(f"chunksize must be 1 or more, got {chunksize}")
        where, definition = self._target(site, app)
        if chunksize > 1 and not definition.get("python"):
            raise TypeError(f"app {app!r} is a shell app: chunksize is for Python-function apps")
        deadline = None if timeout is None else time.monotonic() + timeout
        jobs: list[tuple[LodeFuture, int]] = []
        for chunk in _batches(zip(*iterables, strict=False), chunksize):
            calls = [_positional(app, definition, args) for args in chunk]
            values = {"parameters": calls[0]} if chunksize == 1 else {"calls": calls}
            jobs.append((self._enqueue(where, app, values, definition, tags=tags), len(calls)))
        return _results(jobs, deadline, calls=chunksize > 1)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Stop taking jobs; with ``wait``, return once every future has settled."""
        self._closed = True
        self._queue.put(None)
        if wait:
            self._submitter.join()
        if cancel_futures:
            for tracked in self._snapshot():
                tracked.future.cancel()
        if wait:
            wait_for([t.future for t in self._snapshot()])
        self._feed_client.close()

    def _target(self, site: str | None, app: str) -> tuple[str, Mapping[str, Any]]:
        if self._closed:
            raise RuntimeError("cannot submit after shutdown")
        where = site or self.site
        if where is None:
            raise TypeError("name the site: LodeExecutor(site=...) or submit(..., site=...)")
        return where, self._app(where, app)

    def _enqueue(
        self,
        where: str,
        app: str,
        values: Mapping[str, Any],
        definition: Mapping[str, Any],
        *,
        tags: Mapping[str, str] | None,
        workdir: str | None = None,
        job: Mapping[str, Any] | None = None,
    ) -> LodeFuture:
        """Queue one job whose ``values`` are its parameters or its calls."""
        self._count += 1
        spec: dict[str, Any] = {
            **(job or {}), "site": where, "app": app, **values,
            "workdir": workdir or f"{self._workdir_prefix}/{self.id}/{self._count}",
            "tags": {**self.tags, **(tags or {}), EXECUTOR_TAG: self.id},
        }  # fmt: skip
        future = LodeFuture(self._kill)
        self._queue.put(_Queued(future, spec, bool(definition.get("python"))))
        return future

    # --- re-attaching -------------------------------------------------------------------------

    def attach(
        self, job_ids: Iterable[str] = (), *, executor_id: str | None = None
    ) -> list[LodeFuture]:
        """Futures for jobs submitted earlier, by id or all those an executor submitted
        (``executor_id``, the ``id`` of that executor); jobs that ended meanwhile settle now."""
        ids = [str(i) for i in job_ids]
        if executor_id is not None:
            tagged = self._client.list_jobs(tag=[f"{EXECUTOR_TAG}:{executor_id}"])
            ids += [str(j["id"]) for j in tagged]
        ids = list(dict.fromkeys(ids))
        with self._state.lock:
            self._state.in_flight += 1  # the feed keeps what it reads of them meanwhile
        futures: list[LodeFuture] = []
        try:
            for chunk in _chunks(ids, 5000):
                page = self._client.job_results(chunk)
                if page["missing"]:
                    raise ApiError(404, "not_found", f"no jobs of yours: {page['missing']}")
                for doc in page["results"]:
                    python = bool(self._app(doc["site"], doc["app"]).get("python"))
                    future = LodeFuture(self._kill)
                    future.job_id = str(doc["job_id"])
                    outcome = _outcome_of(doc)
                    self._track(future, python, doc["workdir"], outcome)
                    futures.append(future)
        finally:
            with self._state.lock:
                self._state.in_flight -= 1
        return futures

    # --- threads --------------------------------------------------------------------------------

    def _submit_loop(self) -> None:
        while True:
            first = self._queue.get()
            if first is None:
                return
            batch = [first]
            while len(batch) < self._batch_size:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is None:
                    self._queue.put(None)  # seen after this batch
                    break
                batch.append(item)
            self._send(batch)

    def _send(self, batch: Sequence[_Queued]) -> None:
        with self._state.lock:
            self._state.in_flight += 1
        try:
            answer = self._client.submit_jobs(
                [q.job for q in batch], idempotency_key=f"{self.id}-{uuid.uuid4().hex}"
            )
        except ApiError as exc:
            if exc.status == 422 and len(batch) > 1:
                for one in batch:  # the API refuses a batch whole: find the job(s) at fault
                    self._send([one])
            else:
                for q in batch:
                    q.future.set_exception(exc)
            return
        except Exception as exc:
            for q in batch:
                q.future.set_exception(exc)
            return
        finally:
            with self._state.lock:
                self._state.in_flight -= 1
        for q, accepted in zip(batch, answer["jobs"], strict=True):
            q.future.job_id = str(accepted["id"])
            self._track(q.future, q.python, q.job["workdir"], JobOutcome(q.future.job_id))

    def _follow(self, position: int) -> None:
        try:
            for event in self._feed_client.follow_events(position):
                self._apply(event)
        except Exception:
            if not self._closed:
                raise

    def _apply(self, event: Mapping[str, Any]) -> None:
        job_id = str(event["job_id"])
        state = self._state
        with state.lock:
            tracked = state.tracked.get(job_id)
            if tracked is None:
                if state.in_flight:
                    early = state.early.pop(job_id, None) or JobOutcome(job_id)
                    state.early[job_id] = _next(early, event)
                    while len(state.early) > EARLY_EVENTS:
                        state.early.popitem(last=False)
                return
            tracked.outcome = _next(tracked.outcome, event)
            if event["type"] == "job.started":
                tracked.future.started = True
            if not tracked.outcome.final:
                return
            del state.tracked[job_id]
        resolve(tracked.future, tracked.outcome, python=tracked.python, workdir=tracked.workdir)

    def _track(self, future: LodeFuture, python: bool, workdir: str, outcome: JobOutcome) -> None:
        assert future.job_id is not None
        state = self._state
        with state.lock:
            early = state.early.pop(future.job_id, None)
            if early is not None and early.runs >= outcome.runs:
                outcome = early
            tracked = _Tracked(future, python, workdir, outcome)
            if not outcome.final:
                state.tracked[future.job_id] = tracked
        if outcome.final:
            resolve(future, outcome, python=python, workdir=workdir)

    def _kill(self, future: LodeFuture) -> None:
        if future.job_id is not None:
            try:
                self._client.kill_job(future.job_id, reason="future cancelled")
            except ApiError as exc:
                if exc.status != 409:  # already final: nothing to stop
                    raise

    def _snapshot(self) -> list[_Tracked]:
        with self._state.lock:
            return list(self._state.tracked.values())

    def _app(self, site: str, app: str) -> Mapping[str, Any]:
        key = (site, app)
        if key not in self._apps:
            for found in self._client.list_apps(site):
                self._apps[(site, str(found["name"]))] = found
        try:
            return self._apps[key]
        except KeyError:
            known = sorted(name for s, name in self._apps if s == site)
            raise ValueError(f"site {site!r} has no app {app!r}; its apps: {known}") from None


def _batches(items: Iterable[tuple[Any, ...]], size: int) -> Iterator[list[tuple[Any, ...]]]:
    """``itertools.batched``, which Python 3.11 lacks."""
    iterator = iter(items)
    while chunk := list(itertools.islice(iterator, size)):
        yield chunk


def _results(
    jobs: Sequence[tuple[LodeFuture, int]], deadline: float | None, *, calls: bool
) -> Iterator[Any]:
    """The results of ``jobs`` (each with how many calls it carries) in order: each job's
    value, or each of its calls' values."""
    try:
        for future, count in jobs:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            value = future.result(left)
            if not calls:
                yield value
                continue
            assert future.job_id is not None
            # The result is the pilot's report: a site's words, checked before they are used.
            outcomes = value if isinstance(value, list) else []
            for index in range(count):
                outcome = outcomes[index] if index < len(outcomes) else None
                if not isinstance(outcome, dict):
                    raise CallFailed.unreported(future.job_id, index)
                if outcome.get("ok") is not True:
                    raise CallFailed.from_outcome(future.job_id, index, outcome)
                yield outcome.get("result")
    finally:  # the iterator raised or was dropped: what nobody will read need not run
        for future, _count in jobs:
            future.cancel()


def _next(outcome: JobOutcome, event: Mapping[str, Any]) -> JobOutcome:
    return apply(outcome, str(event["type"]), event.get("data") or {}, event.get("to_state"))


def _outcome_of(doc: Mapping[str, Any]) -> JobOutcome:
    return JobOutcome(
        str(doc["job_id"]), state=doc["state"], result=doc.get("result"),
        return_code=doc.get("return_code"), stderr_tail=doc.get("stderr_tail", ""),
        cause=tuple(doc.get("cause") or ()), reason=doc.get("reason", ""),
        attempt=int(doc.get("attempt", 1)), runs=int(doc.get("runs", 0)),
    )  # fmt: skip


def _positional(app: str, definition: Mapping[str, Any], args: Sequence[Any]) -> dict[str, Any]:
    names = list(definition.get("parameters") or {})
    if len(args) > len(names):
        raise TypeError(f"app {app!r} takes {len(names)} parameters ({names}), {len(args)} given")
    return dict(zip(names, args, strict=False))


def _chunks(items: Sequence[str], size: int) -> Iterable[Sequence[str]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]
