"""The parent of a split replay: one process per share (:class:`Shares`), fed its share of
the messages, whose parts it collects: :class:`lodestream.shares.Shares` with the replay as
each process's work and the analytics' errors."""

from __future__ import annotations

from collections.abc import Sequence

from lodestream import shares
from lodestream.client.analytics.errors import AnalyticsError, SourceError
from lodestream.client.analytics.parallel.compact import PackedPart, unpack
from lodestream.client.analytics.parallel.worker import SOURCE, ShareTask, replay_share
from lodestream.client.analytics.summary import Loaded


class Shares(shares.Shares[ShareTask]):
    """The processes replaying ``tasks``, one each: :meth:`start`, :meth:`send` their chunks,
    :meth:`finish`, :meth:`collect`, and :meth:`stop` always."""

    def __init__(self, tasks: Sequence[ShareTask]) -> None:
        super().__init__(
            replay_share, tasks, name="lode-analytics", what="replay process",
            error=AnalyticsError, failed=_error,
        )  # fmt: skip

    def collect(self) -> list[Loaded]:
        """Every share's part, in order of share (blocking); the first failure raised."""
        parts = []
        for share, outcome in enumerate(super().collect()):
            if not isinstance(outcome, PackedPart):
                raise AnalyticsError(f"replay process {share} sent {type(outcome).__name__}")
            parts.append(unpack(outcome))
        return parts


def _error(failure: shares.ShareFailure) -> AnalyticsError:
    kind = SourceError if failure.kind == SOURCE else AnalyticsError
    return kind(failure.message)
