"""Request dependencies: the app's context, the caller, a database connection."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Annotated, cast

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from nats.aio.client import Client
from nats.js import JetStreamContext
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from lodestream.eventlog import EventLog
from lodestream.services.api import queries
from lodestream.services.api.errors import Unauthorized
from lodestream.settings import Settings


@dataclass(frozen=True, slots=True)
class ApiContext:
    """What the lifespan builds once and every request shares."""

    settings: Settings
    engine: AsyncEngine
    nc: Client
    js: JetStreamContext
    log: EventLog


def get_context(request: Request) -> ApiContext:
    return cast(ApiContext, request.app.state.context)


Context = Annotated[ApiContext, Depends(get_context)]

_bearer = HTTPBearer(auto_error=False, description="an API token from `lode user create`")


def token_hash(token: str) -> str:
    """Only this digest is stored: a leaked table does not leak usable tokens."""
    return hashlib.sha256(token.encode()).hexdigest()


Bearer = Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]


async def current_user(ctx: Context, credentials: Bearer) -> str:
    if credentials is None:
        raise Unauthorized("missing credentials: send 'Authorization: Bearer <token>'")
    async with ctx.engine.connect() as conn:
        user = await queries.user_for_token(conn, token_hash(credentials.credentials))
    if user is None:
        raise Unauthorized("invalid or revoked token")
    return user


User = Annotated[str, Depends(current_user)]


async def connection(ctx: Context) -> AsyncIterator[AsyncConnection]:
    async with ctx.engine.connect() as conn:
        yield conn


Db = Annotated[AsyncConnection, Depends(connection)]
