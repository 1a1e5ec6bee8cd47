"""The report's plots over time, one PNG each, drawn with matplotlib's Agg renderer.

Figures are made with :class:`matplotlib.figure.Figure` directly, not through pyplot: no
global backend or figure registry, so nothing depends on the process's display or state.
Each function takes what it draws and a path, and writes one file; the x axes are seconds
from the window's start, which the page states. Binned series are drawn as stairs over the
bins' edges, so every bin, the first and last included, is drawn its full width.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Final

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from lodestream.client.analytics.figures.latency import STAGES
from lodestream.client.analytics.figures.states import STATE_COLOURS, edges
from lodestream.schemas.states import JobState

if TYPE_CHECKING:
    from lodestream.client.analytics.figures.backlog import Backlog
    from lodestream.client.analytics.figures.states import JobsInState
    from lodestream.client.analytics.figures.throughput import Throughput
    from lodestream.client.analytics.figures.utilization import Utilization

DPI: Final = 90
HISTOGRAM_BINS: Final = 30
X_LABEL: Final = "seconds from the window's start"
S = JobState
# The states a reader follows the flow by; the stacked area shows every state.
THROUGHPUT_STATES: Final = (S.CREATED, S.RUNNING, S.RUN_ERROR, S.RUN_TIMEOUT, S.JOB_FINISHED,
                            S.FAILED, S.KILLED)  # fmt: skip


def figure(width: float, height: float) -> Figure:
    made = Figure(figsize=(width, height))
    FigureCanvasAgg(made)
    return made


def save(made: Figure, path: Path) -> Path:
    made.savefig(path, dpi=DPI, bbox_inches="tight")
    return path


def states_plot(states: JobsInState, path: Path) -> Path:
    """Jobs in each state, stacked: each bin's layers add up to the jobs in the system."""
    made = figure(10, 4.5)
    axes = made.subplots()
    x = edges(states.bins)
    layers = list(states.mean)
    axes.stackplot(
        x, [[*states.mean[s], states.mean[s][-1]] for s in layers], step="post",
        colors=[STATE_COLOURS[s] for s in layers], labels=[s.value for s in layers],
        edgecolor="white", linewidth=0.3,
    )  # fmt: skip
    axes.set_xlim(x[0], x[-1])
    axes.set_xlabel(X_LABEL)
    axes.set_ylabel("jobs (mean per bin)")
    axes.set_title("Jobs in each state")
    handles, labels = axes.get_legend_handles_labels()
    # Top of the legend = top of the stack.
    axes.legend(handles[::-1], labels[::-1], fontsize="small", loc="upper left",
                bbox_to_anchor=(1.01, 1.0), frameon=False)  # fmt: skip
    return save(made, path)


def throughput_plot(throughput: Throughput, path: Path) -> Path:
    """One panel per state, on one time axis: states entered at once do not hide each other."""
    states = [s for s in THROUGHPUT_STATES if throughput.counts.get(s)]
    made = figure(10, 1.2 * max(1, len(states)) + 1.0)
    grid = made.subplots(max(1, len(states)), 1, sharex=True, squeeze=False)[:, 0]
    x = edges(throughput.bins)
    width = throughput.bins.width
    for axes, state in zip(grid, states, strict=False):
        counts = throughput.counts[state]
        axes.stairs([c / width for c in counts], x, color=STATE_COLOURS[state], fill=True)
        axes.set_ylim(bottom=0)
        axes.set_ylabel("jobs/s", fontsize="small")
        axes.set_title(f"{state.value}: {sum(counts)} entries", fontsize="small", loc="left")
    grid[-1].set_xlim(x[0], x[-1])
    grid[-1].set_xlabel(X_LABEL)
    made.suptitle(f"Throughput: jobs entering each state per second ({width:g} s bins)")
    made.tight_layout()
    return save(made, path)


def utilization_plot(utilization: Utilization, path: Path) -> Path:
    made = figure(10, 4)
    axes = made.subplots()
    x = edges(utilization.bins)
    axes.stairs(utilization.provisioned, x, color="#7f7f7f", linewidth=2,
                label="provisioned (pilot sessions)")  # fmt: skip
    if any(utilization.allocated):
        axes.stairs(utilization.allocated, x, color="#ff7f0e", linestyle="--",
                    label="allocated (batch jobs)")  # fmt: skip
    axes.stairs(utilization.busy, x, color="#1f77b4", fill=True, alpha=0.6,
                label="busy (running jobs)")  # fmt: skip
    overall = utilization.overall
    words = "" if overall is None else f": {overall:.0%} of provisioned node-seconds busy"
    axes.set_xlim(x[0], x[-1])
    axes.set_ylim(bottom=0)
    axes.set_xlabel(X_LABEL)
    axes.set_ylabel("nodes (mean per bin)")
    axes.set_title("Node utilization" + words)
    axes.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    return save(made, path)


def latency_histograms(
    samples: Mapping[str, Sequence[float]], skipped: Mapping[str, int], path: Path
) -> Path:
    """One histogram per stage (the Balsam paper's Figure 4 shape)."""
    made = figure(12, 6.5)
    grid = made.subplots(2, 3)
    for axes, stage in zip(grid.flat, STAGES, strict=True):
        values = samples.get(stage, ())
        if values:
            axes.hist(values, bins=HISTOGRAM_BINS, color="#1f77b4")
        else:
            why = f"skipped by {skipped[stage]} jobs" if skipped.get(stage) else "no data"
            axes.text(0.5, 0.5, why, ha="center", va="center", transform=axes.transAxes)
            axes.set_xticks([])
            axes.set_yticks([])
        axes.set_title(f"{stage} (n = {len(values)})")
        axes.set_xlabel("seconds")
        axes.set_ylabel("jobs")
    made.suptitle("Stage latencies of finished jobs")
    made.tight_layout()
    return save(made, path)


def backlog_plot(backlog: Backlog, path: Path) -> Path:
    made = figure(10, 4)
    axes = made.subplots()
    x = edges(backlog.bins)
    for site, waiting in backlog.waiting.items():
        axes.stairs(waiting, x, linewidth=2, label=site)
    axes.set_xlim(x[0], x[-1])
    axes.set_ylim(bottom=0)
    axes.set_xlabel(X_LABEL)
    axes.set_ylabel("jobs waiting (mean per bin)")
    axes.set_title("Backlog per site: jobs in the system and not running")
    if backlog.waiting:
        axes.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0),
                    frameon=False)  # fmt: skip
    return save(made, path)
