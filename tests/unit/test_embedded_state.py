"""The state directory's secrets and environment: generated once, kept, private, per role."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from lodestream.services.embedded.state import StateDir, apply_stack_environment


@pytest.fixture
def clean_environ() -> Iterator[None]:
    saved = dict(os.environ)
    for key in [k for k in os.environ if k.startswith("LODE_") or k == "DATABASE_URL"]:
        del os.environ[key]
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def test_secrets_are_generated_once_and_kept(tmp_path: Path) -> None:
    state = StateDir(tmp_path)
    first = state.secrets()

    assert set(first.postgres) == {"postgres", "lode_api", "lode_projector", "lode_controller"}
    assert len(set(first.postgres.values())) == 4
    assert state.secrets() == first
    assert state.secrets_file.stat().st_mode & 0o777 == 0o600


def test_secrets_of_an_older_state_keep_the_control_password(tmp_path: Path) -> None:
    state = StateDir(tmp_path)
    state.write_private_json(state.secrets_file, {"control_password": "from-before"})

    secrets = state.secrets()

    assert secrets.control_password == "from-before"
    assert secrets.postgres_password("admin") == secrets.postgres["postgres"]
    assert json.loads(state.secrets_file.read_text())["postgres"] == secrets.postgres


@pytest.mark.usefixtures("clean_environ")
def test_each_command_gets_its_own_database_url(tmp_path: Path) -> None:
    state = StateDir(tmp_path)
    urls = {role: f"postgresql://{role}@h/db" for role in ("admin", "api", "projector")}
    state.write_private_json(state.env_file, {"LODE_NATS_URL": "nats://h:1", "database_urls": urls})

    assert apply_stack_environment(tmp_path, "projector")

    assert os.environ["LODE_DATABASE_URL"] == "postgresql://projector@h/db"
    assert os.environ["LODE_NATS_URL"] == "nats://h:1"
    assert "database_urls" not in os.environ


@pytest.mark.usefixtures("clean_environ")
def test_the_environment_wins_and_an_older_flat_env_file_still_works(tmp_path: Path) -> None:
    state = StateDir(tmp_path)
    state.write_private_json(state.env_file, {"LODE_DATABASE_URL": "postgresql://old@h/db"})
    os.environ["LODE_NATS_URL"] = "nats://mine:1"

    assert apply_stack_environment(tmp_path, "api")

    assert os.environ["LODE_DATABASE_URL"] == "postgresql://old@h/db"
    assert os.environ["LODE_NATS_URL"] == "nats://mine:1"
