"""Errors of the embedded stack (``lode up``).

::

    StackError        the stack could not start; the message says which part and why

Errors of the servers themselves (:mod:`lodestream.infra.nats.errors`,
:mod:`lodestream.infra.postgres.errors`) pass through unchanged at start-up; once the
stack runs, the supervisor catches, logs and counts them instead, and retries.
"""

from __future__ import annotations


class StackError(RuntimeError):
    """The embedded stack could not start; the message says which part and why."""
