"""API users and their tokens (the API's own tables in ``public``, never rebuilt).

A token is shown once, at creation; only its SHA-256 digest is stored.
"""

from __future__ import annotations

import re
import secrets
from datetime import UTC, datetime
from typing import Final

from sqlalchemy import create_engine, delete, func, pool, select, update
from sqlalchemy.dialects.postgresql import insert

from lodestream.infra.postgres.migrate import sqlalchemy_url
from lodestream.infra.postgres.tables import api_tokens, bound_keys, monitoring_keys, users
from lodestream.services.api.deps import token_hash

# A user name becomes the actor ``user:<name>`` of every event the user causes.
USER_NAME: Final = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@-]{0,119}$")


def check_user_name(name: str) -> str:
    if not USER_NAME.fullmatch(name):
        raise ValueError(
            f"invalid user name {name!r}: use 1-120 letters, digits, '.', '_', '@' or '-', "
            "starting with a letter or digit"
        )
    return name


def create_user(database_url: str, name: str) -> str:
    """Create ``name`` if needed and return a new token for it (existing tokens stay valid)."""
    check_user_name(name)
    token = secrets.token_urlsafe(32)
    now = datetime.now(UTC)
    engine = create_engine(sqlalchemy_url(database_url), poolclass=pool.NullPool)
    try:
        with engine.begin() as conn:
            conn.execute(insert(users).values(name=name, created_at=now).on_conflict_do_nothing())
            conn.execute(
                api_tokens.insert().values(
                    token_hash=token_hash(token), user_name=name, created_at=now
                )
            )
    finally:
        engine.dispose()
    return token


def list_users(database_url: str) -> list[tuple[str, datetime, int]]:
    """Every user: name, creation time and how many live tokens, by name."""
    live = func.count(api_tokens.c.token_hash).filter(api_tokens.c.revoked_at.is_(None))
    query = (
        select(users.c.name, users.c.created_at, live)
        .select_from(users.outerjoin(api_tokens, api_tokens.c.user_name == users.c.name))
        .group_by(users.c.name, users.c.created_at)
        .order_by(users.c.name)
    )
    engine = create_engine(sqlalchemy_url(database_url), poolclass=pool.NullPool)
    try:
        with engine.connect() as conn:
            return [(str(n), created, int(count)) for n, created, count in conn.execute(query)]
    finally:
        engine.dispose()


def revoke_tokens(database_url: str, name: str) -> int:
    """Revoke every live token of ``name`` and its monitoring key; how many tokens."""
    engine = create_engine(sqlalchemy_url(database_url), poolclass=pool.NullPool)
    try:
        with engine.begin() as conn:
            result = conn.execute(
                update(api_tokens)
                .where(api_tokens.c.user_name == name, api_tokens.c.revoked_at.is_(None))
                .values(revoked_at=func.now())
            )
            # The credential sync drops the key from nats-server: its watchers are cut off.
            conn.execute(delete(monitoring_keys).where(monitoring_keys.c.user_name == name))
            conn.execute(
                delete(bound_keys).where(
                    bound_keys.c.kind == "monitor", bound_keys.c.holder == name
                )
            )
    finally:
        engine.dispose()
    return int(result.rowcount)
