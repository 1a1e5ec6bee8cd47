"""Python SDK for the lodestream API.

Every call maps to one HTTP request; errors come back as :class:`ApiError`
with the API's status, code and message. Example::

    with LodeClient.from_config() as lode:
        lode.register_site("theta-like")
        ids = lode.submit_jobs([{"site": "theta-like", "app": "eigh", "workdir": "run/1"}])
        for job in lode.list_jobs(state=["JOB_FINISHED"]):
            print(job["id"])
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Generator, Iterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final, Self

import httpx

from lodestream.client.config import ClientConfig, http_options, resolve
from lodestream.client.errors import ApiError, JobIdUnresolved, Unreachable
from lodestream.client.pushed import PushUnavailable, pushed_sequences
from lodestream.client.typed import TypedReads
from lodestream.schemas.ids import MIN_ID_PART, id_part

Json = dict[str, Any]
PROJECTION_WAIT_S: Final = 0.02
MAX_ID_MATCHES: Final = 20  # jobs an ambiguous part of an id is shown to match


class LodeClient(TypedReads):
    """A synchronous client bound to one API URL and token; its reads return dicts, and
    their typed twins (``jobs``, ``job``, ``sites``, … in ``client.typed``) the API's models."""

    def __init__(self, config: ClientConfig, *, timeout_s: float = 60.0) -> None:
        self.config = config
        self._http = httpx.Client(**http_options(config, timeout_s))

    @classmethod
    def from_config(
        cls, api_url: str | None = None, token: str | None = None, state_dir: Path | None = None
    ) -> Self:
        """Build a client from arguments, environment or the client files (see client.config)."""
        return cls(resolve(api_url, token, state_dir))

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Close the underlying HTTP connections."""
        self._http.close()

    # --- sites and apps -------------------------------------------------------------------

    def register_site(
        self, name: str, description: str = "", *, public_key: str | None = None, wait: bool = True
    ) -> Json:
        """Register a site you own; ``name`` is a lowercase slug. 409 if the name is taken."""
        body: Json = {"name": name, "description": description}
        if public_key is not None:
            body["public_key"] = public_key
        return self._request("POST", "/sites", json=body, params={"wait": wait})

    def register_site_key(self, name: str, public_key: str) -> Json:
        """Bind (or rotate) the nkey public key a site authenticates with."""
        return self._request("PUT", f"/sites/{name}/key", json={"public_key": public_key})

    def remove_site(self, name: str) -> Json:
        """Remove a site: its credential stops working within seconds."""
        return self._request("DELETE", f"/sites/{name}")

    def list_sites(self, *, include_removed: bool = False) -> list[Json]:
        """Your sites, each with the transfer locations it declared (removed ones too with
        ``include_removed``)."""
        return self._request_list("GET", "/sites", params={"include_removed": include_removed})

    def site_transfers(
        self,
        site: str,
        *,
        state: Sequence[str] = (),
        direction: str | None = None,
        job_id: str | None = None,
        limit: int = 100,
    ) -> list[Json]:
        """The site's transfer items, most recently changed first.

        Without ``state``, those in flight (pending and submitted); pass states (pending,
        submitted, succeeded, failed) to see others. ``direction`` is ``in`` or ``out``;
        ``job_id`` keeps one job's items, those of earlier staging steps included.
        """
        params: dict[str, Any] = {"limit": limit}
        if state:
            params["state"] = list(state)
        if direction is not None:
            params["direction"] = direction
        if job_id is not None:
            params["job_id"] = job_id
        return self._request_list("GET", f"/sites/{site}/transfers", params=params)

    def list_apps(self, site: str | None = None) -> list[Json]:
        """Applications registered by your sites (optionally one site)."""
        params = {"site": site} if site else {}
        return self._request_list("GET", "/apps", params=params)

    # --- jobs -------------------------------------------------------------------------------

    def submit_jobs(
        self,
        jobs: Sequence[Mapping[str, Any]],
        *,
        idempotency_key: str | None = None,
        wait: bool = False,
    ) -> Json:
        """Submit up to 5,000 jobs in one request; returns ids and stream sequences.

        With ``idempotency_key`` a retried call returns the same ids and appends
        nothing; with ``wait`` it returns once the jobs are visible in queries.
        """
        body: Json = {"jobs": list(jobs)}
        if idempotency_key is not None:
            body["idempotency_key"] = idempotency_key
        return self._request("POST", "/jobs", json=body, params={"wait": wait})

    def list_jobs(self, *, page_size: int = 500, **filters: Any) -> Iterator[Json]:
        """Iterate over your jobs matching ``filters`` (site, app, state, tag, parent_id, …)."""
        offset: int | None = 0
        while offset is not None:
            page = self._request(
                "GET", "/jobs", params={**filters, "limit": page_size, "offset": offset}
            )
            yield from page["items"]
            offset = page.get("next_offset")

    def summary(self, app: str | None = None, tags: Sequence[str] = ()) -> Json:
        """Your jobs at one log ``position`` (of ``app``, with every ``key:value`` of ``tags``,
        when given): ``counts`` by site and state, the unfinished ``jobs`` as ``{id: [site,
        state]}``, recent ``failures``, open ``sessions``. A watch from ``position + 1``
        continues it exactly."""
        params: dict[str, Any] = {"tag": list(tags)} if tags else {}
        if app is not None:
            params["app"] = app
        return self._request("GET", "/ui/api/summary", params=params)

    def resolve_job_id(self, text: str) -> str:
        """The whole id of your one job that ``text`` names: a whole id (returned as it is),
        or at least four hex digits its id begins or ends with (the tail ``lode`` shows).

        Raises :class:`~lodestream.client.errors.JobIdUnresolved` when no job of yours
        matches, or several do (``matches`` lists up to :data:`MAX_ID_MATCHES` of them).
        """
        try:
            return str(uuid.UUID(text))
        except ValueError:
            pass
        digits = id_part(text)
        if digits is None:
            raise JobIdUnresolved(
                text, [], f"{text!r} is neither a job id nor {MIN_ID_PART}+ hex digits of one"
            )
        found: dict[str, Json] = {}
        for where in ("id_prefix", "id_suffix"):
            page = self._request("GET", "/jobs", params={where: digits, "limit": MAX_ID_MATCHES})
            found.update((job["id"], job) for job in page["items"])
        if len(found) == 1:
            return next(iter(found))
        if not found:
            raise JobIdUnresolved(text, [], f"no job of yours has an id beginning or ending {text}")
        listed = "".join(
            f"\n  {job['id']}  {job['site']}  {job['app']}  {job['state']}"
            for job in found.values()
        )
        more = " or more" if len(found) >= MAX_ID_MATCHES else ""
        raise JobIdUnresolved(
            text,
            list(found.values()),
            f"{text} is part of the ids of {len(found)}{more} jobs; name one:{listed}",
        )

    def get_job(self, job_id: str) -> Json:
        """One job with its current state, resources, per-stage timestamps and, in
        ``transfer_items``, the transfer items of its newest staging step."""
        return self._request("GET", f"/jobs/{job_id}")

    def job_result(self, job_id: str) -> Json:
        """What the job's newest run came to: ``state``, ``final``, ``result`` (a Python app's
        return value), ``return_code``, ``stderr_tail``, ``cause``, ``reason`` and, when a
        Python app raised, ``error`` (type, message, traceback)."""
        return self._request("GET", f"/jobs/{job_id}/result")

    def job_results(self, job_ids: Sequence[str]) -> Json:
        """Up to 5,000 jobs' results in one request: ``results``, ``missing`` (ids that are not
        jobs of yours) and ``position``, the log position they were read at."""
        return self._request("POST", "/jobs/results", json={"ids": list(job_ids)})

    def job_events(self, job_id: str) -> list[Json]:
        """The full event history of one job, oldest first."""
        return self._request_list("GET", f"/jobs/{job_id}/events")

    def kill_job(self, job_id: str, reason: str = "") -> Json:
        """Kill a job that is not final yet; a running task is stopped by its pilot.

        ``reason`` goes into the job's history; without one the API records a default.
        """
        body = {"reason": reason} if reason else None
        return self._request("POST", f"/jobs/{job_id}/kill", json=body)

    def reset_job(self, job_id: str, reason: str = "") -> Json:
        """Send a FAILED or KILLED job back to READY to run again (``reason`` as for kill)."""
        body = {"reason": reason} if reason else None
        return self._request("POST", f"/jobs/{job_id}/reset", json=body)

    def kill_jobs(self, *, reason: str = "", dry_run: bool = False, **selection: Any) -> Json:
        """Kill, in one request, every job ``selection`` picks that is not final: any of
        ``ids``, ``site``, ``app``, ``states``, ``tags`` (``["key:value"]``), ``parent_id``,
        ``created_after``, ``created_before`` (all must hold), ``limit``.

        Returns counts: ``matched``, ``acted``, ``refused`` (with ``refusals``), ``gone``
        (moved on meanwhile) and ``more``: true when more jobs match than one request acts on
        (``api.max_jobs_per_request``); call again for those. ``dry_run`` only counts.
        """
        return self._bulk("kill", reason, dry_run, selection)

    def reset_jobs(self, *, reason: str = "", dry_run: bool = False, **selection: Any) -> Json:
        """Send every FAILED or KILLED job ``selection`` picks back to READY, in one request
        (the selection and the answer as for :meth:`kill_jobs`)."""
        return self._bulk("reset", reason, dry_run, selection)

    def _bulk(self, verb: str, reason: str, dry_run: bool, selection: Mapping[str, Any]) -> Json:
        body: Json = {**selection, "reason": reason, "dry_run": dry_run}
        for name in ("created_after", "created_before"):
            if hasattr(body.get(name), "isoformat"):
                body[name] = body[name].isoformat()
        if body.get("ids"):
            body["ids"] = [str(i) for i in body["ids"]]
        return self._request("POST", f"/jobs/{verb}", json=body)

    # --- pilot batch jobs -------------------------------------------------------------------

    def request_batch_job(
        self,
        site: str,
        *,
        num_nodes: int,
        wall_time_min: int,
        queue: str = "",
        project: str = "",
        job_mode: str = "serial",
        filter_tags: Mapping[str, str] | None = None,
        options: Mapping[str, str] | None = None,
        idempotency_key: str | None = None,
        wait: bool = False,
    ) -> Json:
        """Ask ``site`` for a pilot batch job of ``num_nodes`` nodes for ``wall_time_min``.

        The site's agent renders the pilot's script from its template and submits it to the
        site's scheduler; follow it with :meth:`get_batch_job`. ``options`` are
        scheduler-native settings (``{"qos": "debug"}``), passed on only where the site
        allows their names. With ``idempotency_key`` a retried call returns the same batch
        job; with ``wait`` it returns once the batch job is visible in reads.
        """
        body: Json = {
            "num_nodes": num_nodes, "wall_time_min": wall_time_min, "queue": queue,
            "project": project, "job_mode": job_mode, "filter_tags": dict(filter_tags or {}),
            "options": dict(options or {}),
        }  # fmt: skip
        if idempotency_key is not None:
            body["idempotency_key"] = idempotency_key
        return self._request("POST", f"/sites/{site}/batch-jobs", json=body, params={"wait": wait})

    def list_batch_jobs(
        self, site: str | None = None, *, state: Sequence[str] = (), limit: int = 100
    ) -> list[Json]:
        """Your batch jobs (at ``site``, or at all your sites), newest first."""
        params: dict[str, Any] = {"limit": limit}
        if state:
            params["state"] = list(state)
        if site is not None:
            return self._request_list("GET", f"/sites/{site}/batch-jobs", params=params)
        return self._request_list("GET", "/batch-jobs", params=params)

    def get_batch_job(self, batch_id: str) -> Json:
        """One batch job: its state, the scheduler's id and, once it ended, how."""
        return self._request("GET", f"/batch-jobs/{batch_id}")

    def delete_batch_job(self, batch_id: str, reason: str = "") -> Json:
        """Ask the site to delete a batch job at its scheduler; its pilot drains and exits."""
        body = {"reason": reason} if reason else None
        return self._request("DELETE", f"/batch-jobs/{batch_id}", json=body)

    def events_after(self, after_seq: int = 0, limit: int = 1000) -> list[Json]:
        """Job events of your sites after stream sequence ``after_seq`` (a polling feed)."""
        return list(self.events_page(after_seq, limit)["items"])

    def events_page(self, after_seq: int = 0, limit: int = 1000) -> Json:
        """One page of the feed: ``items`` and ``next_after_seq``, where the next page starts
        (it may pass events of other users, and is the feed's end on a short page)."""
        params = {"after_seq": after_seq, "limit": limit}
        return self._request("GET", "/events", params=params)

    def follow_events(
        self,
        after_seq: int = 0,
        *,
        poll_s: float = 1.0,
        until_caught_up: bool = False,
        limit: int = 1000,
    ) -> Iterator[Json]:
        """Your job events after ``after_seq``, in log order, as they are projected: pages
        while there are more, then (unless ``until_caught_up``) forever, woken by the api's
        push feed and reading each pushed event's row once it is projected; polling every
        ``poll_s`` seconds where the api cannot push. Stop by breaking out of the loop."""
        after_seq = yield from self._pages(after_seq, limit)
        if until_caught_up:
            return
        try:
            for seq in pushed_sequences(self._http, after_seq, {"kind": "job"}):
                # The push says the event is on the log; its row follows once projected.
                wait_s = PROJECTION_WAIT_S
                while after_seq < seq:
                    before = after_seq
                    after_seq = yield from self._pages(after_seq, limit)
                    if after_seq == before:
                        time.sleep(wait_s)
                        wait_s = min(2 * wait_s, poll_s)
        except PushUnavailable:
            while True:
                time.sleep(poll_s)
                after_seq = yield from self._pages(after_seq, limit)

    def _pages(self, after_seq: int, limit: int) -> Generator[Json, None, int]:
        """Every page from ``after_seq`` to the end of the feed; returns where it ended."""
        while True:
            page = self.events_page(after_seq, limit)
            yield from page["items"]
            after_seq = int(page["next_after_seq"])
            if len(page["items"]) < limit:
                return after_seq

    def monitoring_key(self) -> Json:
        """Your monitoring key (``public_key``, ``None`` if none), its ``sites`` and ``log_end``."""
        return self._request("GET", "/users/me/monitoring-key")

    def register_monitoring_key(self, public_key: str) -> Json:
        """Register the key ``lode watch`` reads the log with; the previous one stops working."""
        return self._request("PUT", "/users/me/monitoring-key", json={"public_key": public_key})

    def me(self) -> Json:
        """Who the token belongs to, the credential sync's state, and your bindings it left out
        of NATS (each cannot connect until you bind a new key)."""
        return self._request("GET", "/users/me")

    def tokens(self) -> list[Json]:
        """Your live API tokens: ``id`` (the start of the stored digest, never the secret),
        ``created_at``, and ``current``, true for the token this client uses."""
        return self._request_list("GET", "/users/me/tokens")

    def revoke_token(self, token_id: str) -> Json:
        """Revoke one of your tokens by its id (see :meth:`tokens`); it is refused from its
        next request on, this client's own included."""
        return self._request("DELETE", f"/users/me/tokens/{token_id}")

    def health(self) -> Json:
        """``/healthz``: the API serves, and the credential sync's state (``null`` if none)."""
        return self._request("GET", "/healthz")

    def ready(self) -> Json:
        """The API's readiness report (NATS, Postgres, projector lag)."""
        return self._request("GET", "/readyz", ok=(200, 503))

    # --- plumbing ---------------------------------------------------------------------------

    def _request_list(
        self, method: str, path: str, *, params: Mapping[str, Any] | None = None
    ) -> list[Json]:
        body: Any = self._send(method, path, params=params)
        return list(body)

    def _request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: Mapping[str, Any] | None = None,
        ok: tuple[int, ...] = (200, 201, 202),
    ) -> Json:
        body: Json = self._send(method, path, json=json, params=params, ok=ok)
        return body

    def _send(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: Mapping[str, Any] | None = None,
        ok: tuple[int, ...] = (200, 201, 202),
    ) -> Any:
        try:
            response = self._http.request(method, path, json=json, params=params)
        except httpx.TransportError as exc:
            reason = str(exc) or type(exc).__name__
            raise Unreachable(self.config.api_url, reason, self.config.url_origin) from exc
        if response.status_code not in ok:
            raise _api_error(response)
        return response.json()


def _api_error(response: httpx.Response) -> ApiError:
    try:
        error = response.json().get("error", {})
    except ValueError:
        error = {}
    return ApiError(
        response.status_code,
        str(error.get("code", "error")),
        str(error.get("message", response.text[:500])),
        error.get("details"),
    )


# The executor is built on the client; it is importable from here, with what its futures give.
from lodestream.client.executor import LodeExecutor  # noqa: E402
from lodestream.client.futures import CallFailed, JobFailed, JobResult, LodeFuture  # noqa: E402

__all__ = [
    "ApiError", "App", "AsyncLodeClient", "BatchJob", "CallFailed", "Job", "JobDetail",
    "JobEvent", "JobFailed", "JobResult", "LodeClient", "LodeExecutor", "LodeFuture", "RunResult",
    "Site", "Transfer",
]  # fmt: skip

if TYPE_CHECKING:
    from lodestream.client.asyncclient import AsyncLodeClient
    from lodestream.client.typed import (
        App,
        BatchJob,
        Job,
        JobDetail,
        JobEvent,
        RunResult,
        Site,
        Transfer,
    )


def __getattr__(name: str) -> Any:
    # AsyncLodeClient is made from LodeClient's methods, so its module imports this one: it
    # is imported here on first use, and either module may be imported first. The typed
    # models load the event models: they too come on first use, not at every `lode` start.
    if name == "AsyncLodeClient":
        from lodestream.client.asyncclient import AsyncLodeClient  # noqa: PLC0415

        return AsyncLodeClient
    from lodestream.client import typed  # noqa: PLC0415

    return getattr(typed, name)
