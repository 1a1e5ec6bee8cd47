"""Apps' versions, and why an edited app file no longer loads.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-06

``rm.apps.version`` is what ``app.registered`` / ``app.updated`` say of the app's file (a
hash of its content and interface; '' for apps published before versions). ``error`` is set
by ``app.load_failed`` for the apps last loaded from a file that no longer loads, and
cleared by the next ``app.updated``.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | Sequence[str] | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

SCHEMA = "rm"


def upgrade() -> None:
    op.add_column(
        "apps", sa.Column("version", sa.Text(), nullable=False, server_default=""), schema=SCHEMA
    )
    op.add_column("apps", sa.Column("error", sa.Text(), nullable=True), schema=SCHEMA)


def downgrade() -> None:
    op.drop_column("apps", "error", schema=SCHEMA)
    op.drop_column("apps", "version", schema=SCHEMA)
