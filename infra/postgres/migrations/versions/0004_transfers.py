"""Data staging: a site's transfer locations, and what each transfer item moved.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-23

``rm.sites.transfer_locations`` is the newest ``site.locations_set`` of each site (the api
checks a job's transfers against it). ``rm.transfer_items`` gains the attempt count, the bytes
moved, how long the item took from its first submission, whether a failure was permanent, when
the item was requested, the staging step it belongs to, and whether the site's stage cache
served it. All are folds of the log; ``lode
projector rebuild`` fills them.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql as pg

revision: str = "0004"
down_revision: str | Sequence[str] | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

RM = "rm"
TIMESTAMPTZ = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.add_column(
        "sites",
        sa.Column("transfer_locations", pg.JSONB(), nullable=False, server_default=sa.text("'{}'")),
        schema=RM,
    )
    items: list[sa.Column[object]] = [
        sa.Column("attempts", sa.Integer(), nullable=False, server_default=sa.text("0")),
        sa.Column("bytes_transferred", sa.BigInteger(), nullable=True),
        sa.Column("duration_s", sa.Float(), nullable=True),
        sa.Column("permanent", sa.Boolean(), nullable=False, server_default=sa.text("false")),
        sa.Column("requested_at", TIMESTAMPTZ, nullable=True),
        sa.Column("step_id", pg.UUID(as_uuid=True), nullable=True),
        sa.Column("cached", sa.Boolean(), nullable=False, server_default=sa.text("false")),
    ]
    for column in items:
        op.add_column("transfer_items", column, schema=RM)
    op.create_index("transfer_items_site_state", "transfer_items", ["site", "state"], schema=RM)
    op.create_index("transfer_items_step", "transfer_items", ["step_id"], schema=RM)


def downgrade() -> None:
    op.drop_index("transfer_items_step", "transfer_items", schema=RM)
    op.drop_index("transfer_items_site_state", "transfer_items", schema=RM)
    for name in (
        "cached",
        "step_id",
        "requested_at",
        "permanent",
        "duration_s",
        "bytes_transferred",
        "attempts",
    ):
        op.drop_column("transfer_items", name, schema=RM)
    op.drop_column("sites", "transfer_locations", schema=RM)
