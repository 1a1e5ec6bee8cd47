"""A replay of the log split across processes by job, session and batch job. Re-exports only."""

from lodestream.client.analytics.parallel.load import (
    default_workers,
    load_stream_parallel,
    usable_workers,
)
from lodestream.client.analytics.parallel.partition import share_of

__all__ = ["default_workers", "load_stream_parallel", "share_of", "usable_workers"]
