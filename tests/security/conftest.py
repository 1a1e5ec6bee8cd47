"""A running stack to attack: shared where attacks leave nothing behind, fresh where they may.

The shared stack serves every test of the package that only reads, or writes what the
stack refuses or quarantines; a test that kills a pilot, stops a service or may break a
consumer gets a stack of its own (``fresh_stack``, a few seconds to start).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from lodestream.infra.postgres.server import EmbeddedPostgres
from tests.support.stack import Stack, running_stack


@pytest.fixture(scope="package")
def shared_stack(
    tmp_path_factory: pytest.TempPathFactory, postgres_server: EmbeddedPostgres
) -> Iterator[Stack]:
    with running_stack(tmp_path_factory.mktemp("shared-stack"), postgres_server) as stack:
        yield stack


@pytest.fixture
def fresh_stack(tmp_path: Path, postgres_server: EmbeddedPostgres) -> Iterator[Stack]:
    with running_stack(tmp_path / "stack", postgres_server) as stack:
        yield stack
