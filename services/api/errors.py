"""Errors of the API, and the one place that turns errors into HTTP responses.

::

    ApiError                      code         status
    ├── InvalidInput              invalid      422  bad body, query or reference; nothing appended
    ├── Unauthorized              unauthorized 401  missing, unknown or revoked token
    ├── NotFound                  not_found    404  absent, or owned by someone else
    ├── Conflict                  conflict     409  the id or name is taken
    ├── TooManyJobs               too_large    413  more jobs than one request may carry
    ├── WaitTimedOut              timeout      504  appended, but not yet projected
    └── Unavailable               unavailable  503  NATS or Postgres cannot serve the request
        └── NotReady                           503  /readyz with the failing checks

Errors of the layers below are mapped here too (:func:`install`): FastAPI's
``RequestValidationError`` and pydantic's ``ValidationError`` become
``invalid``; Starlette's own HTTP errors (unknown route, wrong method, body
over the size limit) keep their status; SQLAlchemy connection errors,
event-log append failures and NATS client errors become ``unavailable``.
Every error body has the shape ``{"error": {"code", "message", "details"}}``
(``/readyz`` answers 503 with its readiness report instead).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, ClassVar, Final

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from nats.errors import Error as NatsError
from pydantic import ValidationError
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeoutError
from starlette.exceptions import HTTPException as StarletteHTTPException

from lodestream.eventlog import EventLogError

log = logging.getLogger(__name__)

MAX_DETAILS = 50


class ApiError(Exception):
    """Base of API errors; ``details`` is JSON-ready and goes to the client as-is."""

    status: ClassVar[int] = 500
    code: ClassVar[str] = "internal"

    def __init__(self, message: str, details: Any = None) -> None:
        super().__init__(message)
        self.message = message
        self.details = details


class InvalidInput(ApiError):
    status = 422
    code = "invalid"


class Unauthorized(ApiError):
    status = 401
    code = "unauthorized"


class NotFound(ApiError):
    status = 404
    code = "not_found"


class Conflict(ApiError):
    status = 409
    code = "conflict"


class TooManyJobs(ApiError):
    status = 413
    code = "too_large"


class WaitTimedOut(ApiError):
    status = 504
    code = "timeout"


class Unavailable(ApiError):
    status = 503
    code = "unavailable"


class NotReady(Unavailable):
    """Readiness failed; ``details`` is the readiness report."""


def invalid_from_errors(errors: Sequence[Any], prefix: str = "invalid request") -> InvalidInput:
    """An :class:`InvalidInput` summarising pydantic/FastAPI error dicts."""
    details = [
        {"loc": list(err.get("loc", ())), "msg": _msg(err), "type": err.get("type")}
        for err in errors[:MAX_DETAILS]
    ]
    first = details[0] if details else {"loc": [], "msg": "invalid input"}
    where = ".".join(str(part) for part in first["loc"])
    message = f"{prefix}: {where + ': ' if where else ''}{first['msg']}"
    if len(errors) > 1:
        message += f" (and {len(errors) - 1} more problem{'s' if len(errors) > 2 else ''})"
    return InvalidInput(message, details)


def _msg(err: Any) -> str:
    # pydantic prefixes messages of ValueErrors raised in validators; the rule reads better alone.
    return str(err.get("msg", "")).removeprefix("Value error, ")


def error_body(exc: ApiError) -> dict[str, Any]:
    return {"error": {"code": exc.code, "message": exc.message, "details": exc.details}}


def _response(exc: ApiError) -> JSONResponse:
    headers = {"WWW-Authenticate": "Bearer"} if isinstance(exc, Unauthorized) else None
    body = exc.details if isinstance(exc, NotReady) else error_body(exc)
    return JSONResponse(body, status_code=exc.status, headers=headers)


async def _api_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ApiError)
    return _response(exc)


async def _request_validation(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    return _response(invalid_from_errors(list(exc.errors())))


async def _validation(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ValidationError)
    return _response(invalid_from_errors(exc.errors()))


_HTTP_CODES: Final = {404: "not_found", 405: "method_not_allowed", 413: "too_large"}


async def _http(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    code = _HTTP_CODES.get(exc.status_code, "http_error")
    body = {"error": {"code": code, "message": str(exc.detail), "details": None}}
    return JSONResponse(body, status_code=exc.status_code, headers=exc.headers)


async def _unavailable(_: Request, exc: Exception) -> JSONResponse:
    log.warning("dependency unavailable: %r", exc)
    what = "the database" if isinstance(exc, DBAPIError | PoolTimeoutError) else "the event log"
    return _response(Unavailable(f"{what} is unavailable, retry later", {"reason": str(exc)}))


def install(app: FastAPI) -> None:
    """Register every exception handler of the API on ``app``."""
    app.add_exception_handler(ApiError, _api_error)
    app.add_exception_handler(RequestValidationError, _request_validation)
    app.add_exception_handler(ValidationError, _validation)
    app.add_exception_handler(StarletteHTTPException, _http)
    for dependency_error in (
        OperationalError,
        InterfaceError,
        PoolTimeoutError,
        EventLogError,
        NatsError,
        TimeoutError,
    ):
        app.add_exception_handler(dependency_error, _unavailable)
