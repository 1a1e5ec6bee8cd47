"""Errors of the controller.

ControllerError
└── ReadModelLag     the read model did not reach a needed position in time (Retryable)
"""

from __future__ import annotations

from lodestream.eventlog.errors import Retryable


class ControllerError(Exception):
    """Base of controller errors."""


class ReadModelLag(ControllerError, Retryable):
    """The projector has not applied a sequence the controller must read past."""
