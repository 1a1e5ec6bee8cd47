"""One what-if question, end to end: events → recording → calibration → simulations.

The same recording is also simulated at its own capacity (``baseline``): how far that is
from what was recorded says how much to trust the prediction.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

from lodestream.client.analytics.simulate.calibrate import Calibration, IOModel, calibrate
from lodestream.client.analytics.simulate.elastic import ScalerReplay, replay_scaler
from lodestream.client.analytics.simulate.engine import Prediction, simulate
from lodestream.client.analytics.simulate.model import Scenario
from lodestream.client.analytics.simulate.recorded import recording
from lodestream.schemas.envelope import Event


@dataclass(frozen=True, slots=True)
class WhatIf:
    calibration: Calibration
    baseline: Prediction  # the recorded capacity, simulated
    predicted: Prediction  # the scenario's
    capacity: dict[str, str]  # site -> "pilots x nodes x slots", recorded → scenario
    scaler: ScalerReplay | None
    unfinished: int

    def to_json(self) -> dict[str, Any]:
        cal = self.calibration
        return {
            "jobs": len(cal.jobs),
            "unfinished_jobs": self.unfinished,
            "capacity_source": cal.capacity_source,
            "retried_runs": cal.retries,
            "jobs_with_parents": cal.dependent,
            "capacity": self.capacity,
            "stage_medians_s": cal.stages,
            "recorded": {"makespan_s": cal.makespan_s, "throughput_per_s": cal.throughput_per_s},
            "baseline": _prediction(self.baseline),
            "predicted": _prediction(self.predicted),
            "scaler": asdict(self.scaler) if self.scaler is not None else None,
        }


def _prediction(p: Prediction) -> dict[str, Any]:
    return {"makespan_s": p.makespan_s, "throughput_per_s": p.throughput_per_s,
            "mean_wait_s": p.mean_wait_s, "jobs_per_site": p.per_site}  # fmt: skip


def what_if(
    events: Iterable[Event],
    scenario: Scenario,
    *,
    since: datetime | None = None,
    until: datetime | None = None,
    apps: Collection[str] = (),
    tags: Mapping[str, str] | None = None,
    io: IOModel | None = None,
    scaler_changes: Mapping[str, Any] | None = None,
) -> WhatIf:
    """Predict ``scenario`` from the run ``events`` recorded."""
    recorded = recording(events, since=since, until=until, apps=apps, tags=tags)
    cal = calibrate(recorded, io)
    capacity = {site: f"{_shape(cal, site, Scenario())} → {_shape(cal, site, scenario)}"
                for site in sorted(cal.pilots)}  # fmt: skip
    scaler = None
    if scaler_changes:
        scaler = replay_scaler(recorded.decisions, scaler_changes)
    return WhatIf(cal, simulate(cal, Scenario()), simulate(cal, scenario), capacity, scaler,
                  recorded.unfinished)  # fmt: skip


def _shape(cal: Calibration, site: str, scenario: Scenario) -> str:
    pilots = scenario.pilots_of(site, cal.pilots[site])
    nodes = max(len(p.slots_per_node) for p in pilots)
    slots = max(max(p.slots_per_node) for p in pilots)
    return f"{len(pilots)} pilot(s) x {nodes} node(s) x {slots} slot(s)"
