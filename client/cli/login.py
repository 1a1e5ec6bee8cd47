"""``lode login``: remember an API URL and token for this user, and the live-watch credential.

The token is checked against the API before anything is written (a typo is told at once,
not at the next command). It goes to ``~/.config/lodestream/client.json`` (mode 0600), which
every ``lode`` command and ``LodeClient.from_config`` read when neither flags nor
``LODE_API_URL``/``LODE_TOKEN`` say otherwise. With ``--nats-url`` (the control plane's
``wss://`` address) it also makes this user's monitoring credential for ``lode watch`` and
registers its public key; the seed never leaves this machine
(``~/.config/lodestream/monitor.json``, mode 0600).
"""

from __future__ import annotations

from pathlib import Path

import typer

from lodestream.client.cli.common import console, print_error
from lodestream.client.config import ClientConfig, save_user_config
from lodestream.client.credential import USER_MONITOR_FILE, ensure_credential
from lodestream.client.errors import LodeClientError
from lodestream.client.sdk import LodeClient


def login(
    api_url: str = typer.Option(..., "--api-url", help="The API, e.g. https://lode.example:8400"),
    token: str = typer.Option(
        ..., prompt=True, hide_input=True, envvar="LODE_TOKEN", help="Your API token."
    ),
    nats_url: str | None = typer.Option(
        None, help="wss:// URL of NATS: also make the monitoring credential for `lode watch`."
    ),
    ca_file: Path | None = typer.Option(
        None, help="CA certificate of that NATS, if it is not publicly trusted."
    ),
) -> None:
    """Check the token with the API and remember it (and, with --nats-url, a watch credential)."""
    config = ClientConfig(api_url=api_url.rstrip("/"), token=token.strip())
    try:
        with LodeClient(config) as client:
            sites = client.list_sites()  # any authenticated read proves the token
            if nats_url is not None:
                _, fresh = ensure_credential(client, USER_MONITOR_FILE, nats_url, ca_file)
                what = "made and registered" if fresh else "already registered"
                console.print(f"monitoring credential {what}: {USER_MONITOR_FILE}")
    except LodeClientError as exc:
        print_error(f"login refused: {exc}")
        raise typer.Exit(1) from exc
    path = save_user_config(config)
    console.print(f"logged in to {config.api_url} ({len(sites)} site(s)); saved to {path}")
