"""Errors of the client SDK.

LodeClientError
├── NotConfigured     no API URL or token could be found
├── ApiError          the API answered with an error (status, code, message)
│   └── Unreachable   no answer at all (connection refused, timeout)
├── JobIdUnresolved   part of a job id names none of your jobs, or several (``matches``)
└── WatchError        a live watch cannot start or go on (bad filter, since past the end of
    │                 the log, no or revoked monitoring credential)
    ├── CredentialRevoked  the server refused or dropped the monitoring credential
    └── WatchGap      the log no longer holds where a site's watch must start

WatchNotice is not an error: what a watch tells its caller while it goes on (it fell
behind and resumed, it refused an event).
"""

from __future__ import annotations

from typing import Any


class LodeClientError(Exception):
    """Base of client errors."""


class NotConfigured(LodeClientError):
    """Neither flags, environment nor a client file gave an API URL and token."""


class ApiError(LodeClientError):
    def __init__(self, status: int, code: str, message: str, details: Any = None) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message
        self.details = details


class Unreachable(ApiError):
    """No answer from the API at all; ``status`` is 0. The message names the URL and what to
    do (a local stack that is not running is the usual cause)."""

    def __init__(self, url: str, reason: str, origin: str = "") -> None:
        source = f" (the URL is from {origin})" if origin and origin != "argument" else ""
        super().__init__(
            0,
            "unreachable",
            f"cannot reach the API at {url}: {reason}. Is the stack running? `lode up` "
            f"starts a local one{source}",
        )
        self.url = url
        Exception.__init__(self, self.message)  # no "0 unreachable:" before what to do


class JobIdUnresolved(LodeClientError):
    """What a person typed for a job id names no job of theirs, or several: ``matches``
    holds the jobs (as ``GET /jobs`` lists them) when it is ambiguous."""

    def __init__(self, text: str, matches: list[dict[str, Any]], message: str) -> None:
        super().__init__(message)
        self.text = text
        self.matches = matches


class WatchError(LodeClientError):
    """A watch cannot start or cannot go on; the message says what to do."""


class CredentialRevoked(WatchError):
    """nats-server refused the monitoring credential (revoked, or never issued)."""


class WatchGap(WatchError):
    """A site's watch would have to skip events the log no longer holds; it stops instead."""


class WatchNotice(UserWarning):
    """Something a watch did on its own and went on: resumed after a gap, refused an event."""
