"""``index.html`` of the report: the tables of the summary and the plots, in one page.

Every value that came from the log (sites, causes, reasons) is escaped: the page shows what
sites wrote, and a site must not be able to script it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from html import escape
from typing import Final

from lodestream.client.analytics.figures.common import Unavailable
from lodestream.client.analytics.stats import Spread
from lodestream.client.analytics.summary import Summary

STYLE: Final = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 72em; color: #222; }
table { border-collapse: collapse; margin: 0.5em 0 1.5em; }
th, td { border: 1px solid #bbb; padding: 0.25em 0.6em; text-align: right; }
th:first-child, td:first-child, td.text { text-align: left; }
caption { font-weight: bold; text-align: left; padding-bottom: 0.3em; }
img { max-width: 100%; border: 1px solid #ddd; margin-bottom: 1.5em; }
p.note { color: #666; }
"""
PLOTS: Final = (
    ("throughput", "Throughput per state"),
    ("utilization", "Node utilization against nodes provisioned"),
    ("latency", "Stage latency histograms (the Balsam paper's Figure 4)"),
    ("backlog", "Backlog per site"),
)


def _time(seconds: float) -> str:
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
        ("window", f"{_time(window.start)} → {_time(window.end)} ({window.span:.1f} s)"),
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
    rows = []
    for r in summary.little:
        rel, ci = r.relative_difference, r.relative_interval
        rows.append((
            r.site, str(r.jobs), f"{r.mean_in_system:.4f}", f"{r.arrival_rate:.4f}",
            "-" if r.mean_sojourn is None else _s(r.mean_sojourn),
            "-" if r.lambda_w is None else f"{r.lambda_w:.4f}",
            "-" if rel is None else f"{rel:+.2%}",
            "-" if ci is None else f"[{ci.low:+.2%}, {ci.high:+.2%}]",
            {True: "yes", False: "no", None: "-"}[r.holds],
        ))  # fmt: skip
    header = ("site", "jobs", "L", "λ (1/s)", "W (s)", "λW", "(λW-L)/L", "95% interval", "holds")
    return _table(caption, header, rows)


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


def refusals_table(summary: Summary) -> str:
    listed = summary.intake.listed
    if not listed:
        return ""
    rows = [(str(r.seq), r.subject, r.stage, r.reason) for r in listed]
    caption = f"Skipped messages ({summary.intake.skipped}; the first {len(listed)} listed)"
    return _table(caption, ("seq", "subject", "stage", "reason"), rows, text_columns=4)


def render_page(summary: Summary, images: Mapping[str, str]) -> str:
    """The whole page; ``images`` maps each plot's key to its file name beside the page."""
    figures = "".join(
        f'<h2>{escape(title)}</h2><img src="{escape(images[key])}" alt="{escape(title)}">'
        for key, title in PLOTS
        if key in images
    )
    start = _time(summary.window.start)
    return (
        "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">"
        "<title>lodestream analytics</title>"
        f"<style>{STYLE}</style></head><body>"
        "<h1>lodestream analytics</h1>"
        f'<p class="note">Times on the plots are seconds from {escape(start)}.</p>'
        + overview(summary) + table_1(summary) + pilot_table(summary) + little_table(summary)
        + failures_table(summary) + figures + refusals_table(summary)
        + "</body></html>\n"
    )  # fmt: skip
