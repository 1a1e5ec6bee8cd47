"""Errors of the pilot.

PilotRefused      a setting names what this machine lacks (no MPI launcher for mpi mode, its
                  executable not on PATH, no mpi4py for mpi4py workers, nodes it cannot
                  discover): ``lode launcher`` stops with the reason before connecting
TagFilterError    a ``--tag key=value`` of the pilot's filter is malformed, or breaks the rules
                  of job tags: ``lode launcher`` stops with the reason before connecting
ProtocolError     a message between the ranks of an mpi4py pilot is not one of ours
"""

from __future__ import annotations


class PilotRefused(Exception):
    """The pilot cannot run as its settings ask on this machine; the message says why."""


class TagFilterError(ValueError):
    """A ``--tag`` of the pilot's filter that no job tag could match; the message says why."""


class ProtocolError(ValueError):
    """A message between an mpi4py pilot's ranks that is none of the protocol's."""
