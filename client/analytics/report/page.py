"""``index.html`` of the report: the headline figures, then a section per question a reader
asks, each with its plot and its table. The tables are :mod:`.tables`'."""

from __future__ import annotations

from collections.abc import Mapping
from html import escape
from typing import Final

from lodestream.client.analytics.report import tables
from lodestream.client.analytics.summary import Summary

STYLE: Final = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 72em; color: #222; }
table { border-collapse: collapse; margin: 0.5em 0 1.5em; }
th, td { border: 1px solid #bbb; padding: 0.25em 0.6em; text-align: right; }
th:first-child, td:first-child, td.text { text-align: left; }
caption { font-weight: bold; text-align: left; padding-bottom: 0.3em; }
img { max-width: 100%; border: 1px solid #ddd; margin-bottom: 1em; }
p.note { color: #666; }
"""
# Each plot's key, its alternative text, and what the reader should know to read it.
PLOTS: Final = {
    "states": (
        "Jobs in each state, stacked",
        "Each bin's layers add up to the jobs in the system then; finished jobs pile "
        "up at the bottom.",
    ),
    "throughput": ("Throughput per state", "Jobs entering each state per second, per bin."),
    "utilization": ("Node utilization against nodes provisioned", ""),
    "pilots": (
        "Pilot timelines: runs per slot, and concurrency",
        "One panel per pilot session, a row per slot (host:core), a bar per run, "
        "coloured by app; failed runs hatched. The grey band is the session's life.",
    ),
    "latency": ("Stage latency histograms (the Balsam paper's Figure 4)", ""),
    "failures": ("Failures by app, exit code and first stderr line", ""),
    "backlog": ("Backlog per site", ""),
}


def _image(images: Mapping[str, str], key: str) -> str:
    if key not in images:
        return ""
    alt, note = PLOTS[key]
    words = f'<p class="note">{escape(note)}</p>' if note else ""
    return f'<img src="{escape(images[key])}" alt="{escape(alt)}">{words}'


def _section(title: str, *parts: str) -> str:
    return f"<h2>{escape(title)}</h2>" + "".join(parts)


def render_page(summary: Summary, images: Mapping[str, str], sessions_note: str = "") -> str:
    """The whole page; ``images`` maps each plot's key to its file name beside the page."""
    start = tables.utc_time(summary.window.start)
    note = f'<p class="note">{escape(sessions_note)}</p>' if sessions_note else ""
    body = [
        tables.headline_table(summary),
        tables.overview(summary),
        _section("Jobs in each state", _image(images, "states")),
        _section("Throughput", _image(images, "throughput"), tables.throughput_table(summary)),
        _section("Utilization", _image(images, "utilization"),
                 tables.utilization_table(summary)),
        _section("Pilot timelines", _image(images, "pilots"), note),
        _section("Stage latencies", tables.table_1(summary), _image(images, "latency")),
        _section("Pilot overhead", tables.pilot_table(summary)),
        _section("Little's law", tables.little_table(summary)),
        _section("Failures", tables.failures_by_app_table(summary),
                 _image(images, "failures"), tables.failures_table(summary)),
        _section("Backlog", _image(images, "backlog")),
        tables.refusals_table(summary),
    ]  # fmt: skip
    return (
        "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">"
        "<title>lodestream analytics</title>"
        f"<style>{STYLE}</style></head><body>"
        "<h1>lodestream analytics</h1>"
        f'<p class="note">Times on the plots are seconds from {escape(start)}.</p>'
        + "".join(body) + "</body></html>\n"
    )  # fmt: skip
