"""The site's Globus login and its stored tokens, with Globus Auth answered by ``responses``."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
import responses
from globus_sdk import AuthLoginClient, TransferClient
from globus_sdk.testing import RegisteredResponse, load_response
from globus_sdk.token_storage import JSONTokenStorage, TokenStorageData
from typer.testing import CliRunner

from lodestream.client.cli.main import app
from lodestream.platform_adapters.transfers.base import (
    ConsentRequired,
    TransferBatch,
    TransferItem,
)
from lodestream.platform_adapters.transfers.globus import GlobusBackend
from lodestream.platform_adapters.transfers.globus_login import (
    PLACEHOLDER_CLIENT_ID,
    TOKEN_MODE,
    check_client_id,
    login,
    login_scope,
    open_storage,
    stored_tokens,
    token_path,
    transfer_client,
)
from tests.support.globus_answers import sdk_answer, sdk_task_doc

CLIENT = "7d4f1c3a-2b5e-4f60-9a1b-3c2d4e5f6a7b"
MAPPED = "6c54cade-bde5-45c1-bdea-f4bd71dba2cc"
SITE = "0d4a7c5e-1b2f-4c3d-8e9f-a0b1c2d3e4f5"
TASK = "42d3b1c6-8f1e-11ef-a1f2-0242ac120002"
TRANSFER_ALL = "urn:globus:auth:scope:transfer.api.globus.org:all"


@pytest.fixture(autouse=True)
def mocked_http() -> Iterator[None]:
    responses.start()
    yield
    responses.stop()
    responses.reset()


@pytest.fixture
def site_dir(tmp_path: Path) -> Path:
    (tmp_path / "settings.yml").write_text("site: polaris\n")
    return tmp_path


def token_grant(**extra: Any) -> None:
    """The SDK's recorded grant of Transfer tokens, with this test's access token."""
    fields = {"access_token": "at-1", **extra}
    sdk_answer(AuthLoginClient.oauth2_exchange_code_for_tokens, **fields)


def form(request_body: object) -> dict[str, list[str]]:
    assert isinstance(request_body, str)
    return parse_qs(request_body)


def test_the_placeholder_client_id_is_refused_with_what_to_do() -> None:
    with pytest.raises(ValueError, match=r"register a native app.*--client-id"):
        check_client_id(PLACEHOLDER_CLIENT_ID)
    with pytest.raises(ValueError, match="not a UUID"):
        check_client_id("lodestream")
    assert check_client_id(CLIENT.upper()) == CLIENT


def test_the_scope_asks_data_access_for_each_mapped_collection_once() -> None:
    assert str(login_scope([])) == TRANSFER_ALL
    data_access = f"*https://auth.globus.org/scopes/{MAPPED}/data_access"
    assert str(login_scope([MAPPED, MAPPED.upper()])) == f"{TRANSFER_ALL}[{data_access}]"


def test_login_stores_the_refresh_token_readable_by_the_owner_only(site_dir: Path) -> None:
    token_grant(refresh_token="rt-1")
    shown: list[str] = []

    def ask_code(url: str) -> str:
        shown.append(url)
        return " code-123 \n"

    stored = login(site_dir, client_id=CLIENT, collections=[MAPPED], ask_code=ask_code)

    query = parse_qs(urlsplit(shown[0]).query)
    assert query["client_id"] == [CLIENT]
    assert query["access_type"] == ["offline"]  # offline: Globus issues a refresh token
    assert MAPPED in query["scope"][0]
    exchange = form(responses.calls[0].request.body)
    assert exchange["code"] == ["code-123"]
    assert exchange["grant_type"] == ["authorization_code"]
    assert "code_verifier" in exchange  # PKCE: a native app has no secret

    assert token_path(site_dir).stat().st_mode & 0o777 == TOKEN_MODE
    assert stored.refresh_token == "rt-1"
    again = stored_tokens(site_dir)
    assert again is not None
    assert (again.refresh_token, again.access_token) == ("rt-1", "at-1")


def test_an_empty_code_stores_nothing(site_dir: Path) -> None:
    with pytest.raises(ValueError, match="no authorization code"):
        login(site_dir, client_id=CLIENT, collections=[], ask_code=lambda _url: "  ")
    assert not token_path(site_dir).exists()
    assert len(responses.calls) == 0


def test_a_token_file_left_open_to_others_is_closed(site_dir: Path) -> None:
    token_path(site_dir).write_text(
        '{"data": {}, "format_version": "2.0", "globus-sdk.version": "4.9.1"}'
    )
    token_path(site_dir).chmod(0o644)
    open_storage(site_dir)
    assert token_path(site_dir).stat().st_mode & 0o777 == TOKEN_MODE


def test_no_login_means_consent_is_required(site_dir: Path) -> None:
    with pytest.raises(ConsentRequired, match=f"lode site globus-login {site_dir}"):
        transfer_client(site_dir, client_id=CLIENT)


def store(site_dir: Path, *, expires_at: int, refresh_token: str | None = "rt-1") -> None:
    JSONTokenStorage(token_path(site_dir)).store_token_data_by_resource_server({
        "transfer.api.globus.org": TokenStorageData(
            resource_server="transfer.api.globus.org",
            identity_id="ae341a98-d274-11e5-b888-dbae3a8ba545",
            scope=TRANSFER_ALL,
            access_token="at-1",
            refresh_token=refresh_token,
            expires_at_seconds=expires_at,
            token_type="Bearer",
        )
    })  # fmt: skip


def task_found() -> None:
    doc = sdk_task_doc(TASK, "ACTIVE")
    RegisteredResponse(service="transfer", path=f"/v0.10/task/{TASK}", json=doc).add()


def test_a_live_access_token_is_used_as_stored(site_dir: Path) -> None:
    store(site_dir, expires_at=int(time.time()) + 3600)
    task_found()
    transfer_client(site_dir, client_id=CLIENT).get_task(TASK)
    assert len(responses.calls) == 1
    assert responses.calls[0].request.headers["Authorization"] == "Bearer at-1"


def test_an_expired_access_token_is_refreshed_and_the_refresh_token_kept(
    site_dir: Path,
) -> None:
    store(site_dir, expires_at=0)
    token_grant(access_token="at-2")  # Globus did not rotate the refresh token
    task_found()
    client = transfer_client(site_dir, client_id=CLIENT)
    assert isinstance(client, TransferClient)
    client.get_task(TASK)

    refresh = form(responses.calls[0].request.body)
    assert refresh["grant_type"] == ["refresh_token"]
    assert refresh["refresh_token"] == ["rt-1"]
    assert refresh["client_id"] == [CLIENT]
    assert responses.calls[1].request.headers["Authorization"] == "Bearer at-2"
    kept = stored_tokens(site_dir)
    assert kept is not None
    assert (kept.access_token, kept.refresh_token) == ("at-2", "rt-1")
    assert kept.identity_id == "ae341a98-d274-11e5-b888-dbae3a8ba545"
    assert token_path(site_dir).stat().st_mode & 0o777 == TOKEN_MODE


def test_a_refused_refresh_token_asks_for_a_new_login(site_dir: Path) -> None:
    store(site_dir, expires_at=0)
    load_response("auth.oauth2_exchange_code_for_tokens", case="invalid_grant")
    backend = GlobusBackend.from_site_tokens(site_dir, client_id=CLIENT, site_collection=SITE)
    item = TransferItem("item-a", "/a", str(site_dir / "data" / "a"))
    batch = TransferBatch("archive", f"globus://{MAPPED}/", "in", (item,), "k-1")
    with pytest.raises(ConsentRequired, match=r"invalid_grant.*lode site globus-login"):
        backend.submit(batch)
    assert len(responses.calls) == 1  # the refresh; the submission was never sent


def test_the_cli_prints_the_url_reads_the_code_and_stores_the_tokens(site_dir: Path) -> None:
    token_grant(refresh_token="rt-1")
    result = CliRunner().invoke(
        app,
        ["site", "globus-login", str(site_dir), "--client-id", CLIENT, "--collection", MAPPED],
        input="code-123\n",
    )
    assert result.exit_code == 0, result.output
    assert "https://auth.globus.org/v2/oauth2/authorize?" in result.output
    assert f"stored in {token_path(site_dir)}" in result.output
    stored = stored_tokens(site_dir)
    assert stored is not None
    assert stored.refresh_token == "rt-1"


@pytest.mark.parametrize(
    ("args", "words"),
    [
        ([], "register a native app"),
        (["--client-id", CLIENT, "--collection", "archive"], "is not a collection id"),
    ],
)
def test_the_cli_refuses_bad_input_before_any_request(
    site_dir: Path, args: list[str], words: str
) -> None:
    result = CliRunner().invoke(
        app, ["site", "globus-login", str(site_dir), *args], env={"LODE_GLOBUS_CLIENT_ID": ""}
    )
    assert result.exit_code == 2
    assert words in result.output
    assert len(responses.calls) == 0


def test_the_cli_wants_a_site_directory(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["site", "globus-login", str(tmp_path), "--client-id", CLIENT])
    assert result.exit_code == 2
    assert "not a site directory" in result.output
