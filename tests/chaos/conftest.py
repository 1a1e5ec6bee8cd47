"""Fixtures of the chaos test: a Postgres of its own (it is killed), the site directory."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from lodestream.agents.site.settings import SiteSettings
from lodestream.infra.postgres.migrate import upgrade
from lodestream.infra.postgres.server import EmbeddedPostgres
from tests.fixtures.nats import SecureNats
from tests.fixtures.postgres import postgres_tempdir, start_server
from tests.support.chaos import CHAOS_DATABASE
from tests.support.site import secure_site_dir

# fsync is moot when only processes die (the kernel keeps what was written), but commits must
# reach the kernel before they return: synchronous_commit stays on, as in production.
CHAOS_PG_SETTINGS = {"fsync": "off", "full_page_writes": "off"}
CHAOS_APP = Path(__file__).parent / "apps" / "chaos_marker.py"


@pytest.fixture
def chaos_postgres() -> Iterator[EmbeddedPostgres]:
    """A server for this test only: the session's server must survive the test's SIGKILLs."""
    with postgres_tempdir() as base:
        server = start_server(base / "data", CHAOS_PG_SETTINGS)
        try:
            server.create_database(CHAOS_DATABASE)
            upgrade(server.url(CHAOS_DATABASE))
            yield server
        finally:
            server.stop()


@pytest.fixture
def chaos_site(secure_nats: SecureNats, tmp_path: Path) -> SiteSettings:
    """Site ``alpha`` with the chaos app; pilots never idle out, retries outlast the faults."""
    settings = secure_site_dir(
        secure_nats, tmp_path / "site", processing={"retry_budget": 50}, idle_ttl_s=3600
    )
    shutil.copy(CHAOS_APP, settings.apps_dir / CHAOS_APP.name)
    return settings
