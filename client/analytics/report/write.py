"""Write the report: the plots, then ``index.html`` that shows them beside the tables.

matplotlib is the ``analytics`` extra; without it the report is refused with the command
that installs it (the summary needs nothing beyond the base install).
"""

from __future__ import annotations

from pathlib import Path

from lodestream.client.analytics.errors import AnalyticsError, OutputError
from lodestream.client.analytics.figures.latency import stage_samples
from lodestream.client.analytics.figures.pilot_timeline import pilot_timelines
from lodestream.client.analytics.figures.states import jobs_in_state
from lodestream.client.analytics.fold import Timelines
from lodestream.client.analytics.report.page import render_page
from lodestream.client.analytics.summary import Summary


def write_report(out: Path, summary: Summary, timelines: Timelines) -> Path:
    """Write ``out/index.html`` and its PNGs; return the page's path."""
    try:
        from lodestream.client.analytics.report import plots, plots_pilots  # noqa: PLC0415
    except ImportError as exc:
        raise AnalyticsError(
            "the report needs matplotlib: pip install 'lodestream[analytics]' "
            f"(or 'matplotlib>=3.8,<4'); {exc}"
        ) from exc
    jobs = list(timelines.jobs.values())
    window, bins = summary.window, summary.throughput.bins
    sessions = pilot_timelines(jobs, timelines.sessions.values(), window)
    try:
        out.mkdir(parents=True, exist_ok=True)
        samples, skipped = stage_samples(jobs)
        images = {
            "states": plots.states_plot(jobs_in_state(jobs, window, bins), out / "states.png"),
            "throughput": plots.throughput_plot(summary.throughput, out / "throughput.png"),
            "utilization": plots.utilization_plot(summary.utilization, out / "utilization.png"),
            "latency": plots.latency_histograms(samples, skipped, out / "latency.png"),
            "backlog": plots.backlog_plot(summary.backlog, out / "backlog.png"),
        }
        if sessions:
            images["pilots"] = plots_pilots.pilots_plot(sessions, window.start,
                                                        out / "pilots.png")  # fmt: skip
        if summary.failures_by_app:
            images["failures"] = plots_pilots.failures_plot(summary.failures_by_app,
                                                            out / "failures.png")  # fmt: skip
        index = out / "index.html"
        index.write_text(render_page(summary, {k: p.name for k, p in images.items()},
                                     _sessions_note(len(sessions),
                                                    plots_pilots.MAX_SESSIONS)))  # fmt: skip
    except OSError as exc:
        raise OutputError(f"cannot write the report in {out}: {exc.strerror or exc}") from exc
    return index


def _sessions_note(count: int, most: int) -> str:
    if count == 0:
        return "No pilot session in the selection: no timeline to draw."
    shown = min(count, most)
    return "" if shown == count else f"The first {shown} of {count} pilot sessions are drawn."
