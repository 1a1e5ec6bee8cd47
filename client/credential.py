"""The user's monitoring credential: an nkey that lets :func:`lodestream.client.watch.watch`
read the user's own sites' events straight from NATS.

The seed is made here and never leaves this machine; the API is told only the public key
(``PUT /users/me/monitoring-key``) and the control plane renders it into nats-server's
authorization (:mod:`lodestream.infra.nats.monitor`). ``lode up`` writes one for its local
user into ``<state dir>/monitor.json``; ``lode watch`` makes and registers one in
``~/.config/lodestream/monitor.json`` the first time it needs one. Registering a new key
replaces the old one; revoking the user's tokens revokes it too.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from lodestream.client.errors import WatchError
from lodestream.infra.nats.auth import new_user_seed, user_public_key

USER_MONITOR_FILE = Path("~/.config/lodestream/monitor.json").expanduser()


@dataclass(frozen=True, slots=True)
class MonitorCredential:
    """Where NATS listens for watchers (wss://), its CA, and the user's nkey seed."""

    nats_url: str
    seed: str
    ca_file: Path | None = None

    @property
    def public_key(self) -> str:
        return user_public_key(self.seed.encode())

    @classmethod
    def new(cls, nats_url: str, ca_file: Path | None = None) -> MonitorCredential:
        return cls(nats_url=nats_url, seed=new_user_seed().decode(), ca_file=ca_file)

    @classmethod
    def load(cls, path: Path) -> MonitorCredential:
        try:
            stored = json.loads(path.read_text())
            ca = stored.get("ca_file")
            return cls(
                nats_url=stored["nats_url"], seed=stored["seed"], ca_file=Path(ca) if ca else None
            )
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise WatchError(f"cannot read the monitoring credential {path}: {exc}") from exc

    def save(self, path: Path) -> Path:
        """Write the credential readable by its owner only (it holds the seed)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as handle:
            json.dump(
                {"nats_url": self.nats_url, "seed": self.seed,
                 "ca_file": str(self.ca_file) if self.ca_file else None},
                handle, indent=2,
            )  # fmt: skip
        return path


def find_credential(state_dir: Path | None = None) -> Path | None:
    """The first credential file of ``./.lode/monitor.json`` (``lode up``) and the user's."""
    for path in ((state_dir or Path(".lode")) / "monitor.json", USER_MONITOR_FILE):
        if path.exists():
            return path
    return None
