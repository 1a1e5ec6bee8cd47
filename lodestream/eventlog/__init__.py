"""The event log: stream setup and compare-and-set appends."""

from lodestream.eventlog.append import Appended, EventLog, Rejected
from lodestream.eventlog.errors import AppendError, ConflictError, EventLogError, StreamConfigError
from lodestream.eventlog.jetstream import JetStream, jetstream
from lodestream.eventlog.streams import ensure_streams, events_config, heartbeat_config

__all__ = [
    "AppendError",
    "Appended",
    "ConflictError",
    "EventLog",
    "EventLogError",
    "JetStream",
    "Rejected",
    "StreamConfigError",
    "ensure_streams",
    "events_config",
    "heartbeat_config",
    "jetstream",
]
