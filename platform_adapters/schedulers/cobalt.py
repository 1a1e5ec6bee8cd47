"""The Cobalt adapter (ALCF's Theta generation): qsub, qstat, qdel, nodelist.

qstat's columns are chosen with the ``QSTAT_HEADER`` environment variable. Cobalt forgets a job
once it ends and keeps no accounting a command can read, so ``accounting`` is not supported: a
job that leaves qstat has ended, how is in its ``.cobaltlog``. ``nodelist`` gives each idle
node's backfill time (how long until a drain needs it); as Balsam did, only nodes with such a
time count as free, and a node in several queues counts in each.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Final

from lodestream.platform_adapters.errors import (
    InvalidSubmission,
    SchedulerCommandFailed,
    SubmitRejected,
    UnparseableOutput,
)
from lodestream.platform_adapters.schedulers.base import (
    BackfillWindow,
    BatchRequest,
    BatchStatus,
    Capabilities,
)
from lodestream.platform_adapters.schedulers.command import CommandScheduler
from lodestream.platform_adapters.schedulers.directives import (
    Flag,
    Syntax,
    argv_words,
    directive_block,
    separate,
)
from lodestream.platform_adapters.schedulers.parsing import map_state, skip
from lodestream.platform_adapters.schedulers.runner import (
    CommandResult,
    failure_message,
    require_success,
)
from lodestream.platform_adapters.schedulers.timeparse import duration_s, minutes_of
from lodestream.platform_adapters.schedulers.windows import windows_from_free_nodes
from lodestream.schemas.resources import SchedulerState

Q, R = SchedulerState.QUEUED, SchedulerState.RUNNING
COBALT: Final = Syntax("cobalt", "#COBALT")

COBALT_STATES: Final[Mapping[str, SchedulerState]] = MappingProxyType({
    "queued": Q,
    "user_hold": Q,
    "admin_hold": Q,
    "dep_hold": Q,  # waiting for a job it depends on
    "maxrun_hold": Q,  # the user's running-job limit is reached
    "starting": R,  # nodes assigned and booting
    "running": R,
    "exiting": R,
    "killing": R,  # being deleted: gone from qstat once it is
    "dep_fail": SchedulerState.FAILED,  # a job it depends on failed; it will never run
})  # fmt: skip

# JobName last: it is the one column whose value may hold spaces, so it takes the rest of the
# line. It is how a submission whose id was lost is found again (``BatchStatus.name``).
QSTAT_HEADER: Final = (
    "JobID", "State", "Nodes", "Queue", "WallTime", "RunTime", "Location", "JobName",
)  # fmt: skip
NO_NAME: Final = "N/A"  # qstat's JobName of a job submitted without --jobname
NODELIST_COLUMNS: Final = ("Name", "Queues", "Status", "Backfill")


def _flags(request: BatchRequest) -> list[Flag]:
    flags = []
    if request.project:
        flags.append(separate("project", "-A", request.project))
    if request.queue:
        flags.append(separate("queue", "-q", request.queue))
    flags += [
        separate("nodes", "-n", str(request.nodes)),
        separate("wall_time_min", "-t", str(request.wall_time_min)),
    ]
    if request.job_name:
        flags.append(separate("job_name", "--jobname", request.job_name))
    return flags + [separate(f"option {k}", f"--{k}", v) for k, v in request.options.items()]


def render_qsub_argv(script_path: Path, request: BatchRequest) -> list[str]:
    """``qsub -n N -t MIN -O <dir/stem> [--env A=1:B=2] script``.

    Cobalt passes no environment but what ``--env`` names, joined by colons, so a value with a
    colon cannot be passed: that is refused rather than split.
    """
    words = ["qsub", *argv_words(_flags(request), COBALT)]
    words += ["-O", str(script_path.parent / script_path.stem)]
    if request.env:
        for name, value in request.env.items():
            if ":" in value:
                raise InvalidSubmission(f"Cobalt's --env cannot pass {name}: its value has a ':'")
        words += ["--env", ":".join(f"{k}={v}" for k, v in request.env.items())]
    return [*words, *request.extra_args, str(script_path)]


def render_cobalt_header(request: BatchRequest) -> str:
    return directive_block(_flags(request), COBALT)


def parse_qsub(result: CommandResult) -> str:
    """qsub prints the job id on a line of its own, after any warnings."""
    if result.returncode != 0:
        raise SubmitRejected(
            failure_message(result), argv=result.argv, returncode=result.returncode
        )
    for line in reversed(result.stdout.splitlines()):
        if line.strip().isdigit():
            return line.strip()
    raise UnparseableOutput(f"cobalt: no job id in qsub's output {result.stdout[:200]!r}")


def _rows(text: str, first_column: str) -> tuple[list[str], list[str]]:
    """The header's column names and the lines below its ``=====`` rule."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.split()[:1] == [first_column]:
            return line.split(), [row for row in lines[i + 1 :] if row.strip("= \t")]
    if any(line.strip() for line in lines):
        raise UnparseableOutput(f"cobalt: no {first_column} header in {text[:200]!r}")
    return [], []  # an empty queue prints nothing at all


def parse_qstat(result: CommandResult) -> dict[str, BatchStatus]:
    """qstat with ``QSTAT_HEADER=<QSTAT_HEADER joined by :>``."""
    require_success(result)
    header, rows = _rows(result.stdout, "JobID")
    found: dict[str, BatchStatus] = {}
    for row in rows:
        fields = _fields(row, header)
        if len(fields) != len(header):
            skip("cobalt", "qstat line", row, f"{len(fields)} fields, not {len(header)}")
            continue
        column = dict(zip(header, fields, strict=True))
        try:
            state = map_state(COBALT_STATES, column["State"], "cobalt")
            status = BatchStatus(
                scheduler_id=column["JobID"],
                state=state,
                native_state=column["State"],
                nodes=int(column["Nodes"]),
                queue=column["Queue"],
                wall_time_min=minutes_of(duration_s(column["WallTime"])),
                elapsed_s=duration_s(column["RunTime"]) if state is R else None,
                reason="" if column["Location"] == "None" else f"location {column['Location']}",
                name="" if column.get("JobName", NO_NAME) == NO_NAME else column["JobName"],
            )
        except (KeyError, ValueError) as exc:
            skip("cobalt", "qstat line", row, exc)
            continue
        found[status.scheduler_id] = status
    return found


def _fields(row: str, header: list[str]) -> list[str]:
    """A row's values; a last ``JobName`` column takes the rest of the line, spaces and all."""
    if header[-1:] != ["JobName"]:
        return row.split()
    fields = row.split(maxsplit=len(header) - 1)
    return [*fields[:-1], fields[-1].strip()] if len(fields) == len(header) else fields


def parse_qdel(result: CommandResult, scheduler_id: str) -> bool:
    """qdel lists the jobs it deleted under a header; an unknown id is simply not listed."""
    if "not found" in result.stderr:
        return False
    if result.returncode != 0:
        raise SchedulerCommandFailed(
            failure_message(result), argv=result.argv, returncode=result.returncode
        )
    return any(line.split()[:1] == [scheduler_id] for line in result.stdout.splitlines())


def parse_nodelist(result: CommandResult) -> list[BackfillWindow]:
    """``nodelist``: idle nodes with a backfill time, per queue (queues joined by ':')."""
    require_success(result)
    header, rows = _rows(result.stdout, "Node_id")
    if header and not set(NODELIST_COLUMNS) <= set(header):
        raise UnparseableOutput(f"cobalt: nodelist lacks columns {NODELIST_COLUMNS}: {header}")
    free: list[tuple[str, int | None]] = []
    for row in rows:
        fields = row.split()
        if len(fields) != len(header):
            skip("cobalt", "nodelist line", row, f"{len(fields)} fields, not {len(header)}")
            continue
        column = dict(zip(header, fields, strict=True))
        if column["Status"] != "idle" or not re.fullmatch(r"\d+:\d\d:\d\d", column["Backfill"]):
            continue
        minutes = minutes_of(duration_s(column["Backfill"]))
        free += [(queue, minutes) for queue in column["Queues"].split(":") if queue]
    return windows_from_free_nodes(free)


class CobaltScheduler(CommandScheduler):
    """Cobalt through its commands (see the module doc)."""

    name = "cobalt"
    capabilities = Capabilities(backfill=True, accounting=False)

    def render_script_header(self, request: BatchRequest) -> str:
        return render_cobalt_header(request)

    def submit_request(self, script_path: Path, request: BatchRequest) -> str:
        argv = render_qsub_argv(script_path, request)
        return parse_qsub(self.run(argv, cwd=script_path.parent))

    def list_jobs(self, ids: tuple[str, ...] | None) -> dict[str, BatchStatus]:
        if ids == ():
            return {}
        result = self.run(["qstat", "-u", self.user], env={"QSTAT_HEADER": ":".join(QSTAT_HEADER)})
        return parse_qstat(result)

    def delete_job(self, scheduler_id: str) -> bool:
        return parse_qdel(self.run(["qdel", scheduler_id]), scheduler_id)

    def backfill_windows(self) -> list[BackfillWindow]:
        return parse_nodelist(self.run(["nodelist"]))
