"""Which batch job a process runs in, as each scheduler tells the job through its environment."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Final

JOB_ID_VARIABLES: Final[Mapping[str, str]] = MappingProxyType({
    "slurm": "SLURM_JOB_ID",
    "pbs": "PBS_JOBID",
    "lsf": "LSB_JOBID",
    "cobalt": "COBALT_JOBID",
    "flux": "FLUX_JOB_ID",
    "local": "LODE_SCHEDULER_ID",  # set by the local scheduler for the script it runs
})  # fmt: skip


def own_job_id(scheduler: str, environ: Mapping[str, str]) -> str | None:
    """The scheduler's id of the batch job this process runs in; None outside one."""
    variable = JOB_ID_VARIABLES.get(scheduler)
    value = environ.get(variable, "").strip() if variable else ""
    return value or None
