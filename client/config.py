"""Where the client finds its API URL and token.

Each of the two is taken from the first of these that has it:

1. explicit arguments (``LodeClient.from_config(api_url=…, token=…)``, ``--api-url``),
2. the environment, ``LODE_API_URL`` and ``LODE_TOKEN``,
3. ``<state dir>/client.json``, written by ``lode up`` for its local user; the state dir is
   ``--state-dir``, else ``LODE_STATE_DIR``, else ``./.lode``,
4. ``~/.config/lodestream/client.json``, written by ``lode login``.

So a ``./.lode/client.json`` in the working directory wins over ``lode login``'s file:
``lode whoami`` says which source each came from and which others held a token unused.
The CLI and :meth:`LodeClient.from_config` read the same places in the same order.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lodestream.client.errors import NotConfigured

USER_CONFIG = Path("~/.config/lodestream/client.json").expanduser()
DEFAULT_STATE_DIR = Path(".lode")


@dataclass(frozen=True, slots=True)
class ClientConfig:
    api_url: str
    token: str
    origin: str = "argument"  # where the token came from: an argument, LODE_TOKEN, a file
    url_origin: str = "argument"  # where the API URL came from, likewise
    unused: tuple[str, ...] = ()  # later sources that held a token too, shadowed


def state_dir_of(state_dir: Path | None = None) -> Path:
    """``state_dir``, else ``LODE_STATE_DIR``, else ``./.lode``."""
    return state_dir or Path(os.environ.get("LODE_STATE_DIR") or DEFAULT_STATE_DIR)


def candidate_files(state_dir: Path | None = None) -> list[Path]:
    return [state_dir_of(state_dir) / "client.json", USER_CONFIG]


def resolve(
    api_url: str | None = None, token: str | None = None, state_dir: Path | None = None
) -> ClientConfig:
    """Return the configuration the sources give (see the module's docstring), or raise
    NotConfigured when none gives a URL or a token."""
    sources: list[tuple[str, str, str | None, str | None]] = [
        ("argument", "argument", api_url, token),
        ("LODE_API_URL", "LODE_TOKEN", os.environ.get("LODE_API_URL"),
         os.environ.get("LODE_TOKEN")),
    ]  # fmt: skip
    for path in candidate_files(state_dir):
        if path.exists():
            stored = json.loads(path.read_text())
            sources.append((str(path), str(path), stored.get("api_url"), stored.get("token")))
    url = next(((where, u) for where, _, u, _ in sources if u), None)
    key = next(((where, t) for _, where, _, t in sources if t), None)
    if url is None or key is None:
        raise NotConfigured(
            "no API URL/token: start a stack with `lode up`, run `lode login`, "
            "or set LODE_API_URL and LODE_TOKEN"
        )
    unused = tuple(where for _, where, _, t in sources if t and where != key[0])
    return ClientConfig(api_url=url[1].rstrip("/"), token=key[1], origin=key[0],
                        url_origin=url[0], unused=unused)  # fmt: skip


def save_user_config(config: ClientConfig) -> Path:
    USER_CONFIG.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(USER_CONFIG, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        json.dump({"api_url": config.api_url, "token": config.token}, handle, indent=2)
    return USER_CONFIG


def http_options(config: ClientConfig, timeout_s: float) -> dict[str, Any]:
    """What the sync and the async client give httpx: the API's URL, the token, a timeout."""
    return {
        "base_url": config.api_url,
        "headers": {"Authorization": f"Bearer {config.token}"},
        "timeout": timeout_s,
    }
