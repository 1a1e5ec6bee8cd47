"""What rank 0 and the worker ranks of an mpi4py serial pilot say to each other. No MPI here.

Rank 0 leases and reports; each worker rank runs the jobs packed on its node. They exchange
small JSON documents, one per MPI message, all on one tag:

    rank 0 → worker   assign (the node it serves, or none), start, signal, ping, stop
    worker → rank 0   started (pid) | start_refused (why), exited (status, stderr tail),
                      ping, bye

Every rank runs the same code from the same installation, so there is one version; a
document that is not one of these is a :class:`ProtocolError` (the receiver logs and drops
it). JSON rather than pickle: a message is data, never code, whoever sent it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import orjson

from lodestream.agents.launcher.errors import ProtocolError
from lodestream.platform_adapters.compute.base import NodePlacement
from lodestream.platform_adapters.launchers.base import TaskSpec
from lodestream.platform_adapters.packing import Allocation

TAG: Final = 0x10DE  # the one MPI tag of the pilot's messages
VERSION: Final = 1


# --- rank 0 → worker ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Assign:
    """The node this worker serves (None: none; it waits for ``stop``), how long rank 0 may
    stay silent, and the variable that carries a task's GPU ids on this machine."""

    node: str | None
    timeout_s: float
    gpu_env: str = "CUDA_VISIBLE_DEVICES"


@dataclass(frozen=True, slots=True)
class Start:
    spec: TaskSpec


@dataclass(frozen=True, slots=True)
class Signal:
    """Terminate (SIGTERM, SIGKILL after ``grace_s``) or, with ``kill``, SIGKILL a task now."""

    job_id: str
    kill: bool = False
    grace_s: float = 0.0


@dataclass(frozen=True, slots=True)
class Stop:
    reason: str


# --- worker → rank 0 ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Started:
    job_id: str
    pid: int


@dataclass(frozen=True, slots=True)
class StartRefused:
    job_id: str
    reason: str


@dataclass(frozen=True, slots=True)
class Exited:
    job_id: str
    returncode: int
    stderr_tail: str = ""  # read on the worker's node, where the task wrote it


@dataclass(frozen=True, slots=True)
class Bye:
    pass


# --- both ways ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Ping:
    pass


Message = Assign | Start | Signal | Stop | Started | StartRefused | Exited | Bye | Ping

_OPS: Final[dict[type[Any], str]] = {
    Assign: "assign", Start: "start", Signal: "signal", Stop: "stop", Started: "started",
    StartRefused: "start_refused", Exited: "exited", Bye: "bye", Ping: "ping",
}  # fmt: skip
_CLASSES: Final[dict[str, type[Any]]] = {op: cls for cls, op in _OPS.items()}


def encode(message: Message) -> bytes:
    body: dict[str, Any]
    match message:
        case Start(spec=spec):
            body = {"spec": spec_to_wire(spec)}
        case Assign() | Signal() | Stop() | Started() | StartRefused() | Exited():
            body = {name: getattr(message, name) for name in message.__dataclass_fields__}
        case Bye() | Ping():
            body = {}
    return orjson.dumps({"op": _OPS[type(message)], "v": VERSION, **body})


def decode(data: bytes) -> Message:
    """The message in ``data``; :class:`ProtocolError` if it is none of ours."""
    try:
        doc = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise ProtocolError(f"a pilot message that is not JSON: {exc}") from exc
    if not isinstance(doc, dict) or doc.get("v") != VERSION:
        raise ProtocolError(f"not a version {VERSION} pilot message")
    try:
        return _decode(doc)
    except (KeyError, TypeError, ValueError) as exc:  # ProtocolError is a ValueError
        raise ProtocolError(f"unreadable {doc.get('op')!r} message: {exc!r}") from exc


def _decode(doc: dict[str, Any]) -> Message:  # noqa: PLR0911 - one return per kind
    cls = _CLASSES.get(doc["op"])
    if cls is None:
        raise ProtocolError(f"unknown pilot message {doc['op']!r}")
    if set(doc) != {"op", "v", *cls.__dataclass_fields__}:
        raise ProtocolError(f"{doc['op']!r}: fields {sorted(doc)}")
    match doc["op"]:
        case "assign":
            node = doc["node"]
            node = None if node is None else _str(node)
            return Assign(node, _float(doc["timeout_s"]), _str(doc["gpu_env"]))
        case "start":
            return Start(spec_from_wire(doc["spec"]))
        case "signal":
            kill = doc["kill"]
            if not isinstance(kill, bool):
                raise ProtocolError("signal.kill: not a boolean")
            return Signal(_str(doc["job_id"]), kill, _float(doc["grace_s"]))
        case "stop":
            return Stop(_str(doc["reason"]))
        case "started":
            return Started(_str(doc["job_id"]), _int(doc["pid"]))
        case "start_refused":
            return StartRefused(_str(doc["job_id"]), _str(doc["reason"]))
        case "exited":
            return Exited(_str(doc["job_id"]), _int(doc["returncode"]), _str(doc["stderr_tail"]))
        case "bye":
            return Bye()
        case "ping":
            return Ping()
    raise ProtocolError(f"unknown pilot message {doc['op']!r}")


# --- the task spec ------------------------------------------------------------------------


def spec_to_wire(spec: TaskSpec) -> dict[str, Any]:
    return {
        "job_id": spec.job_id, "script": spec.script, "workdir": str(spec.workdir),
        "env": dict(spec.env), "stdout_path": str(spec.stdout_path),
        "stderr_path": str(spec.stderr_path), "ranks_per_node": spec.ranks_per_node,
        "threads_per_rank": spec.threads_per_rank, "threads_per_core": spec.threads_per_core,
        "gpus_per_rank": spec.gpus_per_rank, "launch_params": dict(spec.launch_params),
        "argv": list(spec.argv) if spec.argv is not None else None,
        "argv_env": dict(spec.argv_env),
        "placements": [
            {"hostname": p.hostname, "cpu_ids": list(p.cpu_ids), "gpu_ids": list(p.gpu_ids)}
            for p in spec.allocation.placements
        ],
    }  # fmt: skip


_SPEC_FIELDS: Final = frozenset({
    "job_id", "script", "workdir", "env", "stdout_path", "stderr_path", "ranks_per_node",
    "threads_per_rank", "threads_per_core", "gpus_per_rank", "launch_params", "argv",
    "argv_env", "placements",
})  # fmt: skip


def spec_from_wire(doc: Mapping[str, Any]) -> TaskSpec:
    if not isinstance(doc, dict) or set(doc) != _SPEC_FIELDS:
        raise ProtocolError("a task spec with other fields than a spec's")
    job_id = _str(doc["job_id"])
    placements = tuple(
        NodePlacement(_str(p["hostname"]), tuple(_int(c) for c in p["cpu_ids"]),
                      tuple(_str(g) for g in p["gpu_ids"]))
        for p in doc["placements"]
    )  # fmt: skip
    argv = doc["argv"]
    return TaskSpec(
        job_id=job_id, script=_str(doc["script"]), workdir=Path(_str(doc["workdir"])),
        env=_strings(doc["env"]), allocation=Allocation(job_id, placements),
        stdout_path=Path(_str(doc["stdout_path"])), stderr_path=Path(_str(doc["stderr_path"])),
        ranks_per_node=_int(doc["ranks_per_node"]), threads_per_rank=_int(doc["threads_per_rank"]),
        threads_per_core=_int(doc["threads_per_core"]), gpus_per_rank=_int(doc["gpus_per_rank"]),
        launch_params=_strings(doc["launch_params"]),
        argv=None if argv is None else tuple(_str(a) for a in argv),
        argv_env=_strings(doc["argv_env"]),
    )  # fmt: skip


def _str(value: Any) -> str:
    if not isinstance(value, str):
        raise ProtocolError(f"expected a string, got {type(value).__name__}")
    return value


def _int(value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise ProtocolError(f"expected an integer, got {type(value).__name__}")
    return value


def _float(value: Any) -> float:
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise ProtocolError(f"expected a number, got {type(value).__name__}")
    return float(value)


def _strings(value: Any) -> dict[str, str]:
    if not isinstance(value, dict):
        raise ProtocolError(f"expected a mapping, got {type(value).__name__}")
    return {_str(k): _str(v) for k, v in value.items()}
