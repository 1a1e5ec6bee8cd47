"""What a pilot says of its batch job's end, for the site agent that records it.

A pilot that drains at its wall time exits 0 ahead of the scheduler's kill, so the scheduler
records the batch job as completed, while the jobs it drained name the batch job
``walltime_expired`` in their cause chain. The pilot leaves its verdict in a file beside the
batch job's script and output (``<script_dir>/pilot-<batch id>.end``); the site agent reads
it when the batch job ends and records the end as the pilot saw it
(:func:`lodestream.agents.site.scheduler.decide.on_status`), with the scheduler's own words
kept in the reason. The file lives and goes with the site directory's ``batch/`` folder.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Final

from lodestream.schemas.resources import SchedulerState

SUFFIX: Final = ".end"
# The verdicts a pilot may leave: only what the scheduler's own record can understate.
VERDICTS: Final = frozenset({SchedulerState.WALLTIME_EXPIRED})


def pilot_end_path(script_dir: Path, batch_id: uuid.UUID) -> Path:
    return script_dir / f"pilot-{batch_id}{SUFFIX}"


def write_pilot_end(path: Path, verdict: SchedulerState) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"{verdict.value}\n")


def read_pilot_end(path: Path) -> SchedulerState | None:
    """The pilot's verdict, or None when it left none (or something this does not know)."""
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    known = {v.value: v for v in VERDICTS}
    return known.get(text)
