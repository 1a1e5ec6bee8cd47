"""The report's plots, one PNG each, drawn with matplotlib's Agg renderer (no display).

Figures are made with :class:`matplotlib.figure.Figure` directly, not through pyplot: no
global backend or figure registry, so nothing depends on the process's display or state.
Each function takes what it draws and a path, and writes one file; the x axes are seconds
from the window's start, which the page states.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Final

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from lodestream.client.analytics.figures.latency import STAGES

if TYPE_CHECKING:
    from lodestream.client.analytics.figures.backlog import Backlog
    from lodestream.client.analytics.figures.throughput import Throughput
    from lodestream.client.analytics.figures.utilization import Utilization
    from lodestream.client.analytics.window import Bins

DPI: Final = 110
HISTOGRAM_BINS: Final = 30


def _centres(bins: Bins) -> list[float]:
    return [(i + 0.5) * bins.width for i in range(bins.count)]


def _figure(width: float, height: float) -> Figure:
    figure = Figure(figsize=(width, height))
    FigureCanvasAgg(figure)
    return figure


def _save(figure: Figure, path: Path) -> Path:
    figure.tight_layout()
    figure.savefig(path, dpi=DPI)
    return path


def throughput_plot(throughput: Throughput, path: Path) -> Path:
    figure = _figure(9, 4)
    axes = figure.subplots()
    x = _centres(throughput.bins)
    for state, counts in throughput.counts.items():
        axes.step(x, [c / throughput.bins.width for c in counts], where="mid", label=state.value)
    axes.set_xlabel("seconds from the window's start")
    axes.set_ylabel("jobs entering the state per second")
    axes.set_title("Throughput per state")
    axes.legend(fontsize="small", ncol=3)
    return _save(figure, path)


def utilization_plot(utilization: Utilization, path: Path) -> Path:
    figure = _figure(9, 4)
    axes = figure.subplots()
    x = _centres(utilization.bins)
    axes.step(x, utilization.busy, where="mid", label="busy (running jobs)")
    axes.step(x, utilization.provisioned, where="mid", label="provisioned (pilot sessions)")
    if any(utilization.allocated):
        axes.step(x, utilization.allocated, where="mid", label="allocated (batch jobs)")
    axes.set_xlabel("seconds from the window's start")
    axes.set_ylabel("nodes (mean per bin)")
    axes.set_title("Node utilization")
    axes.legend(fontsize="small")
    return _save(figure, path)


def latency_histograms(
    samples: Mapping[str, Sequence[float]], skipped: Mapping[str, int], path: Path
) -> Path:
    """One histogram per stage (the Balsam paper's Figure 4 shape)."""
    figure = _figure(12, 6.5)
    grid = figure.subplots(2, 3)
    for axes, stage in zip(grid.flat, STAGES, strict=True):
        values = samples.get(stage, ())
        if values:
            axes.hist(values, bins=HISTOGRAM_BINS)
        else:
            why = f"skipped by {skipped[stage]} jobs" if skipped.get(stage) else "no data"
            axes.text(0.5, 0.5, why, ha="center", va="center", transform=axes.transAxes)
            axes.set_xticks([])
            axes.set_yticks([])
        axes.set_title(f"{stage} (n = {len(values)})")
        axes.set_xlabel("seconds")
        axes.set_ylabel("jobs")
    figure.suptitle("Stage latencies of finished jobs")
    return _save(figure, path)


def backlog_plot(backlog: Backlog, path: Path) -> Path:
    figure = _figure(9, 4)
    axes = figure.subplots()
    x = _centres(backlog.bins)
    for site, waiting in backlog.waiting.items():
        axes.step(x, waiting, where="mid", label=site)
    axes.set_xlabel("seconds from the window's start")
    axes.set_ylabel("jobs waiting (mean per bin)")
    axes.set_title("Backlog per site: jobs in the system and not running")
    if backlog.waiting:
        axes.legend(fontsize="small")
    return _save(figure, path)
