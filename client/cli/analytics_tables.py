"""``lode analytics summary`` as rich tables: one per figure, in the order a reader asks.

Long series (throughput, utilization) are merged into at most :data:`MAX_ROWS` rows for the
terminal; ``--json`` and the HTML report keep every bin.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Final

from rich.console import Console
from rich.table import Table
from rich.text import Text

from lodestream.client.analytics.figures.common import Unavailable
from lodestream.client.analytics.stats import Spread
from lodestream.client.analytics.summary import Summary
from lodestream.schemas.states import JobState

MAX_ROWS: Final = 20
LISTED_REFUSALS: Final = 10
S = JobState
THROUGHPUT_STATES: Final = (S.CREATED, S.RUNNING, S.RUN_ERROR, S.RUN_TIMEOUT, S.JOB_FINISHED,
                            S.FAILED, S.KILLED)  # fmt: skip


def print_summary(console: Console, summary: Summary) -> None:
    for table in (
        overview(summary), stages(summary), pilot(summary), little(summary),
        throughput(summary), utilization(summary), failures_by_app(summary), failures(summary),
    ):  # fmt: skip
        console.print(table)
    if summary.intake.listed:
        console.print(refusals(summary))


def _time(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).isoformat(timespec="seconds")


def _s(value: float) -> str:
    """Seconds (or a rate) readably, from microseconds to hours."""
    if value != 0 and abs(value) < 0.01:
        return f"{value:.2e}"
    return f"{value:,.3f}" if abs(value) < 1000 else f"{value:,.0f}"


def _unavailable(title: str, missing: Unavailable) -> Table:
    table = Table(title=title)
    table.add_column("not available")
    table.add_row(missing.reason)
    return table


def overview(summary: Summary) -> Table:
    intake, counts, window = summary.intake, summary.counts, summary.window
    table = Table(title="lodestream analytics", show_header=False)
    table.add_column("what", style="bold")
    table.add_column("value")
    seqs = f"{intake.first_seq}-{intake.last_seq}" if intake.first_seq is not None else "-"
    rows = [
        ("selection", summary.selection.describe()),
        ("window", f"{_time(window.start)} → {_time(window.end)} ({_s(window.span)} s)"),
        ("messages read", f"{intake.read:,} (sequences {seqs})"),
        ("refused by the shared rule", f"{intake.refused:,}"),
        ("illegal transitions (quarantined)", f"{intake.illegal:,}"),
        ("unreadable lines", f"{intake.unreadable:,}"),
        ("of jobs begun before the range", f"{counts.begun_before:,} events, "
                                           f"{len(counts.begun_before_jobs):,} jobs"),
        ("jobs", f"{summary.jobs:,}: " + ", ".join(f"{k} {v:,}" for k, v in
                                                   summary.jobs_by_state.items())),
        ("pilot sessions / batch jobs", f"{summary.sessions:,} / {summary.batch_jobs:,}"),
        *_headline(summary),
    ]  # fmt: skip
    for what, value in rows:
        table.add_row(what, value)
    return table


def _headline(summary: Summary) -> list[tuple[str, str]]:
    h = summary.headline
    rate = h.jobs_per_s
    return [
        ("makespan", "-" if h.makespan_s is None else f"{_s(h.makespan_s)} s"),
        ("jobs finished per second", "-" if rate is None else _s(rate)),
        ("utilization", "-" if h.utilization is None else f"{h.utilization:.1%}"),
    ]


def _spread_cells(spread: Spread | None) -> list[str]:
    if spread is None:
        return ["0", "-", "-", "-"]
    return [f"{spread.n:,}", f"{_s(spread.mean)} ± {_s(spread.sd)}", _s(spread.p50), _s(spread.p95)]


def stages(summary: Summary) -> Table:
    title = "stage latencies of finished jobs, s (Balsam paper, Table 1)"
    if isinstance(summary.stages, Unavailable):
        return _unavailable(title, summary.stages)
    table = Table(title=title)
    for column in ("stage", "from → to", "jobs", "mean ± sd", "p50", "p95", "skipped"):
        table.add_column(column, justify="left" if column in ("stage", "from → to") else "right")
    for row in summary.stages.rows:
        table.add_row(row.stage, row.definition, *_spread_cells(row.spread), str(row.skipped))
    return table


def pilot(summary: Summary) -> Table:
    title = "pilot overhead per run, s"
    if isinstance(summary.pilot, Unavailable):
        return _unavailable(title, summary.pilot)
    table = Table(title=title)
    for column in ("step", "runs", "mean ± sd", "p50", "p95", "with pilot stamps"):
        table.add_column(column, justify="left" if column == "step" else "right")
    for row in summary.pilot.rows:
        table.add_row(row.step, *_spread_cells(row.spread), f"{row.stamped:,}")
    return table


def little(summary: Summary) -> Table:
    title = "Little's law per site (L = λW)"
    if isinstance(summary.little, Unavailable):
        return _unavailable(title, summary.little)
    table = Table(title=title)
    for column in ("site", "over", "jobs", "L (jobs)", "λ (jobs/s)", "W (s)", "λW",
                   "(λW-L)/L", "95% interval", "verdict"):  # fmt: skip
        table.add_column(column, justify="left" if column in ("site", "over", "verdict")
                         else "right")  # fmt: skip
    t0 = summary.window.start
    for r in summary.little:
        rel, ci = r.relative_difference, r.relative_interval
        table.add_row(
            r.site, "whole window", f"{r.jobs:,}", f"{r.mean_in_system:.3f}",
            f"{r.arrival_rate:.3f}", "-" if r.mean_sojourn is None else _s(r.mean_sojourn),
            "-" if r.lambda_w is None else f"{r.lambda_w:.3f}",
            "-" if rel is None else f"{rel:+.2%}",
            "-" if ci is None else f"[{ci.low:+.2%}, {ci.high:+.2%}] ({ci.batches} batches)",
            r.verdict,
        )  # fmt: skip
        steady = r.steady
        if steady is None or isinstance(steady, Unavailable):
            why = "not computed" if steady is None else steady.reason
            table.add_row(r.site, "steady window", *["-"] * 7, Text(why))
            continue
        gap = steady.relative_gap
        table.add_row(
            r.site, f"{steady.start - t0:.1f}-{steady.end - t0:.1f} s", f"{steady.arrivals:,}",
            f"{steady.mean_in_system:.3f}", f"{steady.arrival_rate:.3f}",
            _s(steady.mean_sojourn), f"{steady.lambda_w:.3f}",
            "-" if gap is None else f"{gap:+.2%}", "-",
            f"{steady.chosen}: {steady.arrivals} in, {steady.departures} out"
            + ("" if steady.balanced else " (not balanced: not steady)"),
        )  # fmt: skip
    return table


def _merge(width: float, count: int) -> tuple[int, float]:
    per = max(1, -(-count // MAX_ROWS))
    return per, width * per


def _merged(values: Sequence[float], per: int, mean: bool) -> list[float]:
    chunks = [values[i : i + per] for i in range(0, len(values), per)]
    return [sum(c) / len(c) if mean else sum(c) for c in chunks]


def throughput(summary: Summary) -> Table:
    t = summary.throughput
    per, width = _merge(t.bins.width, t.bins.count)
    states = [s for s in THROUGHPUT_STATES if s in t.counts]
    table = Table(title=f"throughput: jobs entering each state per {_s(width)} s")
    table.add_column("from (s)", justify="right")
    for state in states:
        table.add_column(state.value, justify="right")
    merged = {s: _merged(t.counts[s], per, mean=False) for s in states}
    rows = -(-t.bins.count // per)
    for i in range(rows):
        cells = [f"{int(merged[s][i]):,}" for s in states]
        table.add_row(_s(i * width), *cells)
    table.add_row("total", *[f"{t.total(s):,}" for s in states], style="bold")
    return table


def utilization(summary: Summary) -> Table:
    u = summary.utilization
    per, width = _merge(u.bins.width, u.bins.count)
    table = Table(title=f"nodes, mean per {_s(width)} s")
    for column in ("from (s)", "busy", "provisioned (sessions)", "allocated (batch jobs)",
                   "utilization"):  # fmt: skip
        table.add_column(column, justify="right")
    busy, held = _merged(u.busy, per, mean=True), _merged(u.provisioned, per, mean=True)
    allocated = _merged(u.allocated, per, mean=True)
    for i, (b, h, a) in enumerate(zip(busy, held, allocated, strict=True)):
        table.add_row(_s(i * width), f"{b:.2f}", f"{h:.2f}", f"{a:.2f}",
                      f"{b / h:.0%}" if h else "-")  # fmt: skip
    overall = u.overall
    table.add_row("window", f"{_s(u.busy_node_s)} node-s", f"{_s(u.provisioned_node_s)} node-s",
                  f"{_s(u.allocated_node_s)} node-s", "-" if overall is None else f"{overall:.0%}",
                  style="bold")  # fmt: skip
    return table


def failures(summary: Summary) -> Table:
    table = Table(title="failures by cause chain")
    for column in ("event", "cause chain", "events", "jobs", "now FAILED", "exit codes",
                   "first one"):  # fmt: skip
        table.add_column(column, justify="right" if column in ("events", "jobs", "now FAILED")
                         else "left")  # fmt: skip
    if not summary.failures:
        table.add_row("-", "no failure in the selection", "0", "0", "0", "", "")
    for g in summary.failures:
        table.add_row(g.type, Text(" ← ".join(g.chain) or "(no cause recorded)"), f"{g.events:,}",
                      f"{g.jobs:,}", f"{g.jobs_failed:,}", ", ".join(map(str, g.return_codes)),
                      Text(f"{g.example} (job {g.example_job})"))  # fmt: skip
    return table


def failures_by_app(summary: Summary) -> Table:
    table = Table(title="failures by app, exit code and first stderr line")
    for column in ("app", "exit code", "first stderr line (or reason)", "events", "jobs",
                   "now FAILED"):  # fmt: skip
        table.add_column(column, justify="right" if column in ("events", "jobs", "now FAILED")
                         else "left")  # fmt: skip
    if not summary.failures_by_app:
        table.add_row("-", "", "no failure in the selection", "0", "0", "0")
    for g in summary.failures_by_app:
        code = "job failed" if g.return_code is None else str(g.return_code)
        table.add_row(Text(g.app), code, Text(g.first_line or "(stderr empty)"),
                      f"{g.events:,}", f"{g.jobs:,}", f"{g.jobs_failed:,}")  # fmt: skip
    return table


def refusals(summary: Summary) -> Table:
    intake = summary.intake
    shown = intake.listed[:LISTED_REFUSALS]
    table = Table(title=f"skipped messages ({intake.skipped:,}; the first {len(shown)})")
    for column in ("seq", "subject", "why"):
        table.add_column(column)
    for r in shown:
        table.add_row(str(r.seq), Text(r.subject), Text(f"{r.stage}: {r.reason}"))
    return table
