"""Reading sbatch, squeue (``--json`` of Slurm 22.05 to 24.x, and ``--format`` text) and scancel.

``squeue --json`` changed shape across versions: 22.05 prints plain numbers and a string state;
23.02 on wrap numbers as ``{"set": true, "infinite": false, "number": N}``, and 23.11 on list
the state with its flags (``["RUNNING", "COMPLETING"]``). Both are read by the same code.
"""

from __future__ import annotations

import re
from datetime import datetime, tzinfo
from typing import Any, Final

from lodestream.platform_adapters.compute.hostlist import expand_hostlist
from lodestream.platform_adapters.errors import (
    SchedulerCommandFailed,
    SubmitRejected,
    UnparseableOutput,
)
from lodestream.platform_adapters.schedulers.base import BatchStatus
from lodestream.platform_adapters.schedulers.parsing import expect_object, load_json, skip
from lodestream.platform_adapters.schedulers.runner import CommandResult, failure_message
from lodestream.platform_adapters.schedulers.slurm.render import SQUEUE_FIELDS
from lodestream.platform_adapters.schedulers.slurm.states import slurm_state
from lodestream.platform_adapters.schedulers.timeparse import (
    duration_s,
    from_epoch,
    minutes_of,
    parse_local_iso,
    seconds_between,
)
from lodestream.schemas.resources import SchedulerState

INVALID_JOB_ID: Final = "Invalid job id specified"
ALREADY_DONE: Final = "already completing or completed"
_NO_VAL: Final = 0xFFFFFFFE  # Slurm's NO_VAL and INFINITE for 32-bit fields (22.05 JSON)
_SUBMITTED: Final = re.compile(r"(?:Submitted batch job )?(\d+)(?:;\S+)?")


def parse_sbatch(result: CommandResult) -> str:
    """The job id ``sbatch --parsable`` printed (``123`` or ``123;cluster``)."""
    if result.returncode != 0:
        raise SubmitRejected(
            failure_message(result), argv=result.argv, returncode=result.returncode
        )
    for line in reversed(result.stdout.splitlines()):
        match = _SUBMITTED.fullmatch(line.strip())
        if match:
            return match.group(1)
    raise UnparseableOutput(f"slurm: no job id in sbatch's output {result.stdout[:200]!r}")


def _unknown_ids_only(result: CommandResult) -> bool:
    # `squeue --jobs=<one purged id>` fails instead of listing nothing.
    return INVALID_JOB_ID in result.stderr or INVALID_JOB_ID in result.stdout


def parse_squeue_json(result: CommandResult, *, now: datetime) -> dict[str, BatchStatus]:
    if result.returncode != 0:
        if _unknown_ids_only(result):
            return {}
        raise SchedulerCommandFailed(
            failure_message(result), argv=result.argv, returncode=result.returncode
        )
    document = expect_object(load_json(result, "slurm"), "squeue --json", "slurm")
    jobs = document.get("jobs")
    if not isinstance(jobs, list):
        raise UnparseableOutput(
            f"slurm: squeue --json printed no job list: {result.stdout[:200]!r}"
        )
    found: dict[str, BatchStatus] = {}
    for job in jobs:
        try:
            status = _status_from_json(job, now)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            skip("slurm", "squeue job", job, exc)
            continue
        found[status.scheduler_id] = status
    return found


def _status_from_json(job: dict[str, Any], now: datetime) -> BatchStatus:
    job_id = number(job["job_id"])
    if job_id is None:
        raise ValueError("no job_id")
    state, native = slurm_state(job["job_state"])
    hostnames = tuple(expand_hostlist(str(job.get("nodes") or "")))
    node_count = number(job.get("node_count"))
    start = None if state is SchedulerState.QUEUED else from_epoch(number(job.get("start_time")))
    end = from_epoch(number(job.get("end_time"))) if state not in _ACTIVE else None
    reason = str(job.get("state_reason") or "")
    return BatchStatus(
        scheduler_id=str(job_id),
        state=state,
        native_state=native,
        nodes=node_count if node_count is not None else len(hostnames),
        hostnames=hostnames,
        queue=str(job.get("partition") or ""),
        wall_time_min=number(job.get("time_limit")),
        start_time=start,
        elapsed_s=seconds_between(start, end or now),
        reason="" if reason == "None" else reason,
        exit_code=None if state in _ACTIVE else exit_code_of(job.get("exit_code")),
        name=str(job.get("name") or ""),
    )


_ACTIVE: Final = frozenset({SchedulerState.QUEUED, SchedulerState.RUNNING})


def number(value: Any) -> int | None:
    """A Slurm JSON number: plain (22.05) or ``{"set", "infinite", "number"}`` (23.02 on).

    Unset, infinite and the 32-bit NO_VAL/INFINITE markers are None.
    """
    if value is None:
        return None
    if isinstance(value, dict):
        if not value.get("set", True) or value.get("infinite", False):
            return None
        return number(value.get("number"))
    if isinstance(value, bool):
        raise TypeError(f"not a number: {value!r}")
    if isinstance(value, int | float):
        return None if value >= _NO_VAL else int(value)
    if isinstance(value, str) and value.isdigit():
        return int(value)
    raise TypeError(f"not a number: {value!r}")


def exit_code_of(value: Any) -> int | None:
    """The batch script's exit status from ``exit_code`` in any version's shape."""
    if isinstance(value, dict):  # 23.02 on: {"status": [...], "return_code": N, "signal": ...}
        return number(value.get("return_code"))
    code = number(value)
    if code is not None and code > 255:  # a raw wait status: the code is its second byte
        return (code >> 8) & 0xFF
    return code


def parse_squeue_text(result: CommandResult, *, tz: tzinfo | None) -> dict[str, BatchStatus]:
    """``squeue --noheader --format=<SQUEUE_FIELDS joined by |>``, for Slurm without ``--json``."""
    if result.returncode != 0:
        if _unknown_ids_only(result):
            return {}
        raise SchedulerCommandFailed(
            failure_message(result), argv=result.argv, returncode=result.returncode
        )
    found: dict[str, BatchStatus] = {}
    for line in result.stdout.splitlines():
        if not line.strip():
            continue
        fields = line.split("|", len(SQUEUE_FIELDS) - 1)
        if len(fields) != len(SQUEUE_FIELDS):
            skip("slurm", "squeue line", line, f"{len(fields)} fields, not {len(SQUEUE_FIELDS)}")
            continue
        try:
            status = _status_from_text(fields, tz)
        except ValueError as exc:
            skip("slurm", "squeue line", line, exc)
            continue
        found[status.scheduler_id] = status
    return found


def _status_from_text(fields: list[str], tz: tzinfo | None) -> BatchStatus:
    job_id, native, nodes, partition, limit, elapsed, start, nodelist, reason = fields
    if not job_id.strip():
        raise ValueError("empty job id")
    state, native = slurm_state(native.strip())
    started = state is not SchedulerState.QUEUED
    return BatchStatus(
        scheduler_id=job_id.strip(),
        state=state,
        native_state=native,
        nodes=int(nodes),
        hostnames=tuple(expand_hostlist(nodelist)),
        queue=partition.strip(),
        wall_time_min=minutes_of(duration_s(limit)),
        start_time=parse_local_iso(start, tz) if started else None,
        elapsed_s=duration_s(elapsed) if started else None,
        reason="" if reason.strip() == "None" else reason.strip(),
    )


def parse_scancel(result: CommandResult) -> bool:
    """True if scancel took the job; False if Slurm says it is unknown or already over."""
    said = result.stderr + result.stdout
    if INVALID_JOB_ID in said or ALREADY_DONE in said:
        return False
    if result.returncode != 0:
        raise SchedulerCommandFailed(
            failure_message(result), argv=result.argv, returncode=result.returncode
        )
    return True
