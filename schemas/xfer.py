"""The transfer-item lifecycle, as data, and the ids and paths every party derives the same way.

::

    (none) ──requested──▶ pending ──submitted──▶ submitted ──succeeded──▶ succeeded
                             │  │                 │  ▲   └────failed────▶ failed
                             │  │                 └──┘ submitted again (next attempt)
                             │  └──succeeded (served from the site's stage cache)──▶ succeeded
                             └──────failed (no backend for the location)──▶ failed

:data:`XFER_TRANSITIONS` maps each event type to the states it may follow and the state it
leads to; the projector folds items through it (an event it refuses is quarantined) and a
test walks every pair.

The controller requests the items of a job's step (:func:`item_id` makes their ids from the
event that began the step, so deciding again requests the very same items, and a job reset
and staged again gets new ones); the site's transfer module moves them; the controller ends
the step when the last item has succeeded, or fails the job with the first item that failed.

:func:`remote_path_problem` is the one rule for a slot's remote path that every backend
refuses: the api answers a submission breaking it with 422, and every backend refuses an item
breaking it on its own, before it submits the rest of its batch.
"""

from __future__ import annotations

import posixpath
import re
import uuid
from collections.abc import Mapping
from types import MappingProxyType
from typing import Final, Literal

from lodestream.schemas.errors import IllegalTransition
from lodestream.schemas.ids import derived_id
from lodestream.schemas.resources import TransferState

X = TransferState
_CONTROL: Final = re.compile(r"[\x00-\x1f\x7f-\x9f]")  # NUL, newline, any Unicode Cc
Direction = Literal["in", "out"]
FINAL_XFER_STATES: Final = frozenset({X.SUCCEEDED, X.FAILED})

XFER_TRANSITIONS: Final[Mapping[str, Mapping[TransferState | None, TransferState]]] = (
    MappingProxyType({
        "xfer.requested": MappingProxyType({None: X.PENDING}),
        "xfer.submitted": MappingProxyType({X.PENDING: X.SUBMITTED, X.SUBMITTED: X.SUBMITTED}),
        # From pending: served from the site's stage cache, never submitted.
        "xfer.succeeded": MappingProxyType({X.PENDING: X.SUCCEEDED, X.SUBMITTED: X.SUCCEEDED}),
        "xfer.failed": MappingProxyType({X.PENDING: X.FAILED, X.SUBMITTED: X.FAILED}),
    })
)  # fmt: skip
"""For each transfer event type: the state it follows (None: none yet) → the state it leads to."""


def next_xfer_state(state: TransferState | None, event_type: str) -> TransferState:
    """The state after ``event_type`` in ``state``; :class:`IllegalTransition` if not allowed."""
    moves = XFER_TRANSITIONS.get(event_type)
    if moves is None:
        raise IllegalTransition(f"{event_type} is not a transfer-item event")
    target = moves.get(state)
    if target is None:
        where = "a new transfer item" if state is None else f"a {state.value} transfer item"
        raise IllegalTransition(f"{event_type} is not allowed for {where}")
    return target


def item_id(step_cause: uuid.UUID, job_id: uuid.UUID, slot: str, direction: Direction) -> uuid.UUID:
    """The transfer item of ``slot`` for the step that ``step_cause`` (an event id) began."""
    return derived_id("xfer", str(step_cause), str(job_id), direction, slot)


def local_path(workdir: str, slot_path: str) -> str:
    """The site-side path of a slot, relative to the site's data directory.

    ``workdir`` is already relative and free of '..' (the job spec checks it); the app's slot
    path is site code, but is checked the same way so that no item can name a file outside the
    job's directory.
    """
    parts = slot_path.split("/")
    if slot_path.startswith("/") or ".." in parts or not slot_path.strip("/"):
        raise ValueError(f"transfer slot path {slot_path!r} must be relative, without '..'")
    return posixpath.normpath(posixpath.join(workdir, slot_path))


def remote_path_problem(path: str) -> str | None:
    """Why no backend can move ``path``, a remote path as a slot names it; None if none.

    A remote path is read under its location's base directory, which only the site knows:
    so it must be absolute, hold no control character (NUL, a newline: no tool and no log
    line takes them as they are), and no '..' of it may climb above its own root, which under
    any base would climb out of that base. A '..' that stays inside (``/a/../b``) is left to
    each backend (Globus refuses every '..').
    """
    if not path.startswith("/"):
        return f"the remote path {path!r} is not an absolute path (it must start with '/')"
    if _CONTROL.search(path):
        return f"the remote path {path!r} holds a control character (NUL, newline, ...)"
    depth = 0
    for part in path.split("/"):
        if part == "..":
            depth -= 1
            if depth < 0:
                return f"the remote path {path!r} climbs out of its location's base with '..'"
        elif part not in {"", "."}:
            depth += 1
    return None
