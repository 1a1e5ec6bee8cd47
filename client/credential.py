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
from typing import TYPE_CHECKING

from lodestream.client.errors import WatchError
from lodestream.schemas.nkey import new_user_seed, user_public_key

if TYPE_CHECKING:
    from lodestream.client.sdk import LodeClient

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


def ensure_credential(
    client: LodeClient,
    path: Path,
    nats_url: str | None,
    ca_file: Path | None,
    *,
    renew: bool = False,
) -> tuple[MonitorCredential, bool]:
    """The credential at ``path`` if the API holds its key; else a new one, registered and
    saved there. True with it when it is new (the control plane applies it within seconds).

    ``nats_url`` (wss://) and ``ca_file`` are needed only to make a new one.
    """
    registered = client.monitoring_key().get("public_key")
    if path.exists() and not renew:
        credential = MonitorCredential.load(path)
        if credential.public_key == registered:
            return credential, False
        nats_url, ca_file = nats_url or credential.nats_url, ca_file or credential.ca_file
    if not nats_url:
        raise WatchError(
            "no monitoring credential yet, and no NATS address to make one for: pass "
            "--nats-url wss://… (and --ca-file if its certificate is not publicly trusted)"
        )
    credential = MonitorCredential.new(nats_url, ca_file)
    client.register_monitoring_key(credential.public_key)
    credential.save(path)
    return credential, True
