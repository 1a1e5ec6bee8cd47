"""A :class:`~lodestream.client.analytics.summary.Summary` as JSON-ready values (``--json``).

Times are ISO 8601 (UTC) with the POSIX seconds beside them, durations are seconds, rates
per second; a figure the selection cannot give is ``{"unavailable": "<why>"}``.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from lodestream.client.analytics.figures.common import Unavailable
from lodestream.client.analytics.figures.latency import StageTable
from lodestream.client.analytics.figures.little import LittleRow
from lodestream.client.analytics.figures.little_steady import SteadyLittle
from lodestream.client.analytics.figures.pilot import PilotOverhead
from lodestream.client.analytics.stats import Interval, Spread
from lodestream.client.analytics.summary import Summary
from lodestream.client.analytics.window import Bins

Json = dict[str, Any]


def summary_json(summary: Summary) -> Json:
    intake, counts = summary.intake, summary.counts
    return {
        "selection": summary.selection.describe(),
        "window": {
            "start": iso(summary.window.start),
            "end": iso(summary.window.end),
            "start_s": summary.window.start,
            "end_s": summary.window.end,
            "span_s": summary.window.span,
        },
        "read": {
            "messages": intake.read,
            "accepted": intake.accepted,
            "refused_by_shared_rule": intake.refused,
            "illegal_transitions": intake.illegal,
            "unreadable_lines": intake.unreadable,
            "first_seq": intake.first_seq,
            "last_seq": intake.last_seq,
            "folded": counts.folded,
            "not_selected": counts.not_selected,
            "begun_before_range": counts.begun_before,
            "jobs_begun_before_range": len(counts.begun_before_jobs),
            "other_kinds": counts.other,
            "refusals": [
                {"seq": r.seq, "subject": r.subject, "stage": r.stage, "reason": r.reason}
                for r in intake.listed
            ],
        },
        "jobs": summary.jobs,
        "jobs_by_state": summary.jobs_by_state,
        "sessions": summary.sessions,
        "batch_jobs": summary.batch_jobs,
        "throughput": {
            "bins": bins_json(summary.throughput.bins),
            "counts": {state.value: list(row) for state, row in summary.throughput.counts.items()},
        },
        "utilization": _utilization(summary),
        "stages": _stages(summary.stages),
        "pilot_overhead": _pilot(summary.pilot),
        "littles_law": _little(summary.little),
        "failures": [
            {
                "type": g.type,
                "chain": list(g.chain),
                "events": g.events,
                "jobs": g.jobs,
                "jobs_failed": g.jobs_failed,
                "return_codes": list(g.return_codes),
                "example_job": str(g.example_job),
                "example": g.example,
            }
            for g in summary.failures
        ],
        "failures_by_app": [
            {
                "app": g.app,
                "type": g.type,
                "return_code": g.return_code,
                "first_line": g.first_line,
                "events": g.events,
                "jobs": g.jobs,
                "jobs_failed": g.jobs_failed,
                "example_job": str(g.example_job),
            }
            for g in summary.failures_by_app
        ],
        "headline": {
            "jobs": summary.headline.jobs,
            "finished": summary.headline.finished,
            "failed": summary.headline.failed,
            "makespan_s": summary.headline.makespan_s,
            "jobs_per_s": summary.headline.jobs_per_s,
            "utilization": summary.headline.utilization,
        },
        "backlog": {
            "bins": bins_json(summary.backlog.bins),
            "waiting": {site: list(row) for site, row in summary.backlog.waiting.items()},
        },
    }


def iso(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).isoformat()


def bins_json(bins: Bins) -> Json:
    return {"start": iso(bins.start), "start_s": bins.start, "width_s": bins.width,
            "count": bins.count}  # fmt: skip


def spread_json(spread: Spread | None) -> Json | None:
    if spread is None:
        return None
    return {"n": spread.n, "mean_s": spread.mean, "sd_s": spread.sd, "p50_s": spread.p50,
            "p95_s": spread.p95, "min_s": spread.min, "max_s": spread.max}  # fmt: skip


def interval_json(interval: Interval | None) -> Json | None:
    if interval is None:
        return None
    return {"mean": interval.mean, "half_width": interval.half_width, "low": interval.low,
            "high": interval.high, "batches": interval.batches}  # fmt: skip


def _utilization(summary: Summary) -> Json:
    u = summary.utilization
    return {
        "bins": bins_json(u.bins),
        "busy_nodes": list(u.busy),
        "provisioned_nodes": list(u.provisioned),
        "allocated_nodes": list(u.allocated),
        "busy_node_s": u.busy_node_s,
        "provisioned_node_s": u.provisioned_node_s,
        "allocated_node_s": u.allocated_node_s,
        "overall": u.overall,
    }


def _stages(stages: StageTable | Unavailable) -> Json:
    if isinstance(stages, Unavailable):
        return {"unavailable": stages.reason}
    return {
        "finished_jobs": stages.finished_jobs,
        "rows": [
            {
                "stage": r.stage,
                "definition": r.definition,
                "skipped": r.skipped,
                **(spread_json(r.spread) or {"n": 0}),
            }
            for r in stages.rows
        ],
    }


def _pilot(pilot: PilotOverhead | Unavailable) -> Json:
    if isinstance(pilot, Unavailable):
        return {"unavailable": pilot.reason}
    return {
        "runs": pilot.runs,
        "rows": [
            {"step": r.step, "stamped": r.stamped, **(spread_json(r.spread) or {})}
            for r in pilot.rows
        ],
    }


def _little(little: tuple[LittleRow, ...] | Unavailable) -> Json | list[Json]:
    if isinstance(little, Unavailable):
        return {"unavailable": little.reason}
    return [
        {
            "site": r.site,
            "jobs": r.jobs,
            "completed": r.completed,
            "L": r.mean_in_system,
            "lambda_per_s": r.arrival_rate,
            "W_s": r.mean_sojourn,
            "lambda_W": r.lambda_w,
            "relative_difference": r.relative_difference,
            "difference_interval": interval_json(r.difference),
            "relative_interval": interval_json(r.relative_interval),
            "holds": r.holds,
            "identity": r.identity,
            "verdict": r.verdict,
            "steady": _steady(r.steady),
        }
        for r in little
    ]


def _steady(steady: SteadyLittle | Unavailable | None) -> Json | None:
    if steady is None or isinstance(steady, Unavailable):
        return None if steady is None else {"unavailable": steady.reason}
    return {
        "start": steady.start, "end": steady.end, "chosen": steady.chosen,
        "arrivals": steady.arrivals, "departures": steady.departures,
        "balanced": steady.balanced, "L": steady.mean_in_system,
        "lambda_per_s": steady.arrival_rate, "W_s": steady.mean_sojourn,
        "lambda_W": steady.lambda_w, "relative_gap": steady.relative_gap,
    }  # fmt: skip
