"""Slurm command lines and ``#SBATCH`` directives, as pure functions of a request."""

from __future__ import annotations

from pathlib import Path
from typing import Final

from lodestream.platform_adapters.schedulers.base import BatchRequest
from lodestream.platform_adapters.schedulers.directives import (
    Flag,
    Syntax,
    argv_words,
    attached,
    directive_block,
)

# sbatch starts another component of a heterogeneous job at `hetjob` (`packjob` before 20.02)
# anywhere on an #SBATCH line.
SBATCH: Final = Syntax("slurm", "#SBATCH", forbidden_words=("hetjob", "packjob"))

# squeue --format for the text fallback: reason last, so a stray '|' in it cannot shift columns.
SQUEUE_FIELDS: Final = ("%i", "%T", "%D", "%P", "%l", "%M", "%S", "%N", "%r")
SINFO_NODE_FIELDS: Final = ("%N", "%R", "%a", "%t", "%l")
SACCT_FIELDS: Final = ("JobIDRaw", "State", "ExitCode", "Start", "End", "NNodes", "NodeList")


def _resource_flags(request: BatchRequest) -> list[Flag]:
    flags = [
        attached("nodes", "--nodes", str(request.nodes)),
        attached("wall_time_min", "--time", str(request.wall_time_min)),
    ]
    if request.project:
        flags.append(attached("project", "--account", request.project))
    if request.queue:
        flags.append(attached("queue", "--partition", request.queue))
    if request.job_name:
        flags.append(attached("job_name", "--job-name", request.job_name))
    return flags + [attached(f"option {k}", f"--{k}", v) for k, v in request.options.items()]


def render_sbatch_argv(script_path: Path, request: BatchRequest) -> list[str]:
    """``sbatch --parsable ...``; output files go beside the script, ``<stem>.<jobid>.out``.

    The environment is exported by sbatch's default (``--export=ALL``) from the environment the
    command runs in, which carries ``request.env``: no value is ever squeezed into a flag.
    """
    # sbatch expands %j, %u, ... in these names; %% is a literal percent sign.
    stem = str(script_path.parent / script_path.stem).replace("%", "%%")
    return [
        "sbatch",
        "--parsable",
        *argv_words(_resource_flags(request), SBATCH),
        f"--output={stem}.%j.out",
        f"--error={stem}.%j.err",
        *request.extra_args,
        str(script_path),
    ]


def render_sbatch_header(request: BatchRequest) -> str:
    return directive_block(_resource_flags(request), SBATCH)


def render_squeue_json_argv(ids: tuple[str, ...] | None, user: str) -> list[str]:
    return ["squeue", "--json", *_job_filter(ids, user)]


def render_squeue_text_argv(ids: tuple[str, ...] | None, user: str) -> list[str]:
    return ["squeue", "--noheader", f"--format={'|'.join(SQUEUE_FIELDS)}", *_job_filter(ids, user)]


def _job_filter(ids: tuple[str, ...] | None, user: str) -> list[str]:
    return [f"--user={user}"] if ids is None else [f"--jobs={','.join(ids)}"]


def render_scancel_argv(scheduler_id: str) -> list[str]:
    return ["scancel", scheduler_id]


def render_sinfo_idle_argv() -> list[str]:
    """One line per idle, responding node and partition."""
    return [
        "sinfo",
        "--Node",
        "--noheader",
        "--responding",
        "--states=idle",
        f"--format={'|'.join(SINFO_NODE_FIELDS)}",
    ]


def render_sinfo_reservations_argv() -> list[str]:
    return ["sinfo", "--reservation", "--noheader"]


def render_sacct_argv(scheduler_id: str) -> list[str]:
    """The allocation's line only (``--allocations``): steps have their own states."""
    return [
        "sacct",
        "--noheader",
        "--parsable2",
        "--allocations",
        f"--jobs={scheduler_id}",
        f"--format={','.join(SACCT_FIELDS)}",
    ]
