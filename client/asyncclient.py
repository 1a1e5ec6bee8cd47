"""``AsyncLodeClient``: ``LodeClient``'s methods on httpx's async client, without a second copy.

Each method of ``LodeClient`` builds its requests and reads their answers in plain code that
calls ``self._send`` for the I/O. The async client runs that same code against a
:class:`_Replay` client whose ``_send`` answers from responses already fetched, in order;
the first request it has no answer for stops the run (:class:`_Pending`), the async client
sends that request with ``await``, and runs the method again with one more answer. A method
of one request runs twice, one of two requests three times; only its requests cost time.
So every method — ``get_job``, ``submit_jobs``, ``resolve_job_id``, the typed ``job`` —
exists once, in ``sdk.py`` (or ``typed.py``), and here is one line naming it. A method that
makes another request than it did on the previous run (it is not deterministic) is refused
with ``RuntimeError`` rather than answered wrongly.

The generators (``list_jobs``, ``jobs``, ``follow_events``) are async generators here, built
on one page at a time; ``follow_events`` polls (every ``poll_s``) once caught up.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Concatenate, Final, Generic, ParamSpec, Self, TypeVar, overload

import httpx

from lodestream.client.config import ClientConfig, http_options, resolve
from lodestream.client.errors import Unreachable
from lodestream.client.sdk import LodeClient, _api_error
from lodestream.client.typed import Job

P = ParamSpec("P")
R = TypeVar("R")
Json = dict[str, Any]
OK: Final = (200, 201, 202)


@dataclass(frozen=True, slots=True)
class _Request:
    method: str
    path: str
    json: Any
    params: Mapping[str, Any] | None


class _Pending(BaseException):
    """The request a replayed method needs an answer to (a BaseException, so that no
    ``except Exception`` in a method takes it for an error)."""

    def __init__(self, request: _Request) -> None:
        super().__init__(request.method, request.path)
        self.request = request


class _Replay(LodeClient):
    """A ``LodeClient`` that sends nothing: it answers from ``answers``, in order."""

    def __init__(self, config: ClientConfig, sent: list[_Request], answers: list[httpx.Response]):
        self.config = config  # no httpx.Client: a replay never opens a connection
        self._sent, self._answers, self._next = sent, answers, 0

    def _send(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: Mapping[str, Any] | None = None,
        ok: tuple[int, ...] = OK,
    ) -> Any:
        request = _Request(method, path, json, dict(params) if params is not None else None)
        index = self._next
        if index == len(self._answers):
            raise _Pending(request)
        if self._sent[index] != request:
            raise RuntimeError(
                f"a replayed call asked for {request.method} {request.path} where it had asked "
                f"for {self._sent[index].method} {self._sent[index].path}: it is not deterministic"
            )
        self._next += 1
        response = self._answers[index]
        if response.status_code not in ok:
            raise _api_error(response)
        return response.json()


class _Async(Generic[P, R]):
    """``LodeClient.<method>`` as a coroutine method of ``AsyncLodeClient``."""

    def __init__(self, method: Callable[Concatenate[LodeClient, P], R]) -> None:
        self._method = method
        self.__doc__ = method.__doc__

    @overload
    def __get__(self, obj: None, owner: type[Any]) -> Self: ...
    @overload
    def __get__(self, obj: AsyncLodeClient, owner: type[Any]) -> Callable[P, Awaitable[R]]: ...
    def __get__(
        self, obj: AsyncLodeClient | None, owner: type[Any]
    ) -> Self | Callable[P, Awaitable[R]]:
        if obj is None:
            return self
        method = self._method

        async def call(*args: P.args, **kwargs: P.kwargs) -> R:
            return await obj.call(method, *args, **kwargs)

        return functools.wraps(method)(call)


class AsyncLodeClient:
    """``LodeClient``'s methods, each awaited, on httpx's async client. Use it as
    ``async with AsyncLodeClient.from_config() as lode: job = await lode.job(job_id)``."""

    def __init__(self, config: ClientConfig, *, timeout_s: float = 60.0) -> None:
        self.config = config
        self._http = httpx.AsyncClient(**http_options(config, timeout_s))

    @classmethod
    def from_config(
        cls, api_url: str | None = None, token: str | None = None, state_dir: Path | None = None
    ) -> Self:
        """Build a client from arguments, environment or the client files (see client.config)."""
        return cls(resolve(api_url, token, state_dir))

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the underlying HTTP connections."""
        await self._http.aclose()

    async def call(
        self, method: Callable[Concatenate[LodeClient, P], R], *args: P.args, **kwargs: P.kwargs
    ) -> R:
        """Run ``method``, a function that takes a ``LodeClient`` first (any of its methods),
        sending its requests with this client."""
        sent: list[_Request] = []
        answers: list[httpx.Response] = []
        while True:
            try:
                return method(_Replay(self.config, sent, answers), *args, **kwargs)
            except _Pending as pending:
                sent.append(pending.request)
                answers.append(await self._fetch(pending.request))

    async def _fetch(self, request: _Request) -> httpx.Response:
        try:
            return await self._http.request(
                request.method, request.path, json=request.json, params=request.params
            )
        except httpx.TransportError as exc:
            raise Unreachable(self.config.api_url, str(exc) or type(exc).__name__) from exc

    # --- the generators, a page at a time ------------------------------------------------

    async def list_jobs(self, *, page_size: int = 500, **filters: Any) -> AsyncIterator[Json]:
        """Your jobs matching ``filters``, as ``LodeClient.list_jobs``."""
        offset: int | None = 0
        while offset is not None:
            params = {**filters, "limit": page_size, "offset": offset}
            page = await self.call(LodeClient._request, "GET", "/jobs", params=params)
            for item in page["items"]:
                yield item
            offset = page.get("next_offset")

    async def jobs(self, *, page_size: int = 500, **filters: Any) -> AsyncIterator[Job]:
        """Your jobs matching ``filters``, typed, as ``LodeClient.jobs``."""
        async for item in self.list_jobs(page_size=page_size, **filters):
            yield Job.model_validate(item)

    async def follow_events(
        self,
        after_seq: int = 0,
        *,
        poll_s: float = 1.0,
        until_caught_up: bool = False,
        limit: int = 1000,
    ) -> AsyncIterator[Json]:
        """Your job events after ``after_seq``, in log order: pages while there are more,
        then (unless ``until_caught_up``) a page every ``poll_s`` seconds, forever."""
        while True:
            page = await self.events_page(after_seq, limit)
            for item in page["items"]:
                yield item
            after_seq = int(page["next_after_seq"])
            if len(page["items"]) < limit:
                if until_caught_up:
                    return
                await asyncio.sleep(poll_s)

    # --- LodeClient's methods ---------------------------------------------------------------

    register_site = _Async(LodeClient.register_site)
    register_site_key = _Async(LodeClient.register_site_key)
    remove_site = _Async(LodeClient.remove_site)
    list_sites = _Async(LodeClient.list_sites)
    site_transfers = _Async(LodeClient.site_transfers)
    list_apps = _Async(LodeClient.list_apps)
    submit_jobs = _Async(LodeClient.submit_jobs)
    summary = _Async(LodeClient.summary)
    resolve_job_id = _Async(LodeClient.resolve_job_id)
    get_job = _Async(LodeClient.get_job)
    job_result = _Async(LodeClient.job_result)
    job_results = _Async(LodeClient.job_results)
    job_events = _Async(LodeClient.job_events)
    kill_job = _Async(LodeClient.kill_job)
    reset_job = _Async(LodeClient.reset_job)
    request_batch_job = _Async(LodeClient.request_batch_job)
    list_batch_jobs = _Async(LodeClient.list_batch_jobs)
    get_batch_job = _Async(LodeClient.get_batch_job)
    delete_batch_job = _Async(LodeClient.delete_batch_job)
    events_after = _Async(LodeClient.events_after)
    events_page = _Async(LodeClient.events_page)
    monitoring_key = _Async(LodeClient.monitoring_key)
    register_monitoring_key = _Async(LodeClient.register_monitoring_key)
    me = _Async(LodeClient.me)
    health = _Async(LodeClient.health)
    ready = _Async(LodeClient.ready)
    # typed (client/typed.py)
    job = _Async(LodeClient.job)
    job_history = _Async(LodeClient.job_history)
    result = _Async(LodeClient.result)
    results = _Async(LodeClient.results)
    events = _Async(LodeClient.events)
    sites = _Async(LodeClient.sites)
    apps = _Async(LodeClient.apps)
    batch_jobs = _Async(LodeClient.batch_jobs)
    batch_job = _Async(LodeClient.batch_job)
    transfers = _Async(LodeClient.transfers)


# Not local to a client: what stays in the sync one (connections, context managers).
_SYNC_ONLY: Final = frozenset({"from_config", "close"})


def _mirror_the_rest() -> None:
    """Methods ``LodeClient`` gained that are not named above (typed there, untyped here)."""
    for name, member in inspect.getmembers(LodeClient, inspect.isfunction):
        if name.startswith("_") or name in _SYNC_ONLY or hasattr(AsyncLodeClient, name):
            continue
        if inspect.isgeneratorfunction(member):
            continue  # a generator needs its own async form, above
        setattr(AsyncLodeClient, name, _Async(member))


_mirror_the_rest()
