"""A replay of the log split across processes by job, session and batch job. Re-exports only."""

from lodestream.client.analytics.parallel.load import load_stream_parallel
from lodestream.client.analytics.parallel.partition import share_of

__all__ = ["load_stream_parallel", "share_of"]
