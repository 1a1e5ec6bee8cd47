"""How long the batch job has left, as its scheduler says. Parsers are pure.

``seconds_left(scheduler)`` returns the seconds until the allocation ends (never negative), or
None when it has no limit. Sources, first that answers:

* Slurm: ``SLURM_JOB_END_TIME`` (epoch seconds, Slurm 23.02 and later), else
  ``squeue -h -j $SLURM_JOB_ID -o %L``;
* PBS: ``qstat -f $PBS_JOBID``, ``Resource_List.walltime`` less ``resources_used.walltime``;
  when qstat fails, ``PBS_WALLTIME`` (Torque: the limit in seconds, right at the job's start);
* LSF: ``bjobs -noheader -o time_left $LSB_JOBID`` (LSF sets no end-time variable);
* Cobalt: ``COBALT_ENDTIME`` (epoch seconds);
* Flux: ``flux job timeleft`` (whole seconds; ``UINT_MAX`` for no limit);
* local: no limit.

PBS's ``resources_used.walltime`` is refreshed by the MOM every minute or so, so the PBS answer
can be that much too long; callers keep a safety margin anyway.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Mapping

from lodestream.platform_adapters.compute.commands import CommandRunner, run_command
from lodestream.platform_adapters.compute.machine import Scheduler
from lodestream.platform_adapters.errors import AllocationNotFound, SchedulerQueryFailed

FLUX_NO_LIMIT = 2**32 - 1  # UINT_MAX, what `flux job timeleft` prints for an unlimited job

_SLURM_LEFT = re.compile(r"(?:(?:(\d+)-)?(\d+):)?(\d+):(\d+)")
_LSF_LEFT = re.compile(r"(\d+):(\d+)(?::(\d+))?(?:\s+[A-Z])?")
# "    key = value"; a value too long for one line continues on lines that start with a tab.
_PBS_FIELD = re.compile(r"^ +([A-Za-z_][\w.]*) = (.*?)\s*$")


def parse_slurm_time_left(text: str) -> float | None:
    """squeue's ``%L``: ``D-HH:MM:SS``, ``HH:MM:SS``, ``MM:SS`` or ``UNLIMITED``."""
    value = text.strip()
    if value.upper() == "UNLIMITED":
        return None
    match = _SLURM_LEFT.fullmatch(value)
    if match is None:  # INVALID, NOT_SET, empty: the job is not running or has no answer
        raise SchedulerQueryFailed(f"squeue: cannot read time left {value!r}")
    days, hours, minutes, seconds = (int(g) if g else 0 for g in match.groups())
    return float(((days * 24 + hours) * 60 + minutes) * 60 + seconds)


def parse_pbs_duration(text: str) -> float:
    """A PBS duration: ``[[HH:]MM:]SS`` (hours may exceed 24), optionally with fractions."""
    value = text.strip()
    parts = value.split(":")
    if not 1 <= len(parts) <= 3 or not all(re.fullmatch(r"\d+(?:\.\d+)?", p) for p in parts):
        raise SchedulerQueryFailed(f"PBS: cannot read duration {value!r}")
    seconds = 0.0
    for part in parts:
        seconds = seconds * 60 + float(part)
    return seconds


def parse_pbs_qstat(text: str) -> float | None:
    """Seconds left from ``qstat -f``: the walltime limit less the walltime used so far."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        if match := _PBS_FIELD.match(line):
            fields[match[1]] = match[2]
    limit = fields.get("Resource_List.walltime")
    if limit is None:
        if "Job_Name" not in fields and not text.lstrip().startswith("Job Id:"):
            raise SchedulerQueryFailed("qstat -f: not a job's full status")
        return None
    used = fields.get("resources_used.walltime")
    elapsed = parse_pbs_duration(used) if used is not None else 0.0
    return max(parse_pbs_duration(limit) - elapsed, 0.0)


def parse_lsf_time_left(text: str) -> float | None:
    """bjobs' ``time_left``: ``H:MM`` (or ``HH:MM:SS`` with ``-hms``), a status letter after
    (L, E, X), or ``-`` when the job has no run limit."""
    value = text.strip()
    if value in {"", "-"}:
        return None
    match = _LSF_LEFT.fullmatch(value)
    if match is None:
        raise SchedulerQueryFailed(f"bjobs: cannot read time_left {value!r}")
    hours, minutes, seconds = (int(g) if g else 0 for g in match.groups())
    return float((hours * 60 + minutes) * 60 + seconds)


def parse_flux_timeleft(text: str) -> float | None:
    value = text.strip()
    if not (value.isascii() and value.isdigit()):
        raise SchedulerQueryFailed(f"flux job timeleft: cannot read {value!r}")
    seconds = int(value)
    return None if seconds >= FLUX_NO_LIMIT else float(seconds)


def parse_epoch(text: str, what: str) -> float:
    try:
        value = float(text.strip())
    except ValueError:
        raise SchedulerQueryFailed(f"{what}={text!r} is not a time in seconds") from None
    if value <= 0:
        raise SchedulerQueryFailed(f"{what}={text!r} is not a time in seconds")
    return value


def seconds_left(
    scheduler: Scheduler,
    *,
    environ: Mapping[str, str] | None = None,
    run: CommandRunner = run_command,
    now: Callable[[], float] = time.time,
) -> float | None:
    """Seconds until the allocation ends (``>= 0``), or None if it has no limit."""
    env = environ if environ is not None else os.environ
    left: float | None
    if scheduler == "local":
        return None
    if scheduler == "slurm":
        left = _slurm(env, run, now)
    elif scheduler == "pbs":
        left = _pbs(env, run)
    elif scheduler == "lsf":
        job = _need(env, "LSB_JOBID", "LSF")
        left = parse_lsf_time_left(run(("bjobs", "-noheader", "-o", "time_left", job)))
    elif scheduler == "cobalt":
        left = parse_epoch(_need(env, "COBALT_ENDTIME", "Cobalt"), "COBALT_ENDTIME") - now()
    else:
        left = parse_flux_timeleft(run(("flux", "job", "timeleft")))
    return None if left is None else max(left, 0.0)


def _slurm(env: Mapping[str, str], run: CommandRunner, now: Callable[[], float]) -> float | None:
    if end := env.get("SLURM_JOB_END_TIME"):
        return parse_epoch(end, "SLURM_JOB_END_TIME") - now()
    job = _need(env, "SLURM_JOB_ID", "Slurm")
    return parse_slurm_time_left(run(("squeue", "-h", "-j", job, "-o", "%L")))


def _pbs(env: Mapping[str, str], run: CommandRunner) -> float | None:
    job = _need(env, "PBS_JOBID", "PBS")
    try:
        return parse_pbs_qstat(run(("qstat", "-f", job)))
    except SchedulerQueryFailed:
        if limit := env.get("PBS_WALLTIME"):
            return parse_pbs_duration(limit)
        raise


def _need(env: Mapping[str, str], name: str, scheduler: str) -> str:
    value = env.get(name)
    if not value:
        raise AllocationNotFound(f"{name} is not set: not inside a {scheduler} job")
    return value
