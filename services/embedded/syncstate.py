"""Where the credential sync says what it did: ``public.credential_sync`` (one row) and
``public.credential_rejects`` (each binding left out, and why).

The API reads both: ``/healthz`` and ``GET /users/me`` show the state, ``lode site ls`` and
the monitoring key show a binding's own reject to its owner.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Final, Literal

import psycopg

from lodestream.services.embedded.bindings import Binding

State = Literal["ok", "degraded", "stuck"]

_UPSERT_STATE: Final = (
    "INSERT INTO public.credential_sync (id, state, detail, reloads, refused, updated_at) "
    "VALUES (1, %s, %s, %s, %s, now()) ON CONFLICT (id) DO UPDATE SET state = EXCLUDED.state, "
    "detail = EXCLUDED.detail, reloads = EXCLUDED.reloads, refused = EXCLUDED.refused, "
    "updated_at = EXCLUDED.updated_at"
)
_INSERT_REJECT: Final = (
    "INSERT INTO public.credential_rejects (kind, holder, public_key, reason, rejected_at) "
    "VALUES (%s, %s, %s, %s, %s)"
)


@dataclass(frozen=True, slots=True)
class SyncState:
    state: State
    detail: str
    reloads: int
    refused: int
    rejects: Mapping[Binding, tuple[str, datetime]]  # why, and since when


def publish(dsn: str, state: SyncState) -> None:
    """Replace what the tables say with ``state``, in one transaction."""
    with psycopg.connect(dsn, connect_timeout=2) as conn, conn.transaction():
        conn.execute(_UPSERT_STATE, (state.state, state.detail, state.reloads, state.refused))
        conn.execute("DELETE FROM public.credential_rejects")
        with conn.cursor() as cursor:
            cursor.executemany(
                _INSERT_REJECT,
                [
                    (b.kind, b.holder, b.public_key, why, since)
                    for b, (why, since) in sorted(state.rejects.items())
                ],
            )
