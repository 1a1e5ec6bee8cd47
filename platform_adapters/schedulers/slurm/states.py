"""Slurm's job states (``squeue``, ``sacct``, ``jobcomp/filetxt``) mapped to ``SchedulerState``.

Flags that newer Slurm versions list beside the base state (``["RUNNING", "COMPLETING"]``) are
in the table too, so whichever comes first maps; sacct's ``CANCELLED by 1000`` is read by its
first word.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Final

from lodestream.platform_adapters.schedulers.parsing import map_state
from lodestream.schemas.resources import SchedulerState

Q, R = SchedulerState.QUEUED, SchedulerState.RUNNING

SLURM_STATES: Final[Mapping[str, SchedulerState]] = MappingProxyType({
    "PENDING": Q,
    "REQUEUED": Q,  # back in the queue after a node failure or scontrol requeue
    "REQUEUE_HOLD": Q,
    "REQUEUE_FED": Q,
    "RESV_DEL_HOLD": Q,  # held because its reservation was deleted
    "CONFIGURING": R,  # allocated, nodes booting: the pilot starts next
    "RUNNING": R,
    "COMPLETING": R,  # script ended, epilog running; the final state comes next
    "SUSPENDED": R,  # started, and resumes where it was
    "STOPPED": R,  # SIGSTOPped, still holds its nodes
    "RESIZING": R,
    "SIGNALING": R,
    "STAGE_OUT": R,
    "POWER_UP_NODE": R,
    "UPDATE_DB": R,
    "COMPLETED": SchedulerState.FINISHED,
    "FAILED": SchedulerState.FAILED,
    "NODE_FAIL": SchedulerState.FAILED,
    "BOOT_FAIL": SchedulerState.FAILED,
    "OUT_OF_MEMORY": SchedulerState.FAILED,
    "PREEMPTED": SchedulerState.FAILED,  # killed for a higher-priority job, not by its owner
    "DEADLINE": SchedulerState.FAILED,  # could not finish before its --deadline
    "SPECIAL_EXIT": SchedulerState.FAILED,
    "CANCELLED": SchedulerState.CANCELLED,
    "REVOKED": SchedulerState.CANCELLED,  # a federation sibling ran instead
    "TIMEOUT": SchedulerState.WALLTIME_EXPIRED,
})  # fmt: skip


def slurm_state(native: str | list[str] | tuple[str, ...]) -> tuple[SchedulerState, str]:
    """The state and the native text to show for ``job_state`` (a string, or a list of base
    state and flags) or sacct's ``State`` (``CANCELLED by 1000``)."""
    if isinstance(native, str):
        words = native.split()
        base = words[0] if words else ""
        return map_state(SLURM_STATES, base, "slurm"), native
    base = native[0] if native else ""
    return map_state(SLURM_STATES, base, "slurm"), ",".join(native)
