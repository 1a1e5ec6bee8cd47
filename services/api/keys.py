"""One nkey public key, one principal: binding a key to a site or a monitoring credential.

nats-server refuses a whole authorization that names one nkey twice, so a key bound to two
principals would stop every later credential change from taking effect. Every binding goes
through :func:`bind` inside the transaction that records it; ``public.bound_keys`` has the
key as primary key, so of two requests binding one key exactly one commits and the other
is told why (409). The control plane's own keys are refused the same way.
"""

from __future__ import annotations

import functools
from datetime import UTC, datetime
from pathlib import Path
from typing import Final, Literal

from sqlalchemy import delete, select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncConnection

from lodestream.infra.postgres.tables import bound_keys
from lodestream.schemas.nkey import user_public_key
from lodestream.services.api.errors import Conflict
from lodestream.settings import Settings

Kind = Literal["site", "monitor"]

_WHAT: Final = {"site": "a site", "monitor": "a user's monitoring credential"}


def control_keys(settings: Settings) -> frozenset[str]:
    """The control plane's own public keys: its NATS seed's, and any the settings name."""
    keys = set(settings.api.control_public_keys)
    if settings.nats.nkey_seed_file is not None:
        keys.add(_seed_public_key(settings.nats.nkey_seed_file))
    return frozenset(keys)


@functools.cache
def _seed_public_key(path: Path) -> str:
    return user_public_key(path.read_bytes().strip())


async def bind(
    conn: AsyncConnection, settings: Settings, key: str, kind: Kind, *, holder: str, owner: str
) -> bool:
    """Bind ``key`` to ``holder`` in ``conn``'s transaction; False if it already was.

    Raises :class:`Conflict` naming why if the key belongs to anything else.
    """
    if key in control_keys(settings):
        raise Conflict("this public key is the control plane's own; make a new key")
    inserted = await conn.execute(
        insert(bound_keys)
        .values(public_key=key, kind=kind, holder=holder, owner=owner, bound_at=datetime.now(UTC))
        .on_conflict_do_nothing(index_elements=[bound_keys.c.public_key])
        .returning(bound_keys.c.public_key)
    )
    if inserted.first() is not None:
        return True
    # A concurrent binding of the same key has committed by now (the insert waited for it).
    row = (
        await conn.execute(
            select(bound_keys.c.kind, bound_keys.c.holder, bound_keys.c.owner).where(
                bound_keys.c.public_key == key
            )
        )
    ).one()
    if (row.kind, row.holder, row.owner) == (kind, holder, owner):
        return False  # a retry of this very binding
    if row.owner == owner and row.kind == "site":
        raise Conflict(
            f"this public key is already bound to your site {row.holder!r}; make a new key"
        )
    raise Conflict(f"this public key is already bound to {_WHAT[row.kind]}; make a new key")


async def release(
    conn: AsyncConnection, kind: Kind, holder: str, *, keep: str | None = None
) -> None:
    """Unbind every key of ``holder`` but ``keep``: it may be bound again, to anyone."""
    statement = delete(bound_keys).where(bound_keys.c.kind == kind, bound_keys.c.holder == holder)
    if keep is not None:
        statement = statement.where(bound_keys.c.public_key != keep)
    await conn.execute(statement)


async def release_key(conn: AsyncConnection, key: str, kind: Kind, holder: str) -> None:
    """Unbind ``key`` from ``holder`` (a binding whose change did not land)."""
    await conn.execute(
        delete(bound_keys).where(
            bound_keys.c.public_key == key, bound_keys.c.kind == kind, bound_keys.c.holder == holder
        )
    )
