"""The IBM Spectrum LSF adapter: bsub, ``bjobs -json -o``, bkill, bslots.

Nodes are asked for with ``-nnodes`` (LSF with CSM, as on Summit-class machines); give
``slots_per_node`` to ask for ``-n <slots> -R span[ptile=<slots_per_node>]`` instead, which
also turns bslots' slot counts into nodes. bslots lists its windows cumulatively already
("3 slots for 1 hour 30 minutes, 5 for 1 hour") and does not know queues, so its windows are
given to ``backfill_queue``.

bjobs prints times as ``Dec 28 19:56`` in local time, with the year only where
``LSB_DISPLAY_YEAR`` is set: a time without one is taken in the latest year that does not put
it in the future. ``bjobs -a`` forgets jobs after ``CLEAN_PERIOD`` (an hour by default).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import replace
from datetime import datetime, timedelta, tzinfo
from pathlib import Path
from types import MappingProxyType
from typing import Any, Final, Unpack

from lodestream.platform_adapters.errors import (
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
from lodestream.platform_adapters.schedulers.parsing import (
    expect_object,
    load_json,
    map_state,
    skip,
)
from lodestream.platform_adapters.schedulers.runner import (
    CommandResult,
    failure_message,
    require_success,
)
from lodestream.platform_adapters.schedulers.timeparse import localize
from lodestream.schemas.resources import SchedulerState

Q, R = SchedulerState.QUEUED, SchedulerState.RUNNING
# bsub reads `-R span[ptile=N]`, which the adapter writes itself; a request's values never
# hold brackets (BatchRequest refuses them).
BSUB: Final = Syntax("lsf", "#BSUB", extra_chars="[]")

LSF_STATES: Final[Mapping[str, SchedulerState]] = MappingProxyType({
    "PEND": Q,
    "PSUSP": Q,  # suspended (held) while pending
    "WAIT": Q,  # a chunk job's member waiting its turn
    "PROV": R,  # dispatched; its host is being powered up
    "RUN": R,
    "USUSP": R,  # suspended by its owner after it started
    "SSUSP": R,  # suspended by LSF (load, run windows) after it started
    "DONE": SchedulerState.FINISHED,
    "EXIT": SchedulerState.FAILED,  # refined by LSF_EXIT_REASONS
    "ZOMBI": SchedulerState.CANCELLED,  # killed while its host was unreachable
    "UNKWN": SchedulerState.UNKNOWN,  # LSF lost contact with the job's host
})  # fmt: skip

# EXIT with one of these reasons is not a failure of the job's own.
LSF_EXIT_REASONS: Final[Mapping[str, SchedulerState]] = MappingProxyType({
    "TERM_RUNLIMIT": SchedulerState.WALLTIME_EXPIRED,
    "TERM_OWNER": SchedulerState.CANCELLED,
    "TERM_ADMIN": SchedulerState.CANCELLED,
    "TERM_FORCE_OWNER": SchedulerState.CANCELLED,
    "TERM_FORCE_ADMIN": SchedulerState.CANCELLED,
})  # fmt: skip

# job_name is how a submission whose id was lost is found again (``BatchStatus.name``); -json
# prints each field in full, where the table would cut a long name to its column.
BJOBS_FIELDS: Final = (
    "jobid", "stat", "user", "queue", "job_name", "nexec_host", "exec_host", "start_time",
    "finish_time", "run_time", "runtimelimit", "exit_code", "exit_reason", "pend_reason",
)  # fmt: skip
_NOT_FOUND: Final = (
    "is not found",
    "No matching job found",
    "No unfinished job found",
    "No job found",
)
_GONE: Final = (*_NOT_FOUND, "already finished")
_SUBMITTED: Final = re.compile(r"Job <(\d+)> is submitted")
_SLOT_LINE: Final = re.compile(r"\s*(\d+)\s+(.+?)\s*")
_DURATION_PART: Final = re.compile(r"(\d+)\s+(day|hour|minute|second)s?")
_UNIT_S: Final = {"day": 86400, "hour": 3600, "minute": 60, "second": 1}


def lsf_state(stat: str, exit_reason: str) -> SchedulerState:
    state = map_state(LSF_STATES, stat, "lsf")
    if state is SchedulerState.FAILED:
        return LSF_EXIT_REASONS.get(exit_reason.partition(":")[0].strip(), state)
    return state


def _flags(request: BatchRequest, slots_per_node: int | None) -> list[Flag]:
    """Each flag with its value, in order: directives and argv are made from the same list."""
    flags = []
    if request.project:
        flags.append(separate("project", "-P", request.project))
    if request.queue:
        flags.append(separate("queue", "-q", request.queue))
    if slots_per_node is None:
        flags.append(separate("nodes", "-nnodes", str(request.nodes)))
    else:
        flags.append(separate("nodes", "-n", str(request.nodes * slots_per_node)))
        flags.append(separate("slots_per_node", "-R", f"span[ptile={slots_per_node}]"))
    flags.append(separate("wall_time_min", "-W", str(request.wall_time_min)))
    if request.job_name:
        flags.append(separate("job_name", "-J", request.job_name))
    return flags + [separate(f"option {k}", f"-{k}", v) for k, v in request.options.items()]


def render_bsub_argv(
    script_path: Path, request: BatchRequest, *, slots_per_node: int | None = None
) -> list[str]:
    """``bsub ... script``; bsub copies its environment, which carries ``request.env``."""
    stem = script_path.parent / script_path.stem
    words = ["bsub", *argv_words(_flags(request, slots_per_node), BSUB)]
    words += ["-o", f"{stem}.%J.out", "-e", f"{stem}.%J.err"]
    return [*words, *request.extra_args, str(script_path)]


def render_bsub_header(request: BatchRequest, *, slots_per_node: int | None = None) -> str:
    return directive_block(_flags(request, slots_per_node), BSUB)


def render_bjobs_argv(ids: tuple[str, ...] | None, user: str, *, all_states: bool) -> list[str]:
    words = ["bjobs", "-json", "-o", " ".join(BJOBS_FIELDS)]
    if all_states:
        words.append("-a")
    return [*words, "-u", user] if ids is None else [*words, *ids]


def parse_bsub(result: CommandResult) -> str:
    """``Job <123> is submitted to queue <batch>.``"""
    match = _SUBMITTED.search(result.stdout)
    if result.returncode != 0 or match is None:
        if result.returncode == 0:
            raise UnparseableOutput(f"lsf: no job id in bsub's output {result.stdout[:200]!r}")
        raise SubmitRejected(
            failure_message(result), argv=result.argv, returncode=result.returncode
        )
    return match.group(1)


def lsf_time(text: str, *, now: datetime, tz: tzinfo | None) -> datetime | None:
    """``Dec 28 19:56`` / ``Dec 28 19:56 2023``, with or without LSF's estimate mark (``L``)."""
    words = text.split()
    if words and len(words[-1]) == 1 and words[-1].isalpha():
        words = words[:-1]
    if len(words) not in (3, 4) or words[0] == "-":
        return None
    if len(words) == 4:
        naive = datetime.strptime(" ".join(words), "%b %d %H:%M %Y")  # noqa: DTZ007
        return localize(naive, tz)
    for year in (now.year, now.year - 1):
        naive = datetime.strptime(f"{' '.join(words)} {year}", "%b %d %H:%M %Y")  # noqa: DTZ007
        when = localize(naive, tz)
        if when <= now + timedelta(days=1):
            return when
    return when


def _records(result: CommandResult) -> list[dict[str, Any]]:
    said = result.stderr + result.stdout
    if not result.stdout.strip() and any(sign in said for sign in _NOT_FOUND):
        return []
    if result.returncode != 0 and not result.stdout.strip():
        raise SchedulerCommandFailed(
            failure_message(result), argv=result.argv, returncode=result.returncode
        )
    records = expect_object(load_json(result, "lsf"), "bjobs -json", "lsf").get("RECORDS")
    if not isinstance(records, list):
        raise UnparseableOutput(f"lsf: bjobs -json printed no RECORDS: {result.stdout[:200]!r}")
    return records


def _jobs(
    result: CommandResult, now: datetime, tz: tzinfo | None
) -> list[tuple[dict[str, Any], BatchStatus]]:
    """Each job record with its status; records of unknown ids carry an ERROR and are left out."""
    jobs = []
    for record in _records(result):
        if not isinstance(record, dict) or "ERROR" in record:
            if not isinstance(record, dict) or not any(s in str(record["ERROR"]) for s in _GONE):
                skip("lsf", "bjobs record", record, "not a job")
            continue
        try:
            jobs.append((record, _status(record, now, tz)))
        except (KeyError, TypeError, ValueError) as exc:
            skip("lsf", "bjobs record", record, exc)
    return jobs


def parse_bjobs(
    result: CommandResult, *, now: datetime, tz: tzinfo | None
) -> dict[str, BatchStatus]:
    """``bjobs -json -o "<BJOBS_FIELDS>" [-a]`` by job id."""
    return {status.scheduler_id: status for _, status in _jobs(result, now, tz)}


def _status(record: dict[str, Any], now: datetime, tz: tzinfo | None) -> BatchStatus:
    state = lsf_state(record["STAT"], str(record.get("EXIT_REASON", "")))
    run_time = str(record.get("RUN_TIME", "")).split()
    limit = str(record.get("RUNTIMELIMIT", "")).strip()
    hosts = [h.split("*")[-1] for h in str(record.get("EXEC_HOST", "")).split(":") if h.strip()]
    nexec = str(record.get("NEXEC_HOST", "")).strip()
    return BatchStatus(
        scheduler_id=str(record["JOBID"]),
        state=state,
        native_state=str(record["STAT"]),
        nodes=int(nexec) if nexec.isdigit() else len(set(hosts)),
        hostnames=tuple(dict.fromkeys(hosts)),
        queue=str(record.get("QUEUE", "")),
        wall_time_min=int(float(limit)) if re.fullmatch(r"\d+(\.\d*)?", limit) else None,
        start_time=lsf_time(str(record.get("START_TIME", "")), now=now, tz=tz),
        elapsed_s=int(run_time[0])
        if run_time[:1] and run_time[0].isdigit() and state is not Q
        else None,
        reason=str(record.get("PEND_REASON") or record.get("EXIT_REASON") or "").strip(),
        exit_code=_exit_code(state, str(record.get("EXIT_CODE", "")).strip()),
        name=str(record.get("JOB_NAME") or ""),
    )


def _exit_code(state: SchedulerState, text: str) -> int | None:
    if text.isdigit():
        return int(text)
    # LSF leaves EXIT_CODE empty for DONE, which means status 0.
    return 0 if state is SchedulerState.FINISHED else None


def parse_bjobs_record(
    result: CommandResult, scheduler_id: str, *, now: datetime, tz: tzinfo | None
) -> BatchRecord:
    """``bjobs -a -json -o ... <id>`` read as the job's accounting record."""
    for record, status in _jobs(result, now, tz):
        if status.scheduler_id != scheduler_id:
            continue
        finish = str(record.get("FINISH_TIME", ""))
        end = lsf_time(finish, now=now, tz=tz) if status.final else None
        return replace(BatchRecord.from_status(status), end_time=end)
    raise UnknownBatchJob(f"lsf: bjobs -a has no record of job {scheduler_id}")


def parse_bkill(result: CommandResult) -> bool:
    said = result.stderr + result.stdout
    if any(sign in said for sign in _GONE):
        return False
    if result.returncode != 0:
        raise SchedulerCommandFailed(
            failure_message(result), argv=result.argv, returncode=result.returncode
        )
    return True


def lsf_duration_s(text: str) -> int | None:
    """bslots' ``1 hour 28 minutes 29 seconds`` (or ``UNLIMITED``: None)."""
    if text.strip().upper() == "UNLIMITED":
        return None
    parts = _DURATION_PART.findall(text)
    if not parts or _DURATION_PART.sub("", text).strip():
        raise ValueError(f"malformed duration {text!r}")
    return sum(int(n) * _UNIT_S[unit] for n, unit in parts)


def parse_bslots(result: CommandResult, *, queue: str, slots_per_node: int) -> list[BackfillWindow]:
    require_success(result)
    windows: list[BackfillWindow] = []
    for line in result.stdout.splitlines():
        if not line.strip() or line.split()[0] == "SLOTS":
            continue
        match = _SLOT_LINE.fullmatch(line)
        if match is None:
            skip("lsf", "bslots line", line, "not '<slots> <runtime>'")
            continue
        try:
            seconds = lsf_duration_s(match.group(2))
        except ValueError as exc:
            skip("lsf", "bslots line", line, exc)
            continue
        nodes = int(match.group(1)) // slots_per_node
        minutes = None if seconds is None else seconds // 60
        if nodes and (minutes is None or minutes >= 1):
            windows.append(BackfillWindow(queue=queue, nodes=nodes, minutes=minutes))
    return windows


class LsfScheduler(CommandScheduler):
    """LSF through its commands (see the module doc)."""

    name = "lsf"
    capabilities = Capabilities(backfill=True, accounting=True)

    def __init__(
        self,
        *,
        slots_per_node: int | None = None,
        backfill_queue: str = "batch",
        **common: Unpack[CommandOptions],
    ) -> None:
        super().__init__(**common)
        self.slots_per_node = slots_per_node
        self.backfill_queue = backfill_queue

    def render_script_header(self, request: BatchRequest) -> str:
        return render_bsub_header(request, slots_per_node=self.slots_per_node)

    def submit_request(self, script_path: Path, request: BatchRequest) -> str:
        argv = render_bsub_argv(script_path, request, slots_per_node=self.slots_per_node)
        return parse_bsub(self.run(argv, env=request.env, cwd=script_path.parent))

    def list_jobs(self, ids: tuple[str, ...] | None) -> dict[str, BatchStatus]:
        if ids == ():
            return {}
        result = self.run(render_bjobs_argv(ids, self.user, all_states=ids is not None))
        return parse_bjobs(result, now=self.now(), tz=self.tz)

    def delete_job(self, scheduler_id: str) -> bool:
        return parse_bkill(self.run(["bkill", scheduler_id]))

    def backfill_windows(self) -> list[BackfillWindow]:
        return parse_bslots(
            self.run(["bslots"]), queue=self.backfill_queue, slots_per_node=self.slots_per_node or 1
        )

    def read_accounting(self, scheduler_id: str) -> BatchRecord:
        result = self.run(render_bjobs_argv((scheduler_id,), self.user, all_states=True))
        return parse_bjobs_record(result, scheduler_id, now=self.now(), tz=self.tz)
