"""The benchmark's jobs and events, generated fast.

Job ``i`` (a global index across phases) has the same shape whether it is
submitted through the API or appended directly: tags
``{"shard": i % 100, "campaign": "c" + i % 7}``, one of a few apps, and a
bulk-dataset final state picked by ``(i // 100) % 10`` so that state and tags
are independent. Events are JSON documents made once by the pydantic models,
turned into ``%s`` templates and checked to decode — the generator must not be
what is measured.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any, Final

import orjson

from lodestream.eventlog.append import H_EXPECTED_STREAM, H_MSG_ID
from lodestream.schemas.codec import decode
from lodestream.schemas.events import (
    JobCreated,
    JobFinished,
    JobPreprocessed,
    JobRunDone,
    JobStarted,
)
from lodestream.schemas.events.job import FinishedData, RunResultData, StartedData, StepData
from lodestream.schemas.ids import uuid7
from lodestream.schemas.resources import JobSpec
from lodestream.schemas.subjects import EVENTS_STREAM

APPS: Final = ("sim", "reco", "calib", "train")
LIFECYCLE: Final = ("preprocessed", "started", "run_done", "finished")
# Lifecycle events by (i // 100) % 10: 30% finished, 10% running, 30% preprocessed, 30% created.
STEPS_BY_BUCKET: Final = (4, 4, 4, 2, 1, 1, 1, 0, 0, 0)

Outgoing = tuple[str, bytes, dict[str, str]]
"""subject, payload, headers: one append, ready for ``publish_async``."""


def tags(i: int) -> dict[str, str]:
    return {"shard": str(i % 100), "campaign": f"c{i % 7}"}


def app(i: int) -> str:
    return APPS[(i // 7) % len(APPS)]


def job_spec(site: str, i: int) -> dict[str, Any]:
    return {
        "site": site,
        "app": app(i),
        "workdir": f"bench/{i}",
        "parameters": {"n": str(i)},
        "tags": tags(i),
    }


def submit_body(site: str, first: int, count: int) -> bytes:
    """A ``POST /jobs`` body for jobs ``first .. first + count - 1``."""
    return orjson.dumps({"jobs": [job_spec(site, i) for i in range(first, first + count)]})


def steps_for(i: int) -> int:
    """How many lifecycle events job ``i`` gets in the bulk dataset."""
    return STEPS_BY_BUCKET[(i // 100) % 10]


class Ids:
    """Distinct UUID strings from one UUIDv7: its first 24 characters and a 48-bit counter."""

    def __init__(self) -> None:
        self._prefix = str(uuid7())[:24]
        self._next = 0

    def take(self) -> str:
        self._next += 1
        return f"{self._prefix}{self._next:012x}"


class Template:
    """A JSON document with some string values replaced by ``%s`` slots."""

    def __init__(self, document: dict[str, Any], slots: dict[str, tuple[str, ...]]) -> None:
        text = orjson.dumps(_mark(document, slots)).decode().replace("%", "%%")
        found = sorted((text.index(f'"@{name}@"'), name) for name in slots)
        self.order = tuple(name for _, name in found)
        for name in self.order:
            text = text.replace(f'"@{name}@"', '"%s"')
        self._format = text

    def fill(self, values: dict[str, str]) -> bytes:
        return (self._format % tuple(values[name] for name in self.order)).encode()


def _mark(document: dict[str, Any], slots: dict[str, tuple[str, ...]]) -> dict[str, Any]:
    marked: dict[str, Any] = orjson.loads(orjson.dumps(document))
    for name, path in slots.items():
        node = marked
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = f"@{name}@"
    return marked


_ENVELOPE: Final[dict[str, tuple[str, ...]]] = {
    "id": ("id",),
    "job": ("aggregate_id",),
    "at": ("occurred_at",),
}
_CREATED: Final[dict[str, tuple[str, ...]]] = {
    **_ENVELOPE,
    "app": ("data", "app"),
    "workdir": ("data", "workdir"),
    "n": ("data", "parameters", "n"),
    "shard": ("data", "tags", "shard"),
    "campaign": ("data", "tags", "campaign"),
}


class Events:
    """The job events the benchmarks append: created plus the common four-step lifecycle."""

    def __init__(self, site: str, owner: str) -> None:
        self.site = site
        self.ids = Ids()
        session, job = uuid7(), uuid7()
        launcher = f"launcher:{session}"
        models = {
            "created": JobCreated.create(
                site=site, aggregate_id=job, actor=f"user:{owner}",
                data=JobSpec.model_validate(job_spec(site, 0)),
            ),
            "preprocessed": JobPreprocessed.create(
                site=site, aggregate_id=job, actor="controller:bench",
                data=StepData(skipped=("job.ready", "job.staged_in")),
            ),
            "started": JobStarted.create(
                site=site, aggregate_id=job, actor=launcher,
                data=StartedData(session_id=session, skipped=("job.leased",)),
            ),
            "run_done": JobRunDone.create(
                site=site, aggregate_id=job, actor=launcher,
                data=RunResultData(return_code=0, runtime_s=1.5),
            ),
            "finished": JobFinished.create(
                site=site, aggregate_id=job, actor="controller:bench",
                data=FinishedData(skipped=("job.postprocessed", "job.staged_out")),
            ),
        }  # fmt: skip
        self._templates = {
            name: Template(
                model.model_dump(mode="json"), _CREATED if name == "created" else _ENVELOPE
            )
            for name, model in models.items()
        }
        self._check()

    def _check(self) -> None:
        """The filled templates must decode exactly as the projector will decode them."""
        now, job = now_iso(), self.ids.take()
        samples = [self.created(job, 12345, now)] + [self.step(n, job, now) for n in LIFECYCLE]
        for subject, payload, _ in samples:
            event = decode(payload)
            if event.subject != subject:
                raise ValueError(f"template mismatch: {event.subject} != {subject}")
        created = decode(samples[0][1])
        if not isinstance(created, JobCreated) or created.data.model_dump(
            include={"app", "workdir", "parameters", "tags"}
        ) != {k: v for k, v in job_spec(self.site, 12345).items() if k != "site"}:
            raise ValueError(f"job.created template mismatch: {created}")

    def _outgoing(self, name: str, event_id: str, job_id: str, payload: bytes) -> Outgoing:
        subject = f"evt.{self.site}.job.{job_id}.{name}"
        return subject, payload, {H_MSG_ID: event_id, H_EXPECTED_STREAM: EVENTS_STREAM}

    def created(self, job_id: str, i: int, at: str) -> Outgoing:
        event_id = self.ids.take()
        values = {"id": event_id, "job": job_id, "at": at, "app": app(i)}
        values |= {"workdir": f"bench/{i}", "n": str(i), "shard": str(i % 100)}
        values["campaign"] = f"c{i % 7}"
        return self._outgoing("created", event_id, job_id, self._templates["created"].fill(values))

    def step(self, name: str, job_id: str, at: str) -> Outgoing:
        event_id = self.ids.take()
        payload = self._templates[name].fill({"id": event_id, "job": job_id, "at": at})
        return self._outgoing(name, event_id, job_id, payload)

    def lifecycle_waves(self, job_ids: list[str]) -> list[Outgoing]:
        """The four lifecycle events of each job, wave by wave (all preprocessed, then …)."""
        out: list[Outgoing] = []
        for name in LIFECYCLE:
            times = Clock()
            out.extend(self.step(name, job, times.next()) for job in job_ids)
        return out

    def dataset_chunk(self, first: int, count: int) -> list[Outgoing]:
        """Jobs ``first .. first+count-1`` of the bulk dataset: created, then lifecycle waves."""
        times = Clock()
        ids = [self.ids.take() for _ in range(count)]
        out = [self.created(job, first + k, times.next()) for k, job in enumerate(ids)]
        steps = [steps_for(first + k) for k in range(count)]
        for step, name in enumerate(LIFECYCLE):
            times = Clock()
            out.extend(
                self.step(name, job, times.next())
                for job, n in zip(ids, steps, strict=True)
                if n > step
            )
        return out


class Clock:
    """Producer times a microsecond apart from now: no two events of a wave share one.

    (Shared timestamps would make ``ORDER BY updated_at`` scan whole tie groups, which no
    real workload produces. Making an event takes longer than a microsecond, so each wave
    still starts after the previous one ends.)
    """

    def __init__(self) -> None:
        self._start = datetime.now(UTC)
        self._n = 0

    def next(self) -> str:
        self._n += 1
        return (self._start + timedelta(microseconds=self._n)).isoformat()


def now_iso() -> str:
    return datetime.now(UTC).isoformat()
