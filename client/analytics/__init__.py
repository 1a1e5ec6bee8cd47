"""Event-replay analytics: the log folded into job timelines and pilot intervals, and the
figures made of them (throughput, utilization, the Balsam paper's stage latencies, Little's
law, failures by cause, pilot overhead). Re-exports only.

::

    from lodestream.client.analytics import Selection, load_file, summarize

    summary = summarize(load_file(Path("events.jsonl"), Selection.of(sites=["alpha"])))
"""

from lodestream.client.analytics.errors import (
    AnalyticsError,
    NotEnoughData,
    NothingSelected,
    SourceError,
)
from lodestream.client.analytics.fold import TimelineFold, Timelines, fold_timelines
from lodestream.client.analytics.load import (
    export_stream,
    export_watch,
    load_file,
    load_stream,
    load_watch,
)
from lodestream.client.analytics.pilots import BatchInterval, SessionInterval
from lodestream.client.analytics.selection import Selection
from lodestream.client.analytics.summary import Loaded, Summary, summarize
from lodestream.client.analytics.timeline import JobTimeline, RunRecord, StateEntry

__all__ = [
    "AnalyticsError",
    "BatchInterval",
    "JobTimeline",
    "Loaded",
    "NotEnoughData",
    "NothingSelected",
    "RunRecord",
    "Selection",
    "SessionInterval",
    "SourceError",
    "StateEntry",
    "Summary",
    "TimelineFold",
    "Timelines",
    "export_stream",
    "export_watch",
    "fold_timelines",
    "load_file",
    "load_stream",
    "load_watch",
    "summarize",
]
