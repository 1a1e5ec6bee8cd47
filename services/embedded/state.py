"""The state directory of an embedded stack (default ``./.lode``) and its secrets.

Everything a second ``lode up`` needs to come back with no data loss lives
here: the JetStream store, the Postgres cluster, the local CA, the
control-plane password, the Postgres passwords (the superuser's and one per
service role) and the API token of the local user.

``env.json`` holds the settings the services were started with: the shared
``LODE_*`` variables, and under ``database_urls`` one Postgres URL per role
(``admin`` is the superuser, for migrations and administration only).
"""

from __future__ import annotations

import json
import os
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal

from lodestream.infra.postgres.roles import API, CONTROLLER, PROJECTOR
from lodestream.infra.postgres.server import SUPERUSER

# Who connects to Postgres: a service's own role, or the superuser for administration.
StackRole = Literal["admin", "api", "projector", "controller"]
ROLE_NAMES: Final[dict[StackRole, str]] = {
    "admin": SUPERUSER,
    "api": API,
    "projector": PROJECTOR,
    "controller": CONTROLLER,
}
DATABASE_URLS: Final = "database_urls"


@dataclass(frozen=True, slots=True)
class StackSecrets:
    control_password: str
    # Postgres role name -> password, the superuser's included.
    postgres: dict[str, str]

    def postgres_password(self, role: StackRole) -> str:
        return self.postgres[ROLE_NAMES[role]]


@dataclass(frozen=True, slots=True)
class StateDir:
    root: Path

    @property
    def nats(self) -> Path:
        return self.root / "nats"

    @property
    def jetstream(self) -> Path:
        return self.root / "nats" / "jetstream"

    @property
    def tls(self) -> Path:
        return self.root / "tls"

    @property
    def pg_data(self) -> Path:
        return self.root / "postgres" / "data"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def secrets_file(self) -> Path:
        return self.root / "secrets.json"

    @property
    def env_file(self) -> Path:
        return self.root / "env.json"

    @property
    def client_file(self) -> Path:
        return self.root / "client.json"

    @property
    def status_file(self) -> Path:
        """What the supervisor saw last: pids, restarts, errors (no secrets)."""
        return self.root / "status.json"

    def create(self) -> None:
        for path in (self.root, self.nats, self.tls, self.pg_data.parent, self.logs):
            path.mkdir(parents=True, exist_ok=True)
        self.root.chmod(0o755)  # Postgres runs as another account when we are root

    def read_json(self, path: Path) -> dict[str, Any]:
        if not path.exists():
            return {}
        data = json.loads(path.read_text())
        if not isinstance(data, dict):
            raise TypeError(f"{path} is not a JSON object")
        return data

    def secrets(self) -> StackSecrets:
        """The stack's passwords; those missing (a new state, an older one) are generated."""
        data = self.read_json(self.secrets_file)
        postgres = dict(data.get("postgres") or {})
        changed = "control_password" not in data
        for role in ROLE_NAMES.values():
            if role not in postgres:
                postgres[role] = secrets.token_urlsafe(32)
                changed = True
        if changed:
            data.setdefault("control_password", secrets.token_urlsafe(32))
            data["postgres"] = postgres
            self.write_private_json(self.secrets_file, data)
        return StackSecrets(str(data["control_password"]), postgres)

    def write_private_json(self, path: Path, data: dict[str, Any]) -> None:
        """Write with mode 0600: these files hold passwords and tokens."""
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.unlink(missing_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(data, handle, indent=2, sort_keys=True)
            handle.write("\n")
        tmp.replace(path)


def apply_stack_environment(state_dir: Path, role: StackRole) -> bool:
    """Default ``LODE_*`` variables to those of the embedded stack in ``state_dir``.

    ``LODE_DATABASE_URL`` becomes the URL of ``role``. Variables already set
    win, so the same commands work against an external NATS and Postgres.
    Returns True if a stack environment was found.
    """
    state = StateDir(state_dir)
    env = state.read_json(state.env_file)
    urls = env.get(DATABASE_URLS)
    if isinstance(urls, dict) and role in urls:
        os.environ.setdefault("LODE_DATABASE_URL", str(urls[role]))
    for key, value in env.items():
        if isinstance(value, str):  # an env.json from an older `lode up` is flat: all strings
            os.environ.setdefault(key, value)
    return bool(env)
