"""The dashboard's login: an HttpOnly cookie that stands for an API token, for reads only.

A browser's EventSource cannot send an ``Authorization`` header, so the dashboard trades
the user's API token for a cookie once (``POST /ui/session``) and forgets the token. The
cookie holds the token's SHA-256 digest (what the database already stores), an expiry and
an HMAC of both under a key derived from the api's id secret: it cannot be forged or
extended, it is useless against any route that takes a bearer token, and revoking the
token ends the session at once (every use looks the digest up again). Only the
``viewer`` dependency accepts it: ``GET /events/stream`` and the dashboard's reads under
``/ui/api``. See docs/security.md.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from typing import Annotated, Final

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from lodestream.services.api import queries
from lodestream.services.api.deps import ApiContext, Context, current_user
from lodestream.services.api.errors import Unauthorized
from lodestream.services.api.submit import id_secret

COOKIE: Final = "lode_ui"
_PROCESS_KEY: Final = secrets.token_bytes(32)  # used only when no id secret is configured
_bearer = HTTPBearer(auto_error=False, description="an API token from `lode user create`")


def _key(ctx: ApiContext) -> bytes:
    # Every api instance derives the same key, so a session survives a restart and a
    # load balancer; without a configured secret it lasts as long as the process.
    secret = id_secret(ctx.settings)
    if not secret:
        return _PROCESS_KEY
    return hmac.new(secret, b"lodestream ui session", hashlib.sha256).digest()


def _mac(key: bytes, digest: str, expires: int) -> str:
    return hmac.new(key, f"{digest}.{expires}".encode(), hashlib.sha256).hexdigest()


def session_value(ctx: ApiContext, digest: str, now: float | None = None) -> str:
    hours = ctx.settings.api.stream.session_hours
    expires = int((time.time() if now is None else now) + hours * 3600)
    return f"{digest}.{expires}.{_mac(_key(ctx), digest, expires)}"


def session_digest(ctx: ApiContext, value: str, now: float | None = None) -> str | None:
    """The token digest a valid, unexpired cookie stands for; None otherwise."""
    parts = value.split(".")
    if len(parts) != 3 or not parts[1].isdigit():
        return None
    digest, expires, mac = parts
    if not hmac.compare_digest(mac, _mac(_key(ctx), digest, int(expires))):
        return None
    if int(expires) < (time.time() if now is None else now):
        return None
    return digest


async def viewer(
    request: Request,
    ctx: Context,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> str:
    """The caller by bearer token, or by the dashboard's cookie (read-only routes only)."""
    if credentials is not None:
        return await current_user(ctx, credentials)
    value = request.cookies.get(COOKIE)
    if value is None:
        raise Unauthorized(
            "missing credentials: send 'Authorization: Bearer <token>' or log in at /ui"
        )
    digest = session_digest(ctx, value)
    if digest is None:
        raise Unauthorized("the dashboard session expired or is invalid; log in again at /ui")
    async with ctx.engine.connect() as conn:
        user = await queries.user_for_token(conn, digest)
    if user is None:
        raise Unauthorized("the token of this dashboard session was revoked; log in again")
    return user


Viewer = Annotated[str, Depends(viewer)]
