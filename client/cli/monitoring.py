"""The monitoring credential the commands that read the log directly share (``lode watch``,
``lode analytics``): found or made and registered, with the user's sites and the log's end."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import typer

from lodestream.client.cli.common import api_client, print_error
from lodestream.client.credential import USER_MONITOR_FILE, MonitorCredential, ensure_credential
from lodestream.client.errors import LodeClientError

CREDENTIAL_OPTION = typer.Option(
    None,
    "--credential",
    help="Monitoring credential file (default: .lode/monitor.json, "
    "then ~/.config/lodestream/monitor.json).",
)
NATS_URL_OPTION = typer.Option(None, help="wss:// URL of NATS, to make a credential.")
CA_FILE_OPTION = typer.Option(None, help="CA of the NATS TLS listener.")


@dataclass(frozen=True, slots=True)
class MonitorAccess:
    credential: MonitorCredential
    fresh: bool  # registered just now: the control plane applies it within seconds
    sites: list[str]  # the user's sites the credential may read
    log_end: int  # the log's last sequence when asked


def monitor_access(
    state_dir: Path,
    credential_file: Path | None,
    nats_url: str | None,
    ca_file: Path | None,
    *,
    renew: bool = False,
) -> MonitorAccess:
    """The user's credential (made and registered if needed), sites and log end, from the
    API; a clear error and exit 1 if any of it cannot be had."""
    defaults = stack_defaults(state_dir)
    with api_client(state_dir) as client:
        path = credential_file or default_credential_path(state_dir)
        try:
            credential, fresh = ensure_credential(
                client, path, nats_url or defaults.get("websocket_url"),
                ca_file or (Path(defaults["ca_file"]) if "ca_file" in defaults else None),
                renew=renew,
            )  # fmt: skip
            info = client.monitoring_key()
        except LodeClientError as exc:
            print_error(exc)
            raise typer.Exit(1) from exc
    return MonitorAccess(credential, fresh, list(info["sites"]), int(info["log_end"]))


def check_sites(wanted: Sequence[str], mine: Sequence[str]) -> list[str]:
    """``wanted`` (default: all of ``mine``); exit 2 naming any that is not the user's."""
    sites = list(wanted) or list(mine)
    unknown = sorted(set(sites) - set(mine))
    if unknown:
        print_error(f"not one of your sites: {', '.join(unknown)} (yours: "
                    f"{', '.join(mine) or 'none'})")  # fmt: skip
        raise typer.Exit(2)
    return sites


def default_credential_path(state_dir: Path) -> Path:
    # lode up's credential sits beside its client.json; otherwise the user's own.
    local = state_dir / "monitor.json"
    return local if (state_dir / "client.json").exists() else USER_MONITOR_FILE


def stack_defaults(state_dir: Path) -> dict[str, str]:
    path = state_dir / "sites.json"
    try:
        stored = json.loads(path.read_text()) if path.exists() else {}
    except (OSError, ValueError):
        stored = {}
    return {k: str(v) for k, v in stored.items()}
