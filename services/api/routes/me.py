"""``/users/me``: who the caller is, and whether the credential changes it makes take effect."""

from __future__ import annotations

from fastapi import APIRouter
from pydantic import BaseModel, Field
from sqlalchemy import select

from lodestream.infra.postgres.tables import monitoring_keys
from lodestream.services.api import credsync, queries
from lodestream.services.api.credsync import CredentialSyncOut
from lodestream.services.api.deps import Context, User
from lodestream.services.api.errors import Unauthorized, Unavailable, documented
from lodestream.services.api.keys import Kind

router = APIRouter(tags=["users"])


class RejectedBinding(BaseModel):
    kind: Kind = Field(description="site, or monitor (the caller's monitoring key)")
    holder: str = Field(description="the site's name, or the caller's for the monitoring key")
    reason: str


class Me(BaseModel):
    user: str
    credential_sync: CredentialSyncOut | None
    rejected: list[RejectedBinding] = Field(
        description="the caller's bindings left out of NATS: each cannot connect until rebound"
    )


@router.get("/users/me", response_model=Me, responses=documented(Unauthorized, Unavailable))
async def me(ctx: Context, user: User) -> Me:
    async with ctx.engine.connect() as conn:
        state = await credsync.sync_state(conn)
        sites = await queries.list_sites(conn, user, include_removed=False)
        monitor = (
            await conn.execute(
                select(monitoring_keys.c.public_key).where(monitoring_keys.c.user_name == user)
            )
        ).scalar_one_or_none()
        failed_sites = await credsync.rejects_of(
            conn, "site", {str(r["name"]): r["public_key"] for r in sites}
        )
        failed_monitor = await credsync.rejects_of(conn, "monitor", {user: monitor})
    rejected = [RejectedBinding(kind="site", holder=h, reason=r) for h, r in failed_sites.items()]
    rejected += [
        RejectedBinding(kind="monitor", holder=h, reason=r) for h, r in failed_monitor.items()
    ]
    return Me(user=user, credential_sync=state, rejected=rejected)
