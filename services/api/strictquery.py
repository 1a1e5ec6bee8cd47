"""Refusing query parameters a route does not take.

FastAPI ignores a query parameter no route parameter names, so ``GET /jobs?stat=FAILED``
listed every job as if unfiltered. List routes depend on :data:`KnownQuery`: a name the route
(or one of its dependencies) does not declare is a 422 that lists the names it does take.
"""

from __future__ import annotations

from typing import Any

from fastapi import Depends, Request
from fastapi.dependencies.models import Dependant
from fastapi.routing import APIRoute

from lodestream.services.api.errors import InvalidInput


def _declared(route: APIRoute) -> frozenset[str]:
    cached: frozenset[str] | None = getattr(route, "_lode_query_names", None)
    if cached is None:
        cached = frozenset(_query_names(route.dependant))
        route._lode_query_names = cached  # type: ignore[attr-defined]  # computed once per route
    return cached


def _query_names(dependant: Dependant) -> set[str]:
    names = {param.alias for param in dependant.query_params}
    for sub in dependant.dependencies:
        names |= _query_names(sub)
    return names


def refuse_unknown_query(request: Request) -> None:
    """422 when the request names a query parameter its route does not take."""
    route: Any = request.scope.get("route")
    if not isinstance(route, APIRoute):
        return
    declared = _declared(route)
    unknown = sorted(set(request.query_params) - declared)
    if unknown:
        names = ", ".join(repr(name) for name in unknown)
        raise InvalidInput(
            f"unknown query parameter {names} for {route.path}; it takes: "
            f"{', '.join(sorted(declared))}",
            {"unknown": unknown, "known": sorted(declared)},
        )


KnownQuery = Depends(refuse_unknown_query)
