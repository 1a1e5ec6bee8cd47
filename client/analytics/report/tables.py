"""The report's tables, as HTML: every table of ``lode analytics summary``, and more.

Every value that came from the log (sites, causes, reasons, stderr) is escaped: the page
shows what sites wrote, and a site must not be able to script it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from html import escape
from typing import Final

from lodestream.client.analytics.figures.common import Unavailable
from lodestream.client.analytics.figures.little_steady import SteadyLittle
from lodestream.client.analytics.stats import Spread
from lodestream.client.analytics.summary import Summary

MAX_ROWS: Final = 20  # a binned series is merged into at most this many rows


def utc_time(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).isoformat(timespec="seconds")


def _s(value: float) -> str:
    return f"{value:.2e}" if value != 0 and abs(value) < 0.01 else f"{value:,.3f}"


def _table(caption: str, header: Sequence[str], rows: Iterable[Sequence[str]],
           text_columns: int = 1) -> str:  # fmt: skip
    head = "".join(f"<th>{escape(h)}</th>" for h in header)
    body = []
    for row in rows:
        cells = [
            f'<td class="text">{escape(c)}</td>' if i < text_columns else f"<td>{escape(c)}</td>"
            for i, c in enumerate(row)
        ]
        body.append("<tr>" + "".join(cells) + "</tr>")
    return (f"<table><caption>{escape(caption)}</caption><tr>{head}</tr>"
            + "".join(body) + "</table>")  # fmt: skip


def _missing(caption: str, missing: Unavailable) -> str:
    return f'<p class="note"><b>{escape(caption)}</b>: {escape(missing.reason)}</p>'


def _spread(spread: Spread | None) -> list[str]:
    if spread is None:
        return ["0", "-", "-", "-", "-", "-"]
    return [str(spread.n), f"{_s(spread.mean)} ± {_s(spread.sd)}", _s(spread.p50), _s(spread.p95),
            _s(spread.min), _s(spread.max)]  # fmt: skip


def overview(summary: Summary) -> str:
    intake, window = summary.intake, summary.window
    rows = [
        ("selection", summary.selection.describe()),
        ("window", f"{utc_time(window.start)} → {utc_time(window.end)} ({window.span:.1f} s)"),
        ("messages read", f"{intake.read}"),
        ("refused by the shared rule", f"{intake.refused}"),
        ("illegal transitions (quarantined)", f"{intake.illegal}"),
        ("unreadable lines", f"{intake.unreadable}"),
        ("jobs", f"{summary.jobs}: " + ", ".join(f"{k} {v}"
                                                for k, v in summary.jobs_by_state.items())),
        ("pilot sessions / batch jobs", f"{summary.sessions} / {summary.batch_jobs}"),
    ]  # fmt: skip
    return _table("Overview", ("what", "value"), rows, text_columns=2)


def table_1(summary: Summary) -> str:
    caption = "Table 1: stage latencies of finished jobs (seconds)"
    if isinstance(summary.stages, Unavailable):
        return _missing(caption, summary.stages)
    rows = [
        (r.stage, r.definition, *_spread(r.spread), str(r.skipped)) for r in summary.stages.rows
    ]
    header = ("stage", "from → to", "jobs", "mean ± sd", "p50", "p95", "min", "max", "skipped")
    return _table(caption, header, rows, text_columns=2)


def pilot_table(summary: Summary) -> str:
    caption = "Pilot overhead per run (seconds)"
    if isinstance(summary.pilot, Unavailable):
        return _missing(caption, summary.pilot)
    rows = [(r.step, *_spread(r.spread), str(r.stamped)) for r in summary.pilot.rows]
    header = ("step", "runs", "mean ± sd", "p50", "p95", "min", "max", "with pilot stamps")
    return _table(caption, header, rows)


def little_table(summary: Summary) -> str:
    caption = "Little's law per site (L = λW)"
    if isinstance(summary.little, Unavailable):
        return _missing(caption, summary.little)
    rows: list[Sequence[str]] = []
    for r in summary.little:
        rel, ci = r.relative_difference, r.relative_interval
        rows.append((
            r.site, "whole window", str(r.jobs), f"{r.mean_in_system:.4f}",
            f"{r.arrival_rate:.4f}", "-" if r.mean_sojourn is None else _s(r.mean_sojourn),
            "-" if r.lambda_w is None else f"{r.lambda_w:.4f}",
            "-" if rel is None else f"{rel:+.2%}",
            "-" if ci is None else f"[{ci.low:+.2%}, {ci.high:+.2%}]", r.verdict,
        ))  # fmt: skip
        rows.append(_steady_row(r.site, r.steady, summary.window.start))
    header = ("site", "over", "jobs", "L", "λ (1/s)", "W (s)", "λW", "(λW-L)/L",
              "95% interval", "verdict")  # fmt: skip
    return _table(caption, header, rows, text_columns=2)


def _steady_row(site: str, steady: SteadyLittle | Unavailable | None, t0: float) -> list[str]:
    if steady is None or isinstance(steady, Unavailable):
        why = "not computed" if steady is None else steady.reason
        return [site, "steady window", "-", "-", "-", "-", "-", "-", "-", why]
    gap = steady.relative_gap
    over = f"{steady.chosen}, {steady.start - t0:.1f}-{steady.end - t0:.1f} s"
    balance = (f"{steady.arrivals} in, {steady.departures} out"
               + ("" if steady.balanced else ": not balanced, not steady"))  # fmt: skip
    return [site, over, str(steady.arrivals), f"{steady.mean_in_system:.4f}",
            f"{steady.arrival_rate:.4f}", _s(steady.mean_sojourn), f"{steady.lambda_w:.4f}",
            "-" if gap is None else f"{gap:+.2%}", "-", balance]  # fmt: skip


def failures_table(summary: Summary) -> str:
    if not summary.failures:
        return '<p class="note"><b>Failures</b>: none in the selection.</p>'
    rows = [
        (
            g.type,
            " ← ".join(g.chain) or "(no cause recorded)",
            str(g.events),
            str(g.jobs),
            str(g.jobs_failed),
            ", ".join(map(str, g.return_codes)),
            g.example,
        )
        for g in summary.failures
    ]
    header = ("event", "cause chain", "events", "jobs", "now FAILED", "exit codes", "example")
    return _table("Failures by cause chain", header, rows, text_columns=2)


def failures_by_app_table(summary: Summary) -> str:
    caption = "Failures by app, exit code and first stderr line"
    if not summary.failures_by_app:
        return f'<p class="note"><b>{caption}</b>: none in the selection.</p>'
    rows = [
        (g.app, g.first_line or "(stderr empty)", g.type,
         "-" if g.return_code is None else str(g.return_code), str(g.events), str(g.jobs),
         str(g.jobs_failed), str(g.example_job))
        for g in summary.failures_by_app
    ]  # fmt: skip
    header = ("app", "first stderr line (or reason)", "event", "exit code", "events", "jobs",
              "now FAILED", "a job")  # fmt: skip
    return _table(caption, header, rows, text_columns=3)


def headline_table(summary: Summary) -> str:
    h = summary.headline
    rate = h.jobs_per_s
    rows = [
        ("jobs", f"{h.jobs} ({h.finished} finished, {h.failed} failed)"),
        ("makespan", "- (a job has not reached a final state)" if h.makespan_s is None
         else f"{h.makespan_s:,.2f} s (first job created → last job final)"),
        ("throughput", "-" if rate is None else f"{rate:,.3f} jobs finished per second"),
        ("utilization", "- (no pilot session)" if h.utilization is None
         else f"{h.utilization:.1%} of the node-seconds pilots held were busy"),
    ]  # fmt: skip
    return _table("Headline figures", ("what", "value"), rows, text_columns=2)


def _merged(values: Sequence[float], per: int, mean: bool) -> list[float]:
    chunks = [values[i : i + per] for i in range(0, len(values), per)]
    return [math.fsum(c) / len(c) if mean else math.fsum(c) for c in chunks]


def throughput_table(summary: Summary) -> str:
    t = summary.throughput
    per = max(1, -(-t.bins.count // MAX_ROWS))
    width = t.bins.width * per
    states = list(t.counts)
    merged = {s: _merged(t.counts[s], per, mean=False) for s in states}
    rows = [[_s(i * width), *(f"{int(merged[s][i])}" for s in states)]
            for i in range(-(-t.bins.count // per))]  # fmt: skip
    rows.append(["total", *(str(t.total(s)) for s in states)])
    caption = f"Throughput: jobs entering each state per {_s(width)} s"
    return _table(caption, ("from (s)", *(s.value for s in states)), rows)


def utilization_table(summary: Summary) -> str:
    u = summary.utilization
    per = max(1, -(-u.bins.count // MAX_ROWS))
    width = u.bins.width * per
    busy, held = _merged(u.busy, per, mean=True), _merged(u.provisioned, per, mean=True)
    allocated = _merged(u.allocated, per, mean=True)
    rows = [[_s(i * width), f"{b:.2f}", f"{h:.2f}", f"{a:.2f}", f"{b / h:.0%}" if h else "-"]
            for i, (b, h, a) in enumerate(zip(busy, held, allocated, strict=True))]  # fmt: skip
    overall = u.overall
    rows.append(["window", f"{_s(u.busy_node_s)} node-s", f"{_s(u.provisioned_node_s)} node-s",
                 f"{_s(u.allocated_node_s)} node-s",
                 "-" if overall is None else f"{overall:.0%}"])  # fmt: skip
    header = ("from (s)", "busy", "provisioned (sessions)", "allocated (batch jobs)",
              "utilization")  # fmt: skip
    return _table(f"Utilization: nodes, mean per {_s(width)} s", header, rows)


def refusals_table(summary: Summary) -> str:
    listed = summary.intake.listed
    if not listed:
        return ""
    rows = [(str(r.seq), r.subject, r.stage, r.reason) for r in listed]
    caption = f"Skipped messages ({summary.intake.skipped}; the first {len(listed)} listed)"
    return _table(caption, ("seq", "subject", "stage", "reason"), rows, text_columns=4)
