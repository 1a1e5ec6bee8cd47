"""Where the client finds its API URL and token.

Precedence: explicit arguments, then ``LODE_API_URL``/``LODE_TOKEN``, then
``./.lode/client.json`` (written by ``lode up``), then
``~/.config/lodestream/client.json`` (written by ``lode login``).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from lodestream.client.errors import NotConfigured

USER_CONFIG = Path("~/.config/lodestream/client.json").expanduser()


@dataclass(frozen=True, slots=True)
class ClientConfig:
    api_url: str
    token: str
    origin: str = "argument"  # where the token came from: an argument, LODE_TOKEN, a file


def candidate_files(state_dir: Path | None = None) -> list[Path]:
    return [(state_dir or Path(".lode")) / "client.json", USER_CONFIG]


def resolve(
    api_url: str | None = None, token: str | None = None, state_dir: Path | None = None
) -> ClientConfig:
    """Return the first complete configuration found, or raise NotConfigured."""
    origin = "argument" if token else "LODE_TOKEN"
    api_url = api_url or os.environ.get("LODE_API_URL")
    token = token or os.environ.get("LODE_TOKEN")
    for path in candidate_files(state_dir):
        if api_url and token:
            break
        if path.exists():
            stored = json.loads(path.read_text())
            api_url = api_url or stored.get("api_url")
            if not token and stored.get("token"):
                token, origin = stored["token"], str(path)
    if not api_url or not token:
        raise NotConfigured(
            "no API URL/token: start a stack with `lode up`, run `lode login`, "
            "or set LODE_API_URL and LODE_TOKEN"
        )
    return ClientConfig(api_url=api_url.rstrip("/"), token=token, origin=origin)


def save_user_config(config: ClientConfig) -> Path:
    USER_CONFIG.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(USER_CONFIG, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        json.dump({"api_url": config.api_url, "token": config.token}, handle, indent=2)
    return USER_CONFIG
