"""The state directory of an embedded stack (default ``./.lode``) and its secrets.

Everything a second ``lode up`` needs to come back with no data loss lives
here: the JetStream store, the Postgres cluster, the local CA, the
control-plane password and the API token of the local user.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any


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

    def write_private_json(self, path: Path, data: dict[str, Any]) -> None:
        """Write with mode 0600: these files hold passwords and tokens."""
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.unlink(missing_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(data, handle, indent=2, sort_keys=True)
            handle.write("\n")
        tmp.replace(path)


def apply_stack_environment(state_dir: Path) -> bool:
    """Default ``LODE_*`` variables to those of the embedded stack in ``state_dir``.

    Variables already set win, so the same commands work against an external
    NATS and Postgres. Returns True if a stack environment was found.
    """
    state = StateDir(state_dir)
    env = state.read_json(state.env_file)
    for key, value in env.items():
        os.environ.setdefault(key, str(value))
    return bool(env)
