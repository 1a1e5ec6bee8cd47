"""How Globus's answers become the transfer errors and item outcomes of ``base.py``.

Globus reports trouble in three places, each mapped here:

* An HTTP error from the Transfer API (``TransferAPIError``) or from Globus Auth while the stored
  refresh token is exchanged (``AuthAPIError``): consent or login trouble becomes
  ``ConsentRequired``, 5xx and 429 ``TransferUnavailable``, 404 on a task ``UnknownTask``, any
  other 4xx ``TransferRefused`` with Globus's own code and message.
* No answer at all (``NetworkError``: connection refused, timeout): ``TransferUnavailable``.
* An event code on the task itself (``fatal_error.code``, ``nice_status``, a skipped error's
  ``error_code``); ``PERMANENT_CODES`` says which of them no retry can cure.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Final

from globus_sdk import AuthAPIError, GlobusAPIError, NetworkError

from lodestream.platform_adapters.transfers.base import (
    ConsentRequired,
    TransferError,
    TransferRefused,
    TransferUnavailable,
    UnknownTask,
)

# Event codes (Globus's task event inventory) that mean the path itself is wrong for this
# transfer: the same submission would meet them again. Connection, endpoint and timeout codes
# are left out on purpose: they clear by themselves, and Globus retries them inside the task.
PERMANENT_CODES: Final = frozenset({
    "FILE_NOT_FOUND",
    "PERMISSION_DENIED",
    "AMBIGUOUS_PATH",
    "NO_SPACE_LEFT",
    "QUOTA_EXCEEDED",
    "INVALID_PATH_NAME",
    "NOT_A_DIRECTORY",
    "IS_A_DIRECTORY",
    "NOT_A_FILE",
    "IS_A_FILE",
    "INVALID_SYMLINK",
    "NOT_A_SYMLINK",
    "CANCELED",  # someone cancelled the task in Globus: submitting again would overrule them
})  # fmt: skip

# The collection id inside a data_access scope, as Globus names it in required_scopes.
_DATA_ACCESS_SCOPE: Final = re.compile(r"/scopes/([0-9a-fA-F-]{36})/data_access")


def login_command(site_dir: Path, collections: Iterable[str] = ()) -> str:
    """The command a person runs to give this site fresh Globus tokens."""
    flags = "".join(f" --collection {c}" for c in collections)
    return f"lode site globus-login {site_dir}{flags}"


def collections_in_scopes(scopes: Iterable[str]) -> list[str]:
    """Collection ids whose data_access consent the scopes ask for, in order, once each."""
    found: list[str] = []
    for scope in scopes:
        for match in _DATA_ACCESS_SCOPE.finditer(scope):
            if match.group(1).lower() not in found:
                found.append(match.group(1).lower())
    return found


def globus_words(exc: GlobusAPIError) -> str:
    """Globus's own code and message, for logs and refusals."""
    message = exc.message or exc.http_reason
    return (
        f"{exc.http_status} {exc.code}: {message}" if exc.code else f"{exc.http_status}: {message}"
    )


def _consent_error(exc: GlobusAPIError, site_dir: Path, what: str) -> ConsentRequired:
    scopes = exc.info.consent_required.required_scopes
    collections = collections_in_scopes(scopes)
    need = f"collection{'s' if len(collections) > 1 else ''} {', '.join(collections)}"
    subject = need if collections else "this site's Globus login"
    session = exc.info.authorization_parameters.session_message
    return ConsentRequired(
        f"Globus needs consent before it can {what} ({globus_words(exc)}"
        + (f"; {session}" if session and session != exc.message else "")
        + (f"; required scopes: {' '.join(scopes)}" if scopes else "")
        + f") for {subject}: run `{login_command(site_dir, collections)}`, naming every "
        "collection this site stages through, because a new login replaces the stored tokens"
    )


def _auth_error(exc: AuthAPIError, site_dir: Path, what: str) -> TransferError:
    """Globus Auth answered the refresh of the stored token: refused, or Auth is down."""
    if exc.http_status >= 500 or exc.http_status == 429:
        return TransferUnavailable(
            f"Globus Auth failed while trying to {what}: {globus_words(exc)}"
        )
    detail = exc.raw_json.get("error") if exc.raw_json else None
    return ConsentRequired(
        f"Globus Auth refused this site's stored tokens while trying to {what} "
        f"({detail or globus_words(exc)}): run `{login_command(site_dir)}`"
    )


def translate(exc: GlobusAPIError | NetworkError, *, site_dir: Path, what: str) -> TransferError:
    """The transfer error for a Globus SDK exception met while trying to do ``what``."""
    if isinstance(exc, NetworkError):
        return TransferUnavailable(f"Globus did not answer while trying to {what}: {exc}")
    if isinstance(exc, AuthAPIError):
        return _auth_error(exc, site_dir, what)
    if exc.info.consent_required or exc.info.authorization_parameters:
        return _consent_error(exc, site_dir, what)
    if exc.http_status == 401 or (exc.code and "ActivationRequired" in exc.code):
        return ConsentRequired(
            f"Globus refused to {what} ({globus_words(exc)}): the login or the endpoint's "
            f"activation has expired; run `{login_command(site_dir)}`"
        )
    if exc.http_status >= 500 or exc.http_status == 429:
        return TransferUnavailable(f"Globus could not {what} now: {globus_words(exc)}")
    return TransferRefused(f"Globus refused to {what}: {globus_words(exc)}")


@contextmanager
def mapped_errors(site_dir: Path, what: str, *, task_id: str | None = None) -> Iterator[None]:
    """Run Globus calls, raising the transfer errors of ``base.py`` in place of the SDK's.

    With ``task_id``, a 404 means Globus does not know the task (never ours, or forgotten).
    """
    try:
        yield
    except (GlobusAPIError, NetworkError) as exc:
        if task_id is not None and isinstance(exc, GlobusAPIError) and exc.http_status == 404:
            raise UnknownTask(f"Globus does not know task {task_id}: {globus_words(exc)}") from exc
        raise translate(exc, site_dir=site_dir, what=what) from exc
