"""Issue 14: the what-if simulator's speed — 100,000 jobs simulated in at most 10 s.

    python -m bench.simulate [--jobs 100000] [--sites 2] [--repeat 3] [--out bench/out]

No stack: a synthetic calibration (Poisson arrivals at about the capacity, log-normal run
times, recorded-looking stage overheads, one job in a hundred on two nodes) on ``--sites``
sites of 4 pilots x 4 nodes x 16 slots, simulated four ways: as calibrated, twice the
slots, routed by ``fastest_eta`` across the sites, and with a shared storage tier (up to
2 GB read per job) at twice its bandwidth.
Reported per scenario: wall time (best of ``--repeat``), events per second, the predicted
makespan.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

from lodestream.client.analytics.simulate.calibrate import Calibration
from lodestream.client.analytics.simulate.engine import simulate
from lodestream.client.analytics.simulate.model import (
    Attempt,
    JobTrace,
    PilotShape,
    Scenario,
    Storage,
)

BANDWIDTH = 10e9  # bytes/s of the synthetic storage tier


def workload(jobs: int, sites: int, seed: int = 14) -> Calibration:
    rng = random.Random(seed)
    names = [f"site{i}" for i in range(sites)]
    at = 0.0
    traces = []
    for i in range(jobs):
        at += rng.expovariate(150.0)  # 150 submissions a second, about the capacity
        traces.append(JobTrace(
            site=names[i % sites], app=f"app{i % 3}", num_nodes=2 if i % 100 == 0 else 1,
            arrival=at, prepare_s=rng.uniform(0.01, 0.05), finish_s=rng.uniform(0.0, 0.02),
            attempts=(Attempt(dispatch_s=rng.uniform(0.0, 0.2),
                              overhead_s=rng.uniform(0.002, 0.02),
                              compute_s=rng.lognormvariate(1.0, 0.5),
                              io_bytes=rng.uniform(0, 2e9)),),
        ))  # fmt: skip
    pilot = PilotShape(0.0, (16,) * 4)
    return Calibration(jobs=tuple(traces), pilots=dict.fromkeys(names, (pilot,) * 4),
                       capacity_source="synthetic", makespan_s=at, storage=None,
                       stages={})  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--sites", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    cal = workload(args.jobs, args.sites)
    stored = Calibration(cal.jobs, cal.pilots, cal.capacity_source, cal.makespan_s,
                         Storage(BANDWIDTH), cal.stages)  # fmt: skip
    scenarios = {
        "as calibrated": (cal, Scenario()),
        "twice the slots": (cal, Scenario(slots=32)),
        "fastest_eta routing": (cal, Scenario(strategy="fastest_eta")),
        "shared storage, 2x bandwidth": (stored, Scenario(bandwidth=2 * BANDWIDTH)),
    }
    results = {}
    for name, (calibration, scenario) in scenarios.items():
        best = float("inf")
        for _ in range(args.repeat):
            started = time.perf_counter()
            prediction = simulate(calibration, scenario)
            best = min(best, time.perf_counter() - started)
        results[name] = {"jobs": args.jobs, "wall_s": round(best, 3),
                         "jobs_per_s": round(args.jobs / best),
                         "makespan_s": round(prediction.makespan_s, 1)}  # fmt: skip
        print(
            f"{name:<30} {best:7.3f} s  {args.jobs / best:>10,.0f} jobs/s  "
            f"makespan {prediction.makespan_s:,.1f} s"
        )
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "simulate.json").write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
