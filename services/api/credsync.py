"""What ``lode up``'s credential sync last did, as the API shows it.

The sync (``services/embedded/credentials.py``) writes ``public.credential_sync`` and
``public.credential_rejects``; here they are read back: the state for ``/healthz`` and
``GET /users/me``, and each binding's own reject for its owner (``lode site ls``, the
monitoring key). A stack whose NATS authorization is managed elsewhere has no row: the
state is then ``null``.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Literal

from pydantic import BaseModel, Field
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncConnection

from lodestream.infra.postgres.tables import credential_rejects, credential_sync
from lodestream.services.api.keys import Kind


class CredentialSyncOut(BaseModel):
    """The credential sync's state: ``ok``; ``degraded`` (some bindings were left out of
    nats-server's authorization, every other change applied); ``stuck`` (a change could not
    be applied at all: ``detail`` says why)."""

    state: Literal["ok", "degraded", "stuck"]
    detail: str
    rejected: int = Field(description="bindings left out of nats-server's authorization")
    reloads: int
    updated_at: datetime


async def sync_state(conn: AsyncConnection) -> CredentialSyncOut | None:
    row = (await conn.execute(select(credential_sync).where(credential_sync.c.id == 1))).first()
    if row is None:
        return None
    rejected = (await conn.execute(select(func.count()).select_from(credential_rejects))).scalar()
    return CredentialSyncOut(
        state=row.state,
        detail=row.detail,
        rejected=int(rejected or 0),
        reloads=row.reloads,
        updated_at=row.updated_at,
    )


async def rejects_of(
    conn: AsyncConnection, kind: Kind, bound: Mapping[str, str | None]
) -> dict[str, str]:
    """holder -> why its key was left out, for those of ``bound`` (holder -> its key now)
    whose current key was (a reject of a key since replaced is no longer theirs)."""
    holders = [holder for holder, key in bound.items() if key is not None]
    if not holders:
        return {}
    rows = await conn.execute(
        select(
            credential_rejects.c.holder,
            credential_rejects.c.public_key,
            credential_rejects.c.reason,
        ).where(credential_rejects.c.kind == kind, credential_rejects.c.holder.in_(holders))
    )
    return {str(h): str(why) for h, key, why in rows if bound.get(str(h)) == key}
