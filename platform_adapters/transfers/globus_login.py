"""The site's Globus login: a native-app login whose refresh token is kept in the site directory.

``lode site globus-login <site dir>`` runs ``login``: it prints Globus Auth's URL, reads back the
code the person pastes, and stores the tokens through globus-sdk's ``JSONTokenStorage`` in
``<site dir>/globus-tokens.json`` (mode 0600: a refresh token lets anyone holding it move this
user's data). The backend then builds its ``TransferClient`` from that file with a
``RefreshTokenAuthorizer``, which fetches new access tokens by itself and writes them back.

Globus identifies the program that asks for a login by a *native app* client id, registered at
https://app.globus.org/settings/developers. lodestream has no registered app of its own:
``PLACEHOLDER_CLIENT_ID`` is the nil UUID, refused by ``check_client_id``, and each operator
registers a native app and gives its id (``--client-id`` or ``LODE_GLOBUS_CLIENT_ID``).

The scopes asked for are Transfer's, with an optional ``data_access`` dependency for each
collection named: Globus Connect Server v5 mapped collections need that consent before Transfer
may touch them on the user's behalf (other collection kinds refuse the scope: name only mapped
ones).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Final

from globus_sdk import (
    NativeAppAuthClient,
    OAuthRefreshTokenResponse,
    RefreshTokenAuthorizer,
    TransferClient,
)
from globus_sdk.scopes import GCSCollectionScopes, Scope, TransferScopes
from globus_sdk.token_storage import JSONTokenStorage, TokenStorageData
from globus_sdk.transport import RetryConfig

from lodestream.platform_adapters.transfers.base import ConsentRequired
from lodestream.platform_adapters.transfers.globus_errors import login_command

TOKEN_FILE: Final = "globus-tokens.json"  # noqa: S105 - a file name
TOKEN_MODE: Final = 0o600
# Not a registered app: the nil UUID, so that a site nobody configured fails with a clear
# message here instead of an "unknown client" page at Globus.
PLACEHOLDER_CLIENT_ID: Final = "00000000-0000-0000-0000-000000000000"
CLIENT_ID_ENV: Final = "LODE_GLOBUS_CLIENT_ID"
APP_NAME: Final = "lodestream"
TRANSFER_SERVER: Final = TransferScopes.resource_server


def token_path(site_dir: Path) -> Path:
    return site_dir / TOKEN_FILE


def check_client_id(client_id: str) -> str:
    """The native app's client id, normalised; ``ValueError`` for a non-UUID or the placeholder."""
    try:
        normalised = str(uuid.UUID(client_id))
    except ValueError:
        raise ValueError(f"Globus client id {client_id!r} is not a UUID") from None
    if normalised == PLACEHOLDER_CLIENT_ID:
        raise ValueError(
            "no Globus client id: register a native app at "
            "https://app.globus.org/settings/developers and pass its client id with --client-id "
            f"(or set {CLIENT_ID_ENV})"
        )
    return normalised


def check_collection_ids(collections: Sequence[str]) -> list[str]:
    """The collection ids, normalised, each once; ``ValueError`` naming one that is no UUID."""
    ids: list[str] = []
    for collection in collections:
        try:
            ids.append(str(uuid.UUID(collection)))
        except ValueError:
            raise ValueError(f"collection {collection!r} is not a collection id (a UUID)") from None
    return list(dict.fromkeys(ids))


def login_scope(collections: Sequence[str]) -> Scope:
    """Transfer's scope, with optional data_access consent for each mapped collection named."""
    deps = [
        GCSCollectionScopes(c).data_access.with_optional(True)
        for c in check_collection_ids(collections)
    ]
    return TransferScopes.all.with_dependencies(deps)


def open_storage(site_dir: Path) -> JSONTokenStorage:
    """The site's token file; one left readable by others (copied, restored) is closed first."""
    path = token_path(site_dir)
    if path.exists() and path.stat().st_mode & 0o777 != TOKEN_MODE:
        path.chmod(TOKEN_MODE)
    return JSONTokenStorage(path)


def stored_tokens(site_dir: Path) -> TokenStorageData | None:
    """The stored Transfer tokens, if a login left a refresh token."""
    data = open_storage(site_dir).get_token_data(TRANSFER_SERVER)
    return data if data is not None and data.refresh_token else None


def login(
    site_dir: Path,
    *,
    client_id: str,
    collections: Sequence[str],
    ask_code: Callable[[str], str],
) -> TokenStorageData:
    """Run the native-app login: ``ask_code(url)`` shows the URL and returns the pasted code."""
    auth = NativeAppAuthClient(check_client_id(client_id), app_name=APP_NAME)
    auth.oauth2_start_flow(
        login_scope(collections),
        refresh_tokens=True,
        prefill_named_grant=f"lodestream site {site_dir.absolute().name}",
    )
    code = ask_code(auth.oauth2_get_authorize_url()).strip()
    if not code:
        raise ValueError("no authorization code was given")
    tokens = auth.oauth2_exchange_code_for_tokens(code)
    storage = open_storage(site_dir)
    storage.store_token_response(tokens)
    token_path(site_dir).chmod(TOKEN_MODE)  # the storage's umask only covers a new file
    stored = stored_tokens(site_dir)
    if stored is None:
        raise ConsentRequired("Globus Auth returned no Transfer refresh token; run the login again")
    return stored


def transfer_client(site_dir: Path, *, client_id: str) -> TransferClient:
    """A TransferClient on the stored tokens, refreshing its access token as it expires.

    The SDK's own retries are kept short (2, at most 2 s apart): the site's transfer module
    retries a batch itself, and must not sit for a minute inside one call.
    """
    stored = stored_tokens(site_dir)
    if stored is None or stored.refresh_token is None:
        raise ConsentRequired(
            f"no Globus login for this site (no refresh token in {token_path(site_dir)}): "
            f"run `{login_command(site_dir)}`"
        )
    storage = open_storage(site_dir)
    authorizer = RefreshTokenAuthorizer(
        stored.refresh_token,
        NativeAppAuthClient(check_client_id(client_id), app_name=APP_NAME),
        access_token=stored.access_token,
        expires_at=stored.expires_at_seconds,
    )
    authorizer.on_refresh = _keeper(storage, authorizer)
    return TransferClient(
        authorizer=authorizer,
        app_name=APP_NAME,
        retry_config=RetryConfig(max_retries=2, max_sleep=2),
    )


def _keeper(
    storage: JSONTokenStorage, authorizer: RefreshTokenAuthorizer
) -> Callable[[OAuthRefreshTokenResponse], None]:
    """Store each refreshed token, keeping the refresh token when Globus does not rotate it.

    A refresh answer without a refresh token would otherwise leave ``refresh_token: null`` both
    in the authorizer (it copies the field, present or not) and in the file, and the next
    expiry, or the next start, would find the site logged out.
    """
    current = [authorizer.refresh_token]

    def keep(response: OAuthRefreshTokenResponse) -> None:
        for server, token in response.by_resource_server.items():
            refresh_token = token.get("refresh_token") or current[0]
            current[0] = authorizer.refresh_token = refresh_token
            before = storage.get_token_data(server)
            storage.store_token_data_by_resource_server({
                server: TokenStorageData(
                    resource_server=server,
                    identity_id=before.identity_id if before else None,
                    scope=token["scope"],
                    access_token=token["access_token"],
                    refresh_token=refresh_token,
                    expires_at_seconds=token["expires_at_seconds"],
                    token_type=token.get("token_type"),
                )
            })  # fmt: skip
        Path(storage.filepath).chmod(TOKEN_MODE)

    return keep
