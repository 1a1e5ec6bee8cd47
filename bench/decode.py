"""Micro-benchmark of the decode every consumer runs on every hop (issue 15, lever 2).

    python -m bench.decode [--rounds 2000] [--json out.json]

Times, in µs per event, over encoded events of the common types of a job's life
(created, preprocessed with its work, leased, started, run_done, finished with its
run, restart_ready, failed, a heartbeat-free session event):

* ``union``: the codec before issue 15 — orjson, then a discriminated union of every
  class (rebuilt here: the codec no longer has one);
* ``decode``: :func:`lodestream.schemas.codec.decode`, the general path — orjson, then
  the class named by ``type``;
* ``class``: the class named by the subject, ``validate_json`` on the bytes;
* ``decode_as``: :func:`lodestream.schemas.codec.decode_as`, guards included;
* ``trusted``: :func:`lodestream.schemas.trust.event_from_message`, the whole rule;
* ``msgspec``: (if installed) a msgspec decoder *derived* from the pydantic classes
  by :func:`derived_struct`, constraints only: none of the Python validators run, so
  it is a lower bound of what a msgspec path could cost, not a drop-in.

Single process, one core; the machine is shared, so read the figures as ratios.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import types
import typing
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import orjson
from pydantic import BaseModel, Field, TypeAdapter
from pydantic.fields import FieldInfo

from lodestream.schemas import codec
from lodestream.schemas.envelope import Event
from lodestream.schemas.events.job import (
    FailureData,
    FinishedData,
    JobCreated,
    JobFailed,
    JobFinished,
    JobLeased,
    JobPreprocessed,
    JobRestartReady,
    JobRunDone,
    JobStarted,
    LeaseData,
    Placement,
    RetryData,
    RunResultData,
    StartedData,
    StepData,
)
from lodestream.schemas.events.session import SessionClosed, SessionClosedData
from lodestream.schemas.resources import JobSpec
from lodestream.schemas.trust import event_from_message

SITE = "bench"


def sample_events() -> list[Event]:
    """One event of each common type, shaped as the lifecycle writes them."""
    job = uuid.uuid4()
    session = uuid.uuid4()
    spec = JobSpec(
        site=SITE,
        app="noop",
        workdir="bench/1",
        parameters={"seconds": "0"},
        tags={"run": "7", "exp": "demo"},
    )
    run = RunResultData(return_code=0, runtime_s=0.01, cause=())
    common: dict[str, Any] = {"site": SITE, "aggregate_id": job, "causation_id": uuid.uuid4()}
    ctl = {**common, "actor": "controller:bench"}
    pilot = {**common, "actor": f"launcher:{session}"}
    return [
        JobCreated.create(**{**common, "actor": "user:alice"}, data=spec),
        JobPreprocessed.create(
            **ctl, data=StepData(skipped=("job.ready", "job.staged_in"), work=spec)
        ),
        JobLeased.create(**pilot, data=LeaseData(session_id=session)),
        JobStarted.create(
            **pilot,
            data=StartedData(
                session_id=session,
                skipped=("job.leased",),
                placement=(Placement(hostname="nid0001", cores=(0,)),),
                pid=4242,
            ),
        ),
        JobRunDone.create(**pilot, data=run.model_copy(update={"work": spec})),
        JobFinished.create(
            **pilot, data=FinishedData(skipped=("job.run_done", "job.postprocessed"), run=run)
        ),
        JobRestartReady.create(
            **{**common, "actor": f"site:{SITE}"},
            data=RetryData(attempt=2, reason="rc 1", work=spec, retry_at=datetime.now(UTC)),
        ),
        JobFailed.create(**ctl, data=FailureData(reason="parent failed", cause=("parent",))),
        SessionClosed.create(
            **{**common, "aggregate_id": session, "actor": f"launcher:{session}"},
            data=SessionClosedData(reason="idle"),
        ),
    ]


def union_decoder() -> Callable[[bytes], Any]:
    """The old codec's path: orjson, then one adapter over every class, keyed on ``type``."""
    classes = tuple(codec.EVENT_CLASSES.values())
    union: Any = classes[0]
    for cls in classes[1:]:
        union = union | cls
    validate = TypeAdapter(Annotated[union, Field(discriminator="type")]).validate_python
    return lambda raw: validate(orjson.loads(raw))


# --- msgspec, derived (measurement only) ------------------------------------------------------


def derived_struct(model: type[BaseModel], cache: dict[type, Any]) -> Any:
    """A msgspec Struct with ``model``'s fields and constraints (patterns, bounds, lengths).

    Read from ``model_fields``, never written by hand; validators are not carried over.
    """
    import msgspec  # noqa: PLC0415 - optional, for this measurement only

    if model in cache:
        return cache[model]
    fields: list[tuple[Any, ...]] = []
    for name, info in model.model_fields.items():
        annotation = _msgspec_type(info.annotation, info, cache)
        if info.is_required():
            fields.append((name, annotation))
        else:
            default = info.get_default(call_default_factory=True)
            fields.append((name, annotation, msgspec.field(default=_frozen_default(default))))
    struct = msgspec.defstruct(
        model.__name__, fields, forbid_unknown_fields=True, frozen=True, kw_only=True
    )
    cache[model] = struct
    return struct


def _frozen_default(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return None  # only the measurement's shape matters
    if isinstance(value, dict | list):
        return None
    return value


def _msgspec_type(annotation: Any, info: FieldInfo | None, cache: dict[type, Any]) -> Any:
    import msgspec  # noqa: PLC0415

    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is Annotated:
        return _msgspec_type(args[0], _merged(info, args[1:]), cache)
    meta = _meta(info)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return derived_struct(annotation, cache)
    if origin in (types.UnionType, typing.Union):
        members = tuple(_msgspec_type(a, info, cache) for a in args)
        return typing.Union[members]  # noqa: UP007 - built from a tuple
    if origin is tuple:
        return tuple[_msgspec_type(args[0], None, cache), ...]  # type: ignore[misc]
    if origin is dict:
        return dict[_msgspec_type(args[0], None, cache), _msgspec_type(args[1], None, cache)]  # type: ignore[misc]
    if annotation is datetime or getattr(annotation, "__name__", "") == "AwareDatetime":
        return Annotated[datetime, msgspec.Meta(tz=True)]
    if annotation in (str, int, float) and meta:
        return Annotated[annotation, msgspec.Meta(**meta)]
    if origin is typing.Literal or annotation in (str, int, float, bool, uuid.UUID, type(None)):
        return annotation
    return Any


def _merged(info: FieldInfo | None, metadata: tuple[Any, ...]) -> FieldInfo:
    merged = FieldInfo.merge_field_infos(info or FieldInfo())
    merged.metadata = [*(info.metadata if info else []), *metadata]
    return merged


def _meta(info: FieldInfo | None) -> dict[str, Any]:
    meta: dict[str, Any] = {}
    for item in info.metadata if info else []:
        for key in ("pattern", "ge", "le", "gt", "lt", "max_length", "min_length"):
            value = getattr(item, key, None)
            if value is not None:
                meta[key] = value
    return meta


def msgspec_decoders(events: list[Event]) -> dict[str, Callable[[bytes], Any]]:
    import msgspec  # noqa: PLC0415

    cache: dict[type, Any] = {}
    return {e.type: msgspec.json.Decoder(derived_struct(type(e), cache)).decode for e in events}


# --- timing -----------------------------------------------------------------------------------


def per_event_us(
    fn: Callable[[str, bytes], object], items: list[tuple[str, bytes]], rounds: int
) -> float:
    """Best-of-five median-free timing: µs per call of ``fn`` over ``items``."""
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(rounds):
            for subject, raw in items:
                fn(subject, raw)
        best = min(best, time.perf_counter() - start)
    return best / (rounds * len(items)) * 1e6


def measure(rounds: int) -> dict[str, Any]:
    events = sample_events()
    items = [(e.subject, codec.encode(e)) for e in events]
    lax = {e.type: type(e).__pydantic_validator__.validate_json for e in events}
    union = union_decoder()

    def type_of(subject: str) -> str:
        parts = subject.split(".")
        return f"{parts[2]}.{parts[4]}"

    paths: dict[str, Callable[[str, bytes], object]] = {
        "union": lambda _s, raw: union(raw),
        "decode": lambda _s, raw: codec.decode(raw),
        "class": lambda s, raw: lax[type_of(s)](raw),
        "decode_as": lambda s, raw: codec.decode_as(type_of(s), raw),
        "trusted": event_from_message,
    }
    try:
        decoders = msgspec_decoders(events)
    except ImportError:
        print("msgspec not installed: skipped", file=sys.stderr)
    else:
        paths["msgspec"] = lambda s, raw: decoders[type_of(s)](raw)
    figures: dict[str, Any] = {"all": {}, "per_type": {}}
    for name, fn in paths.items():
        figures["all"][name] = round(per_event_us(fn, items, rounds), 2)
        figures["per_type"][name] = {
            e.type: round(per_event_us(fn, [item], rounds), 2)
            for e, item in zip(events, items, strict=True)
        }
    figures["bytes_median"] = statistics.median(len(raw) for _, raw in items)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2000)
    parser.add_argument("--json", default=None, help="also write the figures here")
    args = parser.parse_args()
    figures = measure(args.rounds)
    names = list(figures["all"])
    print(f"{'event type':24}" + "".join(f"{n:>14}" for n in names))
    for event_type in figures["per_type"][names[0]]:
        cells = "".join(f"{figures['per_type'][n][event_type]:>14.2f}" for n in names)
        print(f"{event_type:24}{cells}")
    print(f"{'all (µs/event)':24}" + "".join(f"{figures['all'][n]:>14.2f}" for n in names))
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
