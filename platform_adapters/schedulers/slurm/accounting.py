"""A finished Slurm job's record: from ``sacct``, or from a ``jobcomp/filetxt`` log.

A Slurm without slurmdbd keeps no accounting that ``sacct`` can read, but its controller can
append one line per ended job to a text file (``JobCompType=jobcomp/filetxt``, at
``JobCompLoc``)::

    JobId=42 UserId=alice(1000) GroupId=alice(1000) Name=pilot JobState=TIMEOUT Partition=debug
    TimeLimit=1 StartTime=2024-03-01T10:00:00 EndTime=2024-03-01T10:01:02 NodeList=n[1-2]
    NodeCnt=2 ProcCnt=8 WorkDir=/home/alice ... DerivedExitCode=0:0 ExitCode=0:15

(one line in the file). Values may hold spaces (``Name``, ``WorkDir``), so a line is split
only before the keys Slurm writes, not at every space. A requeued job has several lines; the
last one is its end. Times are the controller's local time.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from datetime import tzinfo
from typing import Final

from lodestream.platform_adapters.compute.hostlist import expand_hostlist
from lodestream.platform_adapters.errors import SchedulerCommandFailed, UnknownBatchJob
from lodestream.platform_adapters.schedulers.base import BatchRecord
from lodestream.platform_adapters.schedulers.parsing import skip
from lodestream.platform_adapters.schedulers.runner import CommandResult, failure_message
from lodestream.platform_adapters.schedulers.slurm.render import SACCT_FIELDS
from lodestream.platform_adapters.schedulers.slurm.states import slurm_state
from lodestream.platform_adapters.schedulers.timeparse import parse_local_iso

JOBCOMP_KEYS: Final = (
    "JobId", "UserId", "GroupId", "Name", "JobState", "Partition", "TimeLimit", "StartTime",
    "EndTime", "NodeList", "NodeCnt", "ProcCnt", "WorkDir", "ReservationName", "Tres", "Account",
    "QOS", "WcKey", "Cluster", "SubmitTime", "EligibleTime", "ArrayJobId", "ArrayTaskId",
    "HetJobId", "HetJobOffset", "DerivedExitCode", "ExitCode",
)  # fmt: skip
_JOBCOMP_SPLIT: Final = re.compile(r" (?=(?:" + "|".join(JOBCOMP_KEYS) + r")=)")


def exit_and_signal(text: str) -> tuple[int | None, int | None]:
    """Slurm's ``code:signal`` (``0:15``); a signal of 0 is None."""
    code, _, signal = text.strip().partition(":")
    if not code.isdigit() or (signal and not signal.isdigit()):
        raise ValueError(f"malformed exit code {text!r}")
    return int(code), (int(signal) or None) if signal else None


def parse_sacct(result: CommandResult, scheduler_id: str, *, tz: tzinfo | None) -> BatchRecord:
    """``sacct --parsable2 --noheader --allocations --format=<SACCT_FIELDS>`` for one job."""
    if result.returncode != 0:
        raise SchedulerCommandFailed(
            failure_message(result)
            + " (a Slurm without slurmdbd can be read from its jobcomp/filetxt log instead)",
            argv=result.argv,
            returncode=result.returncode,
        )
    record: BatchRecord | None = None
    for line in result.stdout.splitlines():
        if not line.strip():
            continue
        fields = line.split("|")
        if len(fields) != len(SACCT_FIELDS):
            skip("slurm", "sacct line", line, f"{len(fields)} fields, not {len(SACCT_FIELDS)}")
            continue
        if fields[0] != scheduler_id:
            continue  # a step line, or another job of an array
        try:
            record = _record_from_sacct(fields, tz)
        except ValueError as exc:
            skip("slurm", "sacct line", line, exc)
    if record is None:
        raise UnknownBatchJob(f"slurm: sacct has no record of job {scheduler_id}")
    return record


def _record_from_sacct(fields: list[str], tz: tzinfo | None) -> BatchRecord:
    job_id, native, exit_code, start, end, nnodes, nodelist = fields
    state, native = slurm_state(native)
    code, signal = exit_and_signal(exit_code)
    hostnames = tuple(expand_hostlist(nodelist)) if nodelist != "None assigned" else ()
    return BatchRecord(
        scheduler_id=job_id,
        state=state,
        native_state=native,
        start_time=parse_local_iso(start, tz),
        end_time=parse_local_iso(end, tz),
        exit_code=code,
        signal=signal,
        nodes=int(nnodes) if nnodes.isdigit() else len(hostnames),
        hostnames=hostnames,
    )


def parse_jobcomp_line(line: str) -> dict[str, str]:
    """The ``Key=value`` fields of one jobcomp/filetxt line; ``ValueError`` if it is not one."""
    line = line.rstrip("\n").strip()
    if not line.startswith("JobId="):
        raise ValueError("does not start with JobId=")
    fields: dict[str, str] = {}
    for part in _JOBCOMP_SPLIT.split(line):
        key, sep, value = part.partition("=")
        if not sep:
            raise ValueError(f"no '=' in {part!r}")
        fields[key] = value
    for key in ("JobState", "StartTime", "EndTime"):
        if key not in fields:
            raise ValueError(f"no {key}")
    return fields


def find_jobcomp_record(
    lines: Iterable[str], scheduler_id: str, *, tz: tzinfo | None
) -> BatchRecord | None:
    """The job's last record in a jobcomp/filetxt log, or None; bad lines are skipped."""
    prefix = f"JobId={scheduler_id} "
    last: dict[str, str] | None = None
    for line in lines:
        if not line.startswith(prefix):
            continue
        try:
            last = parse_jobcomp_line(line)
        except ValueError as exc:
            skip("slurm", "jobcomp line", line, exc)
    if last is None:
        return None
    try:
        return _record_from_jobcomp(scheduler_id, last, tz)
    except ValueError as exc:
        skip("slurm", "jobcomp record", last, exc)
        return None


def _record_from_jobcomp(
    scheduler_id: str, fields: dict[str, str], tz: tzinfo | None
) -> BatchRecord:
    state, native = slurm_state(fields["JobState"])
    code, signal = exit_and_signal(fields.get("ExitCode", "0:0"))
    hostnames = tuple(expand_hostlist(fields.get("NodeList", "")))
    nodes = fields.get("NodeCnt", "")
    return BatchRecord(
        scheduler_id=scheduler_id,
        state=state,
        native_state=native,
        start_time=parse_local_iso(fields["StartTime"], tz),
        end_time=parse_local_iso(fields["EndTime"], tz),
        exit_code=code,
        signal=signal,
        nodes=int(nodes) if nodes.isdigit() else len(hostnames),
        hostnames=hostnames,
    )
