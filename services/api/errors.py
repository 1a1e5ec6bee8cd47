"""Errors of the API, and the one place that turns errors into HTTP responses.

::

    ApiProblem                    code         status
    ├── InvalidInput              invalid      422  bad body, query or reference; nothing appended
    ├── Unauthorized              unauthorized 401  missing, unknown or revoked token
    ├── NotFound                  not_found    404  absent, or owned by someone else
    ├── Conflict                  conflict     409  the id or name is taken
    ├── TooLarge                  too_large    413  over a size limit: retrying cannot help
    │   └── TooManyJobs                             more jobs than one request may carry
    ├── TooMany                   too_many     429  over a per-user limit on open resources
    ├── NotYetProjected           timeout      504  appended, but not yet projected
    └── Unavailable               unavailable  503  NATS or Postgres cannot serve the request
        └── NotReady                           503  /readyz with the failing checks

The base is not called ``ApiError``: that is the SDK's name for what a client receives
(:class:`lodestream.client.errors.ApiError`), a different class on the other side of HTTP.

Errors of the layers below are mapped here too (:func:`install`): FastAPI's
``RequestValidationError`` and pydantic's ``ValidationError`` become
``invalid``; Starlette's own HTTP errors (unknown route, wrong method, body
over the size limit) keep their status; nats-py's ``MaxPayloadError`` is
``too_large`` (the routes check sizes before appending, so it is only a
backstop); SQLAlchemy connection errors, event-log append failures and
other NATS client errors become ``unavailable``.
Every error body has the shape ``{"error": {"code", "message", "details"}}``
(:class:`~services.api.models.ErrorBody`; ``/readyz`` answers 503 with its
readiness report instead). :func:`documented` states the same in each
route's OpenAPI ``responses``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, ClassVar, Final

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from nats.errors import Error as NatsError
from nats.errors import MaxPayloadError
from pydantic import ValidationError
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeoutError
from starlette.exceptions import HTTPException as StarletteHTTPException

from lodestream.eventlog import EventLogError
from lodestream.schemas.events.batch import SCHEDULER_OPTION_PATTERN, SCHEDULER_WORD_PATTERN
from lodestream.schemas.resources import (
    APP_NAME_PATTERN,
    LAUNCH_KEY_PATTERN,
    LAUNCH_VALUE_PATTERN,
    NUL_FREE_PATTERN,
    PRINTABLE_PATTERN,
    WORKDIR_PATTERN,
)
from lodestream.schemas.subjects import SITE_SLUG_PATTERN
from lodestream.services.api.models import TAG_FILTER_PATTERN, ErrorBody

log = logging.getLogger(__name__)

MAX_DETAILS = 50


class ApiProblem(Exception):
    """Base of API errors; ``details`` is JSON-ready and goes to the client as-is."""

    status: ClassVar[int] = 500
    code: ClassVar[str] = "internal"
    when: ClassVar[str] = ""  # for the OpenAPI document: when a route answers this

    def __init__(self, message: str, details: Any = None) -> None:
        super().__init__(message)
        self.message = message
        self.details = details


class InvalidInput(ApiProblem):
    status = 422
    code = "invalid"
    when = "the body, a parameter or a reference is invalid; nothing was appended"


class Unauthorized(ApiProblem):
    status = 401
    code = "unauthorized"
    when = "the bearer token is missing, unknown or revoked"


class NotFound(ApiProblem):
    status = 404
    code = "not_found"
    when = "no such thing among the caller's own (another user's is not found either)"


class Conflict(ApiProblem):
    status = 409
    code = "conflict"
    when = "the id or name is taken, or the job's state does not allow the action"


class TooLarge(ApiProblem):
    status = 413
    code = "too_large"
    when = "over a size limit (named in the message); retrying the same request cannot help"


class TooManyJobs(TooLarge):
    """More jobs than one request may carry."""


class TooMany(ApiProblem):
    status = 429
    code = "too_many"
    when = "the caller holds as many as a per-user limit allows (named in the message)"


class NotYetProjected(ApiProblem):
    status = 504
    code = "timeout"
    when = "appended, but not projected within the wait; details hold the accepted result"


class Unavailable(ApiProblem):
    status = 503
    code = "unavailable"
    when = "NATS or Postgres cannot serve the request now; retry later"


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


TAG_FILTER_RULE: Final = "a tag filter is key:value, the key 1-64 letters, digits or '_.-'"
# The rule behind each pattern of the API's inputs reads better than the regular expression
# that pydantic would quote (a pattern not listed here is quoted as it is).
_PATTERN_RULES: Final = {
    NUL_FREE_PATTERN: "must not contain NUL (\\u0000), which Postgres cannot store",
    PRINTABLE_PATTERN: "must not contain control characters (newline, tab, NUL, ...)",
    WORKDIR_PATTERN: (
        "must be a relative path below the site's data/ (not data/ itself), without '..'"
        " or control characters"
    ),
    SITE_SLUG_PATTERN: "a site name is 1-40 lowercase letters, digits and inner hyphens",
    APP_NAME_PATTERN: "an app name is a letter or '_', then up to 79 letters, digits, '_.-'",
    TAG_FILTER_PATTERN: TAG_FILTER_RULE,
    SCHEDULER_WORD_PATTERN: "one word of at most 128 printable characters, not starting with '-'",
    LAUNCH_KEY_PATTERN: "a launch_params key is an option as written: '-' or '--', then a name",
    LAUNCH_VALUE_PATTERN: (
        "a launch_params value is '' (a switch) or one word of letters, digits and '_.,:=+/@%-'"
        " that does not start with '-'"
    ),
    SCHEDULER_OPTION_PATTERN: "an option name is a letter, then up to 63 letters, digits, '_-'",
}


def _msg(err: Any) -> str:
    if err.get("type") == "string_pattern_mismatch":
        rule = _PATTERN_RULES.get(str((err.get("ctx") or {}).get("pattern")))
        if rule is not None:
            return rule
    # pydantic prefixes messages of ValueErrors raised in validators; the rule reads better alone.
    return str(err.get("msg", "")).removeprefix("Value error, ")


def documented(*errors: type[ApiProblem]) -> dict[int | str, dict[str, Any]]:
    """The OpenAPI ``responses`` of a route that may raise ``errors`` (merged by status)."""
    responses: dict[int | str, dict[str, Any]] = {}
    for error in sorted(errors, key=lambda e: e.status):
        entry = responses.setdefault(error.status, {"model": ErrorBody, "description": ""})
        entry["description"] = "; ".join(filter(None, (entry["description"], error.when)))
    return responses


def error_body(exc: ApiProblem) -> dict[str, Any]:
    return {"error": {"code": exc.code, "message": exc.message, "details": exc.details}}


def _response(exc: ApiProblem) -> JSONResponse:
    headers = {"WWW-Authenticate": "Bearer"} if isinstance(exc, Unauthorized) else None
    body = exc.details if isinstance(exc, NotReady) else error_body(exc)
    return JSONResponse(body, status_code=exc.status, headers=headers)


async def _api_problem(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ApiProblem)
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
    if exc.status_code == 400:
        # FastAPI's answer to a body it cannot decode (not UTF-8, say); every other invalid
        # input is a 422, and POST /jobs, which parses its own body, answers this one so too.
        return _response(InvalidInput(f"invalid request: body: {exc.detail}"))
    code = _HTTP_CODES.get(exc.status_code, "http_error")
    body = {"error": {"code": code, "message": str(exc.detail), "details": None}}
    return JSONResponse(body, status_code=exc.status_code, headers=exc.headers)


async def _max_payload(request: Request, exc: Exception) -> JSONResponse:
    limit = request.app.state.context.nc.max_payload
    return _response(
        TooLarge(
            f"an event is over the {limit} bytes the event log accepts (NATS max_payload)",
            {"limit": limit, "reason": str(exc)},
        )
    )


async def _unavailable(_: Request, exc: Exception) -> JSONResponse:
    log.warning("dependency unavailable: %r", exc)
    what = "the database" if isinstance(exc, DBAPIError | PoolTimeoutError) else "the event log"
    return _response(Unavailable(f"{what} is unavailable, retry later", {"reason": str(exc)}))


def install(app: FastAPI) -> None:
    """Register every exception handler of the API on ``app``."""
    app.add_exception_handler(ApiProblem, _api_problem)
    app.add_exception_handler(RequestValidationError, _request_validation)
    app.add_exception_handler(ValidationError, _validation)
    app.add_exception_handler(StarletteHTTPException, _http)
    # Handlers are found by the exception's class hierarchy, so this one wins over NatsError's.
    app.add_exception_handler(MaxPayloadError, _max_payload)
    for dependency_error in (
        OperationalError,
        InterfaceError,
        PoolTimeoutError,
        EventLogError,
        NatsError,
        TimeoutError,
    ):
        app.add_exception_handler(dependency_error, _unavailable)
