"""Finding jobs by part of their id, as people type it: a prefix or a suffix of hex digits.

A prefix is a range of the primary key (ids that begin with it lie between it padded with
zeros and it padded with f's); a suffix, the random tail a person is shown, is compared on
the id's text among the owner's jobs.
"""

from __future__ import annotations

import uuid

from sqlalchemy import ColumnElement, String, cast, func

from lodestream.infra.postgres.tables import jobs


def id_conditions(prefix: str | None, suffix: str | None) -> list[ColumnElement[bool]]:
    """Conditions on ``rm.jobs`` for ids that begin with ``prefix`` and end with ``suffix``
    (lowercase hex digits without hyphens, as :func:`lodestream.schemas.ids.id_part` gives)."""
    conditions: list[ColumnElement[bool]] = []
    if prefix is not None:
        low, high = uuid.UUID(prefix.ljust(32, "0")), uuid.UUID(prefix.ljust(32, "f"))
        conditions.append(jobs.c.id.between(low, high))
    if suffix is not None:
        digits = func.replace(cast(jobs.c.id, String), "-", "")
        conditions.append(digits.endswith(suffix, autoescape=True))
    return conditions
