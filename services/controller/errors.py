"""Errors of the controller.

ControllerError
└── ReadModelLag     the read model did not reach a needed position in time
"""

from __future__ import annotations


class ControllerError(Exception):
    """Base of controller errors."""


class ReadModelLag(ControllerError):
    """The projector has not applied a sequence the controller must read past."""
