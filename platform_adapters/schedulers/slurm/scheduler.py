"""The Slurm adapter: sbatch, squeue, scancel, sinfo, and sacct or a jobcomp/filetxt log."""

from __future__ import annotations

from pathlib import Path
from typing import Final, Literal, Unpack

from lodestream.platform_adapters.errors import SchedulerUnavailable, UnknownBatchJob
from lodestream.platform_adapters.schedulers.base import (
    BackfillWindow,
    BatchRecord,
    BatchRequest,
    BatchStatus,
    Capabilities,
)
from lodestream.platform_adapters.schedulers.command import CommandOptions, CommandScheduler
from lodestream.platform_adapters.schedulers.parsing import logger
from lodestream.platform_adapters.schedulers.runner import CommandResult
from lodestream.platform_adapters.schedulers.slurm.accounting import (
    find_jobcomp_record,
    parse_sacct,
)
from lodestream.platform_adapters.schedulers.slurm.backfill import (
    parse_sinfo_idle,
    parse_sinfo_reservations,
    slurm_windows,
)
from lodestream.platform_adapters.schedulers.slurm.parse import (
    parse_sbatch,
    parse_scancel,
    parse_squeue_json,
    parse_squeue_text,
)
from lodestream.platform_adapters.schedulers.slurm.render import (
    render_sacct_argv,
    render_sbatch_argv,
    render_sbatch_header,
    render_scancel_argv,
    render_sinfo_idle_argv,
    render_sinfo_reservations_argv,
    render_squeue_json_argv,
    render_squeue_text_argv,
)

# How a squeue without JSON support says so: too old for --json, or built without its plugins.
_NO_JSON: Final = ("unrecognized option", "invalid option", "data_parser", "serializer", "JSON")


def json_unsupported(result: CommandResult) -> bool:
    return result.returncode != 0 and any(sign in result.stderr for sign in _NO_JSON)


class SlurmScheduler(CommandScheduler):
    """Slurm through its commands.

    ``status_format="json"`` reads ``squeue --json`` and falls back to ``--format`` text for the
    rest of the adapter's life the first time squeue says it cannot print JSON. ``jobcomp_path``
    (the controller's ``JobCompLoc``, readable from here) makes ``accounting`` read that log
    instead of ``sacct``, for a Slurm without slurmdbd.
    """

    name = "slurm"
    capabilities = Capabilities(backfill=True, accounting=True)

    def __init__(
        self,
        *,
        status_format: Literal["json", "text"] = "json",
        jobcomp_path: Path | None = None,
        **common: Unpack[CommandOptions],
    ) -> None:
        super().__init__(**common)
        self.status_format = status_format
        self.jobcomp_path = jobcomp_path

    def render_script_header(self, request: BatchRequest) -> str:
        return render_sbatch_header(request)

    def submit_request(self, script_path: Path, request: BatchRequest) -> str:
        argv = render_sbatch_argv(script_path, request)
        return parse_sbatch(self.run(argv, env=request.env, cwd=script_path.parent))

    def list_jobs(self, ids: tuple[str, ...] | None) -> dict[str, BatchStatus]:
        if ids == ():
            return {}
        if self.status_format == "json":
            result = self.run(render_squeue_json_argv(ids, self.user))
            if not json_unsupported(result):
                return parse_squeue_json(result, now=self.now())
            logger.warning(
                "slurm: squeue cannot print JSON (%s); using --format text from now on",
                result.stderr.strip()[:200],
            )
            self.status_format = "text"
        return parse_squeue_text(self.run(render_squeue_text_argv(ids, self.user)), tz=self.tz)

    def delete_job(self, scheduler_id: str) -> bool:
        return parse_scancel(self.run(render_scancel_argv(scheduler_id)))

    def backfill_windows(self) -> list[BackfillWindow]:
        idle = parse_sinfo_idle(self.run(render_sinfo_idle_argv()))
        if not idle:
            return []
        reservations = parse_sinfo_reservations(
            self.run(render_sinfo_reservations_argv()), tz=self.tz
        )
        return slurm_windows(idle, reservations, now=self.now())

    def read_accounting(self, scheduler_id: str) -> BatchRecord:
        if self.jobcomp_path is None:
            return parse_sacct(self.run(render_sacct_argv(scheduler_id)), scheduler_id, tz=self.tz)
        try:
            with self.jobcomp_path.open(encoding="utf-8", errors="replace") as log:
                record = find_jobcomp_record(log, scheduler_id, tz=self.tz)
        except OSError as exc:
            raise SchedulerUnavailable(
                f"slurm: cannot read jobcomp log {self.jobcomp_path}: {exc}"
            ) from exc
        if record is not None:
            return record
        # The log has a line only once a job ends; a live job is still in squeue.
        live = self.status([scheduler_id]).get(scheduler_id)
        if live is None:
            raise UnknownBatchJob(f"slurm: no record of job {scheduler_id} in {self.jobcomp_path}")
        return BatchRecord.from_status(live)
