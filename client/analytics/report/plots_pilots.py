"""The report's per-pilot timelines (a Gantt chart of runs per slot, and concurrency) and
its failures by app, exit code and first stderr line. Drawn as :mod:`.plots` draws.

Bars are coloured by app; a run that failed is hatched and edged in red, one that was
killed or still going edged in black. At most :data:`MAX_SESSIONS` sessions are drawn
(the first to open) and :data:`MAX_FAILURES` failure groups (the largest): the page says
how many more there were.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Final

from matplotlib.patches import Patch
from matplotlib.ticker import MaxNLocator

from lodestream.client.analytics.report.plots import X_LABEL, figure, save

if TYPE_CHECKING:
    from lodestream.client.analytics.figures.failures import AppFailure
    from lodestream.client.analytics.figures.pilot_timeline import SessionTimeline

MAX_SESSIONS: Final = 6
MAX_FAILURES: Final = 12
APP_COLOURS: Final = ("#1f77b4", "#2ca02c", "#9467bd", "#17becf", "#bcbd22", "#8c564b",
                      "#e377c2", "#7f7f7f", "#aec7e8", "#98df8a")  # fmt: skip
FAILED_EDGE: Final = "#d62728"


def pilots_plot(timelines: Sequence[SessionTimeline], start: float, path: Path) -> Path:
    """One Gantt panel per session (a row per slot), then their concurrency over time."""
    shown = timelines[:MAX_SESSIONS]
    heights = [max(1.5, 0.28 * len(t.lanes) + 0.6) for t in shown] + [2.2]
    made = figure(10, sum(heights) + 0.8)
    grid = made.subplots(len(heights), 1, sharex=True,
                         gridspec_kw={"height_ratios": heights})  # fmt: skip
    apps = sorted({bar.app for t in shown for bar in t.bars})
    colour = {app: APP_COLOURS[i % len(APP_COLOURS)] for i, app in enumerate(apps)}
    span = max((t.ended_at for t in shown), default=start) - start
    for number, (axes, timeline) in enumerate(zip(grid[:-1], shown, strict=True), 1):
        row = {lane: i for i, lane in enumerate(timeline.lanes)}
        for bar in timeline.bars:
            failed = bar.outcome in ("errored", "timed_out")
            edge = FAILED_EDGE if failed else ("black" if bar.outcome != "done" else "white")
            # A run of milliseconds still shows: at least a 250th of the axis wide.
            length = max(bar.stop - bar.start, span / 250)
            axes.barh(row[bar.lane], length, left=bar.start - start, height=0.8,
                      color=colour[bar.app], edgecolor=edge, hatch="///" if failed else None,
                      linewidth=0.8)  # fmt: skip
        axes.axvspan(timeline.opened_at - start, timeline.ended_at - start, color="#f0f0f0",
                     zorder=0)  # fmt: skip
        axes.set_yticks(range(len(timeline.lanes)), timeline.lanes, fontsize="small")
        axes.invert_yaxis()
        axes.set_title(f"pilot {number}: session …{_tail(timeline)} ({timeline.site}, "
                       f"{timeline.cores} cores): {len(timeline.bars)} runs on "
                       f"{len(timeline.lanes)} slots, at most {timeline.peak} at once",
                       fontsize="medium", loc="left")  # fmt: skip
    concurrency = grid[-1]
    for timeline in shown:
        steps = timeline.concurrency
        if steps:
            concurrency.step([at - start for at, _ in steps], [n for _, n in steps],
                             where="post", label=f"pilot {shown.index(timeline) + 1}")  # fmt: skip
    concurrency.set_ylim(bottom=0)
    concurrency.set_ylabel("runs at once")
    concurrency.set_xlabel(X_LABEL)
    concurrency.set_title("Concurrency per pilot session", fontsize="medium", loc="left")
    if shown:
        concurrency.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0),
                           frameon=False)  # fmt: skip
    handles = [_patch(colour[app], "white", None) for app in apps]
    handles.append(_patch("white", FAILED_EDGE, "///"))
    made.legend(handles, [*apps, "failed run"], loc="upper left", fontsize="small",
                bbox_to_anchor=(0.92, 0.98), frameon=False, title="app")  # fmt: skip
    made.suptitle("Pilot timelines: runs per slot", x=0.02, ha="left")
    made.tight_layout(rect=(0, 0, 0.9, 1))
    return save(made, path)


def _tail(timeline: SessionTimeline) -> str:
    # Session ids are UUIDv7: their heads are the time they were made, alike for pilots
    # started together; the tail tells them apart.
    return timeline.session_id.hex[-6:]


def _patch(face: str, edge: str, hatch: str | None) -> Patch:
    return Patch(facecolor=face, edgecolor=edge, hatch=hatch)


def failures_plot(groups: Sequence[AppFailure], path: Path) -> Path:
    """Failure events per app, exit code and first stderr line; the jobs now FAILED darker."""
    shown = list(groups[:MAX_FAILURES])
    made = figure(10, 0.45 * len(shown) + 1.4)
    axes = made.subplots()
    rows = range(len(shown))
    axes.barh(rows, [g.events for g in shown], color="#ff9896", label="failure events")
    axes.barh(rows, [g.jobs_failed for g in shown], height=0.45, color="#d62728",
              label="jobs now FAILED")  # fmt: skip
    axes.set_yticks(rows, [_short(g.label) for g in shown], fontsize="small")
    axes.invert_yaxis()
    axes.set_xlabel("count")
    axes.xaxis.set_major_locator(MaxNLocator(integer=True))
    axes.set_title("Failures by app, exit code and first stderr line")
    axes.legend(fontsize="small", loc="lower right")
    return save(made, path)


def _short(label: str, most: int = 70) -> str:
    return label if len(label) <= most else label[: most - 1] + "…"
