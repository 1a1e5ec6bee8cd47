"""One public key, one principal; and what the credential sync did with them.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01

``public.bound_keys`` holds every nkey public key bound to a site or a monitoring key, with
the key as primary key: the API inserts the row in the transaction that binds the key, so a
key bound twice (a user's monitoring key set to a site's key, a second site registered with
a key already in use) is refused with 409 instead of reaching nats-server, which refuses a
configuration with a duplicate nkey as a whole. Existing bindings are copied in: live sites
first, so where a monitoring key duplicates a site's key, the site keeps it.

``public.credential_sync`` (one row) and ``public.credential_rejects`` are written by the
credential sync of ``lode up``: its state, and the bindings it left out of nats-server's
authorization and why, which the API shows to their owners and in ``/healthz``.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | Sequence[str] | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TIMESTAMPTZ = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "bound_keys",
        sa.Column("public_key", sa.Text(), primary_key=True),
        sa.Column("kind", sa.Text(), nullable=False),
        sa.Column("holder", sa.Text(), nullable=False),
        sa.Column("owner", sa.Text(), nullable=False),
        sa.Column("bound_at", TIMESTAMPTZ, nullable=False),
        sa.CheckConstraint("kind IN ('site', 'monitor')", name="bound_keys_kind"),
        schema="public",
    )
    op.create_index("bound_keys_holder", "bound_keys", ["kind", "holder"], schema="public")
    op.create_table(
        "credential_sync",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("state", sa.Text(), nullable=False),
        sa.Column("detail", sa.Text(), nullable=False, server_default=""),
        sa.Column("reloads", sa.Integer(), nullable=False, server_default=sa.text("0")),
        sa.Column("refused", sa.Integer(), nullable=False, server_default=sa.text("0")),
        sa.Column("updated_at", TIMESTAMPTZ, nullable=False),
        sa.CheckConstraint("id = 1", name="credential_sync_one_row"),
        schema="public",
    )
    op.create_table(
        "credential_rejects",
        sa.Column("kind", sa.Text(), nullable=False),
        sa.Column("holder", sa.Text(), nullable=False),
        sa.Column("public_key", sa.Text(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("rejected_at", TIMESTAMPTZ, nullable=False),
        sa.PrimaryKeyConstraint("kind", "holder"),
        schema="public",
    )
    op.execute(
        "INSERT INTO public.bound_keys (public_key, kind, holder, owner, bound_at) "
        "SELECT DISTINCT ON (public_key) public_key, 'site', name, owner, created_at "
        "FROM rm.sites WHERE removed_at IS NULL AND public_key IS NOT NULL "
        "ORDER BY public_key, created_at "
        "ON CONFLICT DO NOTHING"
    )
    op.execute(
        "INSERT INTO public.bound_keys (public_key, kind, holder, owner, bound_at) "
        "SELECT public_key, 'monitor', user_name, user_name, created_at "
        "FROM public.monitoring_keys ON CONFLICT DO NOTHING"
    )


def downgrade() -> None:
    op.drop_table("credential_rejects", schema="public")
    op.drop_table("credential_sync", schema="public")
    op.drop_index("bound_keys_holder", table_name="bound_keys", schema="public")
    op.drop_table("bound_keys", schema="public")
