"""Errors of the client SDK.

LodeClientError
├── NotConfigured     no API URL or token could be found
└── ApiError          the API answered with an error (status, code, message)
    └── Unreachable   no answer at all (connection refused, timeout)
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
    def __init__(self, url: str, reason: str) -> None:
        super().__init__(0, "unreachable", f"cannot reach {url}: {reason}")
