"""Errors of the pilot.

PilotRefused      a setting names what this machine lacks (no MPI launcher for mpi mode, its
                  executable not on PATH, no mpi4py for mpi4py workers, nodes it cannot
                  discover): ``lode launcher`` stops with the reason before connecting
TagFilterError    a ``--tag key:value`` of the pilot's filter is malformed, or breaks the rules
                  of job tags: ``lode launcher`` stops with the reason before connecting
ProtocolError     a message between the ranks of an mpi4py pilot is not one of ours
ExpiredBeforeOpened  the controller expired the pilot's session before its ``session.opened``
                  landed (its heartbeat lapsed while the open was retried): the pilot opens
                  a new session
"""

from __future__ import annotations

import uuid


class PilotRefused(Exception):
    """The pilot cannot run as its settings ask on this machine; the message says why."""


class TagFilterError(ValueError):
    """A ``--tag`` of the pilot's filter that no job tag could match; the message says why."""


class ProtocolError(ValueError):
    """A message between an mpi4py pilot's ranks that is none of the protocol's."""


class ExpiredBeforeOpened(Exception):
    """The session's first event on the log is the controller's ``session.expired``."""

    def __init__(self, session_id: uuid.UUID) -> None:
        super().__init__(f"session {session_id} was expired before it was opened")
        self.session_id = session_id
