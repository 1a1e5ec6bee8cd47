"""The PBS Professional / OpenPBS adapter: qsub ``-l select=``, ``qstat -f -F json``, qdel,
``pbsnodes -a -F json``.

A finished job (``job_state`` F, seen with ``qstat -x`` where job history is on) ends as its
exit status and substate say: ``Exit_status`` -29 is PBS's JOB_EXEC_KILL_WALLTIME, substate 91
a job deleted by qdel, 92 one that finished, 93 one that failed to run. ``pbsnodes`` says which
nodes are free but not for how long, so PBS windows have no length (``minutes=None``).

PBS writes a backslash before commas and other specials in ``Variable_List`` and some other
values without making them valid JSON escapes (``\\,``); those backslashes are doubled before
the JSON is read, so such a job does not make the whole listing unreadable.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import replace
from datetime import datetime, tzinfo
from pathlib import Path
from types import MappingProxyType
from typing import Any, Final, Unpack

from lodestream.platform_adapters.errors import (
    InvalidSubmission,
    SchedulerCommandFailed,
    SubmitRejected,
    UnknownBatchJob,
    UnparseableOutput,
)
from lodestream.platform_adapters.schedulers.base import (
    BackfillWindow,
    BatchRecord,
    BatchRequest,
    BatchStatus,
    Capabilities,
)
from lodestream.platform_adapters.schedulers.command import CommandOptions, CommandScheduler
from lodestream.platform_adapters.schedulers.directives import (
    Flag,
    Syntax,
    argv_words,
    directive_block,
    separate,
)
from lodestream.platform_adapters.schedulers.parsing import expect_object, map_state, skip
from lodestream.platform_adapters.schedulers.runner import (
    CommandResult,
    failure_message,
    require_success,
)
from lodestream.platform_adapters.schedulers.timeparse import (
    duration_s,
    minutes_of,
    parse_local,
    seconds_between,
)
from lodestream.platform_adapters.schedulers.windows import windows_from_free_nodes
from lodestream.schemas.resources import SchedulerState

Q, R = SchedulerState.QUEUED, SchedulerState.RUNNING
# qsub splits an -l value at commas into further resources: `-l comment=x,place=excl`.
PBS: Final = Syntax("pbs", "#PBS", forbidden_chars=",")

PBS_STATES: Final[Mapping[str, SchedulerState]] = MappingProxyType({
    "Q": Q,
    "H": Q,  # held
    "W": Q,  # waiting for its -a start time
    "T": Q,  # in transit to another queue
    "M": Q,  # moved to another server, where it waits
    "B": R,  # array job with subjobs started
    "R": R,
    "E": R,  # exiting after its run
    "S": R,  # suspended after it started
    "U": R,  # suspended: the workstation is busy
    "F": SchedulerState.FINISHED,  # refined by PBS_FINISH_BY_EXIT and PBS_FINISH_BY_SUBSTATE
    "X": SchedulerState.FINISHED,  # a finished subjob; refined the same way
})  # fmt: skip

PBS_FINISH_BY_EXIT: Final[Mapping[int, SchedulerState]] = MappingProxyType({
    -29: SchedulerState.WALLTIME_EXPIRED,  # JOB_EXEC_KILL_WALLTIME
})  # fmt: skip
PBS_FINISH_BY_SUBSTATE: Final[Mapping[int, SchedulerState]] = MappingProxyType({
    91: SchedulerState.CANCELLED,  # JOB_SUBSTATE_TERMINATED: qdel
    93: SchedulerState.FAILED,  # JOB_SUBSTATE_FAILED
})  # fmt: skip

PBS_TIME_FORMAT: Final = "%a %b %d %H:%M:%S %Y"  # ctime(3): "Fri Mar  1 10:00:00 2024"
UNKNOWN_JOB: Final = "Unknown Job Id"
_GONE: Final = (UNKNOWN_JOB, "Job has finished", "Request invalid for state of job")
_ESCAPE: Final = re.compile(r"\\(.)", re.DOTALL)
_JSON_ESCAPES: Final = frozenset('"\\/bfnrtu')


def pbs_state(job_state: str, substate: int | None, exit_status: int | None) -> SchedulerState:
    state = map_state(PBS_STATES, job_state, "pbs")
    if state is not SchedulerState.FINISHED:
        return state
    if exit_status is not None and exit_status in PBS_FINISH_BY_EXIT:
        return PBS_FINISH_BY_EXIT[exit_status]
    if substate is not None and substate in PBS_FINISH_BY_SUBSTATE:
        return PBS_FINISH_BY_SUBSTATE[substate]
    return SchedulerState.FINISHED if not exit_status else SchedulerState.FAILED


def _walltime(minutes: int) -> str:
    return f"{minutes // 60:02d}:{minutes % 60:02d}:00"


def _resource_flags(request: BatchRequest) -> list[Flag]:
    """The ``-l`` flags: the select chunk (plus the ``select`` option), walltime, the rest."""
    chunk = f"{request.nodes}"
    if request.options.get("select"):
        chunk += ":" + request.options["select"]
    flags = [
        separate("nodes", "-l", f"select={chunk}"),
        separate("wall_time_min", "-l", f"walltime={_walltime(request.wall_time_min)}"),
    ]
    for name, value in request.options.items():
        if name == "select":
            continue
        if not value:
            raise InvalidSubmission(f"PBS resource {name} needs a value (-l {name}=<value>)")
        flags.append(separate(f"option {name}", "-l", f"{name}={value}"))
    return flags


def _named_flags(request: BatchRequest) -> list[Flag]:
    flags = []
    if request.project:
        flags.append(separate("project", "-A", request.project))
    if request.queue:
        flags.append(separate("queue", "-q", request.queue))
    if request.job_name:
        flags.append(separate("job_name", "-N", request.job_name))
    return flags


def render_qsub_argv(script_path: Path, request: BatchRequest) -> list[str]:
    """``qsub -l select=N[:...] -l walltime=...``; options become ``-l name=value``.

    ``-v`` names the variables of ``request.env``; qsub takes their values from its own
    environment, which carries them, so no value has to survive PBS's comma splitting.
    """
    stem = script_path.parent / script_path.stem
    words = ["qsub", *argv_words(_named_flags(request) + _resource_flags(request), PBS)]
    words += ["-o", f"{stem}.out", "-e", f"{stem}.err"]
    if request.env:
        words += ["-v", ",".join(request.env)]
    return [*words, *request.extra_args, str(script_path)]


def render_pbs_header(request: BatchRequest) -> str:
    return directive_block(_named_flags(request) + _resource_flags(request), PBS)


def render_qstat_argv(ids: tuple[str, ...] | None) -> list[str]:
    """With ids, ``-x`` shows them after they finish too (where job history is on)."""
    return (
        ["qstat", "-f", "-F", "json"] if ids is None else ["qstat", "-x", "-f", "-F", "json", *ids]
    )


def parse_qsub(result: CommandResult) -> str:
    """qsub prints the new job's id (``123.pbs01``) as its last line."""
    if result.returncode != 0:
        raise SubmitRejected(
            failure_message(result), argv=result.argv, returncode=result.returncode
        )
    lines = [line.strip() for line in result.stdout.splitlines() if line.strip()]
    if not lines or not re.fullmatch(r"\d+(\[\])?(\.\S+)?", lines[-1]):
        raise UnparseableOutput(f"pbs: no job id in qsub's output {result.stdout[:200]!r}")
    return lines[-1]


def load_pbs_json(result: CommandResult) -> dict[str, Any]:
    """stdout as JSON, with PBS's invalid backslash escapes doubled first."""
    # Pairs are taken left to right, so an escaped backslash before a comma stays as it is.
    text = _ESCAPE.sub(_repair_escape, result.stdout)
    try:
        document = json.loads(text, strict=False)  # raw tabs and newlines in comments
    except ValueError as exc:
        raise UnparseableOutput(
            f"pbs: {result.argv[0]} printed something that is not JSON ({exc}): "
            f"{result.stdout[:200]!r}"
        ) from exc
    return expect_object(document, f"{result.argv[0]} output", "pbs")


def _repair_escape(match: re.Match[str]) -> str:
    char = match.group(1)
    return match.group(0) if char in _JSON_ESCAPES else "\\\\" + char


def _only_unknown_ids(stderr: str) -> bool:
    lines = [line for line in stderr.splitlines() if line.strip()]
    return all(any(sign in line for sign in _GONE) for line in lines)


def qstat_jobs(result: CommandResult) -> dict[str, Any]:
    """The ``Jobs`` object of ``qstat [-x] -f -F json``, by id; {} if none is known.

    qstat exits non-zero when some ids are unknown, and still prints the others.
    """
    if result.returncode != 0 and not _only_unknown_ids(result.stderr):
        raise SchedulerCommandFailed(
            failure_message(result), argv=result.argv, returncode=result.returncode
        )
    if not result.stdout.strip():
        return {}
    jobs = load_pbs_json(result).get("Jobs", {})
    if not isinstance(jobs, dict):
        raise UnparseableOutput(f"pbs: qstat's Jobs is not an object: {jobs!r:.200}")
    return jobs


def parse_qstat(
    result: CommandResult, *, owner: str | None, now: datetime, tz: tzinfo | None
) -> dict[str, BatchStatus]:
    """Each job ``qstat [-x] -f -F json`` shows, only ``owner``'s when given."""
    found: dict[str, BatchStatus] = {}
    for job_id, job in qstat_jobs(result).items():
        try:
            if owner is not None and str(job["Job_Owner"]).split("@")[0] != owner:
                continue
            found[job_id] = _status(job_id, job, now, tz)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            skip("pbs", "qstat job", job_id, exc)
    return found


def _int_or_none(value: Any) -> int | None:
    return None if value is None or value == "" else int(value)


def exec_hosts(exec_host: str) -> tuple[str, ...]:
    """``x1/0*64+x2/0*64`` as ``(x1, x2)``: each host once, in order."""
    hosts = (part.split("/")[0] for part in exec_host.split("+") if part)
    return tuple(dict.fromkeys(hosts))


def _status(job_id: str, job: dict[str, Any], now: datetime, tz: tzinfo | None) -> BatchStatus:
    resources = job.get("Resource_List", {})
    exit_status = _int_or_none(job.get("Exit_status"))
    state = pbs_state(str(job["job_state"]), _int_or_none(job.get("substate")), exit_status)
    start = parse_local(job["stime"], PBS_TIME_FORMAT, tz) if "stime" in job else None
    used = duration_s(str(job.get("resources_used", {}).get("walltime", "")))
    hostnames = exec_hosts(str(job.get("exec_host", "")))
    nodect = _int_or_none(resources.get("nodect"))
    return BatchStatus(
        scheduler_id=job_id,
        state=state,
        native_state=str(job["job_state"]),
        nodes=nodect if nodect is not None else len(hostnames),
        hostnames=hostnames,
        queue=str(job.get("queue", "")),
        wall_time_min=minutes_of(duration_s(str(resources.get("walltime", "")))),
        start_time=start if state is not SchedulerState.QUEUED else None,
        elapsed_s=used if used is not None else seconds_between(start, now),
        reason=str(job.get("comment", "")),
        exit_code=exit_status,
        name=str(job.get("Job_Name", "")),
    )


def parse_qstat_record(
    result: CommandResult, scheduler_id: str, *, now: datetime, tz: tzinfo | None
) -> BatchRecord:
    """``qstat -x -f -F json <id>`` read as the job's accounting record."""
    jobs = qstat_jobs(result)
    # qstat names the job by its full id even when asked with a short one.
    job_id = scheduler_id if scheduler_id in jobs else next(iter(jobs), None)
    if job_id is None:
        raise UnknownBatchJob(f"pbs: no record of job {scheduler_id}: {result.stderr.strip()}")
    job = jobs[job_id]
    try:
        record = BatchRecord.from_status(_status(job_id, job, now, tz))
        ended = job.get("obittime") or job.get("mtime")
        end = parse_local(ended, PBS_TIME_FORMAT, tz) if ended and record.final else None
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise UnparseableOutput(f"pbs: cannot read the record of job {job_id}: {exc}") from exc
    return replace(record, end_time=end)


def parse_qdel(result: CommandResult) -> bool:
    if result.returncode == 0:
        return True
    if result.stderr.strip() and _only_unknown_ids(result.stderr):
        return False
    raise SchedulerCommandFailed(
        failure_message(result), argv=result.argv, returncode=result.returncode
    )


def parse_pbsnodes(
    result: CommandResult, *, queue_attribute: str, default_queue: str
) -> list[BackfillWindow]:
    """``pbsnodes -a -F json``: nodes that are free, run no job and are in no reservation.

    A node's queues are read from ``queue_attribute`` (``queue``, or a dotted path such as
    ``resources_available.Qlist``; comma-separated); nodes without it count for
    ``default_queue``.
    """
    require_success(result)
    nodes = load_pbs_json(result).get("nodes", {})
    if not isinstance(nodes, dict):
        raise UnparseableOutput(f"pbs: pbsnodes' nodes is not an object: {nodes!r:.200}")
    free: list[tuple[str, int | None]] = []
    for name, node in nodes.items():
        try:
            if node["state"] != "free" or node.get("jobs") or node.get("resv"):
                continue
            queues = _dotted(node, queue_attribute)
        except (KeyError, TypeError, AttributeError) as exc:
            skip("pbs", "pbsnodes node", name, exc)
            continue
        for queue in str(queues).split(",") if queues else [default_queue]:
            free.append((queue.strip(), None))
    return windows_from_free_nodes(free)


def _dotted(node: dict[str, Any], path: str) -> Any:
    value: Any = node
    for key in path.split("."):
        if not isinstance(value, dict) or key not in value:
            return None
        value = value[key]
    return value


class PbsScheduler(CommandScheduler):
    """PBS Professional / OpenPBS through its commands (see the module doc)."""

    name = "pbs"
    capabilities = Capabilities(backfill=True, accounting=True)

    def __init__(
        self,
        *,
        queue_attribute: str = "queue",
        default_queue: str = "",
        **common: Unpack[CommandOptions],
    ) -> None:
        super().__init__(**common)
        self.queue_attribute = queue_attribute
        self.default_queue = default_queue

    def render_script_header(self, request: BatchRequest) -> str:
        return render_pbs_header(request)

    def submit_request(self, script_path: Path, request: BatchRequest) -> str:
        argv = render_qsub_argv(script_path, request)
        return parse_qsub(self.run(argv, env=request.env, cwd=script_path.parent))

    def list_jobs(self, ids: tuple[str, ...] | None) -> dict[str, BatchStatus]:
        if ids == ():
            return {}
        result = self.run(render_qstat_argv(ids))
        # `qstat -f` has no user filter; the listing of everyone's jobs is filtered here.
        owner = self.user if ids is None else None
        return parse_qstat(result, owner=owner, now=self.now(), tz=self.tz)

    def delete_job(self, scheduler_id: str) -> bool:
        return parse_qdel(self.run(["qdel", scheduler_id]))

    def backfill_windows(self) -> list[BackfillWindow]:
        result = self.run(["pbsnodes", "-a", "-F", "json"])
        return parse_pbsnodes(
            result, queue_attribute=self.queue_attribute, default_queue=self.default_queue
        )

    def read_accounting(self, scheduler_id: str) -> BatchRecord:
        result = self.run(["qstat", "-x", "-f", "-F", "json", scheduler_id])
        return parse_qstat_record(result, scheduler_id, now=self.now(), tz=self.tz)
