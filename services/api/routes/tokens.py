"""``/users/me/tokens``: the caller's API tokens, listed and revoked.

A token is known by its id, the first :data:`TOKEN_ID_LENGTH` hex digits of the SHA-256
digest the API stores (never by its secret, which is not stored). A revoked token is refused
from its next request on: every request looks its digest up.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Final

from fastapi import APIRouter, Path
from fastapi.security import HTTPAuthorizationCredentials
from pydantic import BaseModel, Field
from sqlalchemy import func, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from lodestream.infra.postgres.tables import api_tokens
from lodestream.services.api.deps import Bearer, Context, User, token_hash
from lodestream.services.api.errors import (
    InvalidInput,
    NotFound,
    Unauthorized,
    Unavailable,
    documented,
)

router = APIRouter(tags=["users"])
TOKEN_ID_LENGTH: Final = 12
TOKEN_ID_PATTERN: Final = rf"^[0-9a-f]{{{TOKEN_ID_LENGTH}}}$"


def token_id(digest: str) -> str:
    """A token's id: the start of its stored digest."""
    return digest[:TOKEN_ID_LENGTH]


class TokenOut(BaseModel):
    id: str = Field(description=f"the first {TOKEN_ID_LENGTH} hex digits of the token's digest")
    created_at: datetime
    current: bool = Field(description="the token this request was made with")


class TokenRevoked(BaseModel):
    id: str
    revoked_at: datetime


@router.get(
    "/users/me/tokens",
    response_model=list[TokenOut],
    responses=documented(Unauthorized, Unavailable),
)
async def list_tokens(ctx: Context, user: User, bearer: Bearer) -> list[TokenOut]:
    """The caller's live tokens, oldest first."""
    mine = token_id(token_hash(_secret(bearer)))
    async with ctx.engine.connect() as conn:
        rows = (
            await conn.execute(
                select(api_tokens.c.token_hash, api_tokens.c.created_at)
                .where(api_tokens.c.user_name == user, api_tokens.c.revoked_at.is_(None))
                .order_by(api_tokens.c.created_at, api_tokens.c.token_hash)
            )
        ).all()
    return [
        TokenOut(id=token_id(digest), created_at=created, current=token_id(digest) == mine)
        for digest, created in rows
    ]


@router.delete(
    "/users/me/tokens/{token_id}",
    response_model=TokenRevoked,
    responses=documented(Unauthorized, NotFound, InvalidInput, Unavailable),
)
async def revoke_token(
    ctx: Context,
    user: User,
    id_: Annotated[str, Path(alias="token_id", pattern=TOKEN_ID_PATTERN)],
) -> TokenRevoked:
    """Revoke one of the caller's tokens (the one making the request too); refused from the
    token's next request on."""
    async with ctx.engine.begin() as conn:
        revoked_at = await _revoke(conn, user, id_)
    if revoked_at is None:
        raise NotFound(f"no live token of yours has id {id_}")
    return TokenRevoked(id=id_, revoked_at=revoked_at)


async def _revoke(conn: AsyncConnection, user: str, id_: str) -> datetime | None:
    result = await conn.execute(
        update(api_tokens)
        .where(
            api_tokens.c.user_name == user,
            api_tokens.c.revoked_at.is_(None),
            api_tokens.c.token_hash.startswith(id_, autoescape=True),
        )
        .values(revoked_at=func.now())
        .returning(api_tokens.c.revoked_at)
    )
    revoked: datetime | None = result.scalar()
    return revoked


def _secret(bearer: HTTPAuthorizationCredentials | None) -> str:
    # The User dependency has already refused a request without one.
    assert bearer is not None
    return bearer.credentials
