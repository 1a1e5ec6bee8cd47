"""The Flux adapter: ``flux batch``, ``flux jobs --format``, ``flux cancel``.

Flux prints job ids in F58 (``ƒ2ZbpDUyy``, or ``f2ZbpDUyy`` without a UTF-8 locale); every
flux command also takes the decimal id, which is what this adapter hands out, so an id never
depends on the locale it was printed in. Flux keeps inactive jobs listable (``flux jobs -a``),
which is where ``accounting`` reads them. It has no notion of backfill windows to ask.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from types import MappingProxyType
from typing import Final

from lodestream.platform_adapters.compute.hostlist import expand_hostlist
from lodestream.platform_adapters.errors import (
    SchedulerCommandFailed,
    SubmitRejected,
    UnknownBatchJob,
    UnparseableOutput,
)
from lodestream.platform_adapters.schedulers.base import (
    BatchRecord,
    BatchRequest,
    BatchStatus,
    Capabilities,
)
from lodestream.platform_adapters.schedulers.command import CommandScheduler
from lodestream.platform_adapters.schedulers.directives import (
    Flag,
    Syntax,
    argv_words,
    attached,
    directive_block,
)
from lodestream.platform_adapters.schedulers.parsing import map_state, skip
from lodestream.platform_adapters.schedulers.runner import CommandResult, failure_message
from lodestream.platform_adapters.schedulers.timeparse import from_epoch
from lodestream.schemas.resources import SchedulerState

Q, R = SchedulerState.QUEUED, SchedulerState.RUNNING
FLUX: Final = Syntax("flux", "#flux:")

# ``{status}``: older flux-core prints PENDING/RUNNING, newer the job state while active.
FLUX_STATES: Final[Mapping[str, SchedulerState]] = MappingProxyType({
    "NEW": Q,
    "DEPEND": Q,
    "PRIORITY": Q,
    "SCHED": Q,
    "PENDING": Q,
    "RUN": R,
    "RUNNING": R,
    "CLEANUP": R,  # the job shells have exited; the allocation is being released
    "COMPLETED": SchedulerState.FINISHED,
    "FAILED": SchedulerState.FAILED,
    "CANCELED": SchedulerState.CANCELLED,
    "TIMEOUT": SchedulerState.WALLTIME_EXPIRED,
})  # fmt: skip

# The two free-text fields last, the job's name before the note: a line is cut at its first
# ten '|'s and the name ends at the next, so a '|' in a note cannot shift a column (one in a
# name would end the name early; a lode job's name never has one). The name is how a
# submission whose id was lost is found again (``BatchStatus.name``).
JOBS_FIELDS: Final = (
    "{id}", "{status}", "{nnodes}", "{nodelist}", "{queue}", "{duration}", "{t_run}",
    "{t_cleanup}", "{runtime}", "{returncode}", "{name}", "{exception.note}",
)  # fmt: skip
F58_ALPHABET: Final = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"
_GONE: Final = (" unknown", "unknown job", "job is inactive")  # "JobID 42 unknown"


def f58_to_decimal(text: str) -> str:
    """``ƒ2ZbpDUyy`` (or ``f2ZbpDUyy``) as its decimal id; a decimal id stays as it is."""
    text = text.strip()
    if text.isdigit():
        return text
    if text[:1] not in ("ƒ", "f") or len(text) < 2:
        raise ValueError(f"not a Flux job id: {text!r}")
    value = 0
    for char in text[1:]:
        digit = F58_ALPHABET.find(char)
        if digit < 0:
            raise ValueError(f"not a Flux job id: {text!r}")
        value = value * 58 + digit
    return str(value)


def _flags(request: BatchRequest) -> list[Flag]:
    flags = [
        attached("nodes", "--nodes", str(request.nodes)),
        attached("wall_time_min", "--time-limit", f"{request.wall_time_min}m"),
    ]
    if request.queue:
        flags.append(attached("queue", "--queue", request.queue))
    if request.project:
        flags.append(attached("project", "--bank", request.project))
    if request.job_name:
        flags.append(attached("job_name", "--job-name", request.job_name))
    return flags + [attached(f"option {k}", f"--{k}", v) for k, v in request.options.items()]


def render_batch_argv(script_path: Path, request: BatchRequest) -> list[str]:
    """``flux batch``; it copies its environment to the job, ``request.env`` included."""
    stem = script_path.parent / script_path.stem
    return [
        "flux",
        "batch",
        *argv_words(_flags(request), FLUX),
        f"--output={stem}.{{{{id}}}}.out",
        f"--error={stem}.{{{{id}}}}.err",
        *request.extra_args,
        str(script_path),
    ]


def render_flux_header(request: BatchRequest) -> str:
    return directive_block(_flags(request), FLUX)


def render_jobs_argv(ids: tuple[str, ...] | None, user: str, *, all_states: bool) -> list[str]:
    words = ["flux", "jobs", "--no-header", f"--format={'|'.join(JOBS_FIELDS)}"]
    if all_states:
        words.append("-a")
    return [*words, f"--user={user}"] if ids is None else [*words, *ids]


def parse_batch(result: CommandResult) -> str:
    if result.returncode != 0:
        raise SubmitRejected(
            failure_message(result), argv=result.argv, returncode=result.returncode
        )
    lines = [line for line in result.stdout.splitlines() if line.strip()]
    try:
        return f58_to_decimal(lines[-1])
    except (IndexError, ValueError) as exc:
        raise UnparseableOutput(
            f"flux: no job id in flux batch's output {result.stdout[:200]!r}"
        ) from exc


def _only_unknown_ids(stderr: str) -> bool:
    lines = [line for line in stderr.splitlines() if line.strip()]
    return bool(lines) and all(any(sign in line for sign in _GONE) for line in lines)


def _jobs(result: CommandResult) -> list[tuple[list[str], BatchStatus]]:
    if result.returncode != 0 and not _only_unknown_ids(result.stderr):
        raise SchedulerCommandFailed(
            failure_message(result), argv=result.argv, returncode=result.returncode
        )
    jobs = []
    for line in result.stdout.splitlines():
        if not line.strip():
            continue
        fields = line.split("|", len(JOBS_FIELDS) - 1)
        if len(fields) != len(JOBS_FIELDS):
            skip("flux", "flux jobs line", line, f"{len(fields)} fields, not {len(JOBS_FIELDS)}")
            continue
        try:
            jobs.append((fields, _status(fields)))
        except ValueError as exc:
            skip("flux", "flux jobs line", line, exc)
    return jobs


def parse_jobs(result: CommandResult) -> dict[str, BatchStatus]:
    """``flux jobs --no-header --format=<JOBS_FIELDS joined by |>`` by decimal job id."""
    return {status.scheduler_id: status for _, status in _jobs(result)}


def _status(fields: list[str]) -> BatchStatus:
    job_id, native, nnodes, nodelist, queue, duration, t_run, _end, runtime, rc, name, note = fields
    state = map_state(FLUX_STATES, native, "flux")
    limit_s = float(duration) if duration else 0.0
    start = from_epoch(float(t_run) if t_run else None)
    return BatchStatus(
        scheduler_id=f58_to_decimal(job_id),
        state=state,
        native_state=native,
        nodes=int(nnodes) if nnodes else 0,
        hostnames=tuple(expand_hostlist(nodelist)),
        queue=queue,
        wall_time_min=int(limit_s // 60) if limit_s else None,  # 0 is unlimited
        start_time=start,
        elapsed_s=int(float(runtime)) if runtime and start is not None else None,
        reason=note,
        exit_code=int(rc) if rc else None,
        name=name,
    )


def parse_jobs_record(result: CommandResult, scheduler_id: str) -> BatchRecord:
    """``flux jobs -a ... <id>`` read as the job's record; it ended when cleanup began."""
    for fields, status in _jobs(result):
        if status.scheduler_id == scheduler_id:
            end = from_epoch(float(fields[7] or 0)) if status.final else None
            return replace(BatchRecord.from_status(status), end_time=end)
    raise UnknownBatchJob(f"flux: no record of job {scheduler_id}")


def parse_cancel(result: CommandResult) -> bool:
    if result.returncode == 0:
        return True
    if _only_unknown_ids(result.stderr):
        return False
    raise SchedulerCommandFailed(
        failure_message(result), argv=result.argv, returncode=result.returncode
    )


class FluxScheduler(CommandScheduler):
    """Flux through its commands (see the module doc)."""

    name = "flux"
    capabilities = Capabilities(backfill=False, accounting=True)

    def render_script_header(self, request: BatchRequest) -> str:
        return render_flux_header(request)

    def submit_request(self, script_path: Path, request: BatchRequest) -> str:
        argv = render_batch_argv(script_path, request)
        return parse_batch(self.run(argv, env=request.env, cwd=script_path.parent))

    def list_jobs(self, ids: tuple[str, ...] | None) -> dict[str, BatchStatus]:
        if ids == ():
            return {}
        result = self.run(render_jobs_argv(ids, self.user, all_states=ids is not None))
        return parse_jobs(result)

    def delete_job(self, scheduler_id: str) -> bool:
        return parse_cancel(self.run(["flux", "cancel", scheduler_id]))

    def read_accounting(self, scheduler_id: str) -> BatchRecord:
        result = self.run(render_jobs_argv((scheduler_id,), self.user, all_states=True))
        return parse_jobs_record(result, scheduler_id)
