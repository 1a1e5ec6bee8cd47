"""A JetStream context whose pipelined publishes report refusals (nats-io/nats.py#985).

In nats-py 2.16 ``APIError.from_error`` raises instead of returning, so when
the server refuses a ``publish_async`` (a lost compare-and-set, error 10071)
the exception escapes the reply callback and the ack future stays pending
until ``EventLog.append_many`` times out on the whole batch. This subclass
puts the error on the future, where ``append_many`` expects it. Every
process that appends builds its context with :func:`jetstream`. It can go
once nats-py ships the fix (PR #994).
"""

from __future__ import annotations

from typing import Any, Final

from nats.js import JetStreamContext
from nats.js.errors import APIError

# nats-py's async reply subjects: <inbox prefix>.<22-char nuid>.<token>
_REPLY_PREFIX_EXTRA: Final = 22 + 2


class JetStream(JetStreamContext):
    async def _handle_async_reply(self, msg: Any) -> None:
        try:
            await super()._handle_async_reply(msg)
        except APIError as exc:
            token = msg.subject[len(self._nc._inbox_prefix) + _REPLY_PREFIX_EXTRA :]
            future = self._publish_async_futures.get(token)
            if future is not None and not future.done():
                future.set_exception(exc)


def jetstream(nc: Any, **options: Any) -> JetStream:
    """The JetStream context every lodestream process uses (see the module docstring)."""
    return JetStream(nc, **options)
