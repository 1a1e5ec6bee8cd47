"""Turning a validated submission into ``job.created`` events — pure functions, no I/O.

The route loads a :class:`Catalog` (what the checks need from the read
models: a constant number of queries per request), calls :func:`check`,
which raises before anything is appended, and then appends what
:func:`build_events` returns. Ids are deterministic when the client gives an
idempotency key, so a retried request mints the same job and event ids and
JetStream de-duplicates it.
"""

from __future__ import annotations

import uuid
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from lodestream.schemas.events.job import JobCreated
from lodestream.schemas.ids import keyed_id, uuid7, uuid7s
from lodestream.schemas.params import default_type, type_problem
from lodestream.schemas.states import CREATED_RUNNABLE
from lodestream.schemas.strategies import AUTO_SITE, DEFAULT_STRATEGY
from lodestream.schemas.xfer import remote_path_problem
from lodestream.services.api.capacity import RunTimes
from lodestream.services.api.errors import MAX_DETAILS, Conflict, NotFound, invalid_from_errors
from lodestream.services.api.models import JobSubmission, SubmitRequest
from lodestream.services.api.placement import Placer, SiteLoad
from lodestream.settings import Settings


@dataclass(frozen=True, slots=True)
class AppInterface:
    """What a submission must match of an app registered at its site."""

    parameters: frozenset[str]
    required_parameters: frozenset[str]
    slots: frozenset[str]
    required_slots: frozenset[str]
    preprocess: bool = False  # the app has a ``preprocess`` hook: its jobs are not created runnable
    python: bool = False  # a Python-function app: the only kind whose jobs may carry ``calls``
    # Each parameter's declared type (schemas.params), those that take any value left out.
    types: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def from_row(
        cls,
        parameters: Mapping[str, Any],
        transfers: Mapping[str, Any],
        hooks: Collection[str] = (),
        python: bool = False,
    ) -> AppInterface:
        """From the ``parameters``, ``transfers``, ``hooks`` and ``python`` columns of
        ``rm.apps``; a parameter registered before types has its app kind's default type."""
        kind = default_type(python)
        declared = {name: spec.get("type") or kind for name, spec in parameters.items()}
        return cls(
            preprocess="preprocess" in hooks,
            python=python,
            types={name: t for name, t in declared.items() if t != "any"},
            parameters=frozenset(parameters),
            required_parameters=frozenset(
                name
                for name, spec in parameters.items()
                if spec.get("required", True) and spec.get("default") is None
            ),
            slots=frozenset(transfers),
            required_slots=frozenset(
                name for name, spec in transfers.items() if spec.get("required", False)
            ),
        )


@dataclass(frozen=True, slots=True)
class Existing:
    """A job that already exists under an id this request uses."""

    owner: str
    created_event_id: uuid.UUID | None
    created_seq: int


@dataclass(frozen=True, slots=True)
class Catalog:
    """What the read models say about the names and ids a request refers to."""

    sites: frozenset[str]  # the caller's live sites among those named
    apps: Mapping[str, Mapping[str, AppInterface]]  # site -> app -> interface, sites with apps
    own_jobs: frozenset[uuid.UUID]  # the caller's jobs among the parents named
    existing: Mapping[uuid.UUID, Existing] = field(default_factory=dict)  # by job id
    # site -> the transfer locations it declared (site.locations_set)
    locations: Mapping[str, frozenset[str]] = field(default_factory=dict)
    # site -> its load, for every live site of the caller; only when a job has site "auto"
    loads: Mapping[str, SiteLoad] = field(default_factory=dict)
    runs: RunTimes = field(default_factory=RunTimes)  # the apps' run times across the sites


def actor(user: str) -> str:
    return f"user:{user}"


def job_ids(request: SubmitRequest, user: str, secret: bytes) -> list[uuid.UUID]:
    """The id of each job: the client's, else derived from the key, else a fresh UUIDv7.

    A derived id is keyed with the control plane's ``secret``: a user's name and key are
    guessable, and a site that could compute a submission's ids could pre-empt its
    ``Nats-Msg-Id`` (see :func:`lodestream.schemas.ids.keyed_id`).
    """
    key = request.idempotency_key
    # Minted together only for the jobs that need a fresh one: one lock, one random read.
    fresh = iter(uuid7s(sum(job.id is None for job in request.jobs) if key is None else 0))
    return [
        job.id
        if job.id is not None
        else (keyed_id(secret, "job", user, key, str(index)) if key is not None else next(fresh))
        for index, job in enumerate(request.jobs)
    ]


def needs_existence_check(request: SubmitRequest) -> bool:
    """Fresh UUIDv7s cannot exist yet; client ids and derived ids may."""
    return request.idempotency_key is not None or any(j.id is not None for j in request.jobs)


def event_id(job_id: uuid.UUID, key: str | None, secret: bytes) -> uuid.UUID:
    return keyed_id(secret, "job.created", str(job_id), key) if key is not None else uuid7()


def event_ids(ids: Sequence[uuid.UUID], key: str | None, secret: bytes) -> list[uuid.UUID]:
    """:func:`event_id` of each job: derived from the key, else fresh UUIDv7s minted together."""
    if key is not None:
        return [event_id(job_id, key, secret) for job_id in ids]
    return uuid7s(len(ids))


def id_secret(settings: Settings) -> bytes:
    """What derived ids are keyed with: ``LODE_API__ID_SECRET``, else the control plane's
    NATS password, which every api instance shares and no site knows."""
    secret = settings.api.id_secret or settings.nats.password
    return secret.get_secret_value().encode() if secret is not None else b""


def named_sites(request: SubmitRequest) -> set[str]:
    return {job.site for job in request.jobs if not job.auto}


def has_auto(request: SubmitRequest) -> bool:
    """Whether a job of the request asks the API to choose its site (then every live site of
    the caller is a candidate, and the catalog loads them all with their loads)."""
    return any(job.auto for job in request.jobs)


def resolve_auto(request: SubmitRequest, catalog: Catalog) -> SubmitRequest:
    """``request`` with each ``site: "auto"`` job placed on a site by its strategy, the choice
    recorded in its ``site_choice``; InvalidInput when no site of the caller can take one."""
    if not has_auto(request):
        return request
    placer = Placer(
        catalog.loads,
        {site: frozenset(apps) for site, apps in catalog.apps.items()},
        catalog.locations,
        catalog.runs,
    )
    jobs: list[JobSubmission] = []
    problems: list[dict[str, Any]] = []
    for index, job in enumerate(request.jobs):
        if not job.auto:
            jobs.append(job)
            continue
        needs = frozenset(spec.location for spec in job.transfers.values())
        choice = placer.place(job.app, job.strategy or DEFAULT_STRATEGY, needs, job)
        if choice is None:
            problems.append(_problem(index, "site", _no_site_message(job, needs, catalog)))
            if len(problems) >= MAX_DETAILS:
                break
            continue
        # model_copy does not validate: the chosen site is one of the caller's live slugs.
        jobs.append(job.model_copy(update={"site": choice.chosen, "site_choice": choice}))
    if problems:
        raise invalid_from_errors(problems, "invalid submission")
    return request.model_copy(update={"jobs": jobs})


def _no_site_message(job: JobSubmission, needs: frozenset[str], catalog: Catalog) -> str:
    defining = sorted(site for site, apps in catalog.apps.items() if job.app in apps)
    if not defining:
        return (
            f'site "{AUTO_SITE}": none of your sites defines app {job.app!r} '
            f"(your sites: {', '.join(sorted(catalog.loads)[:20]) or 'none'})"
        )
    return (
        f'site "{AUTO_SITE}": none of the sites defining app {job.app!r} '
        f"({', '.join(defining[:20])}) declares the transfer locations {sorted(needs)}"
    )


def outside_parents(request: SubmitRequest, ids: Sequence[uuid.UUID]) -> set[uuid.UUID]:
    """Parents that are not jobs of this request: they must already be the caller's jobs."""
    in_request = set(ids)
    return {p for job in request.jobs for p in job.parent_ids if p not in in_request}


def check(request: SubmitRequest, ids: Sequence[uuid.UUID], catalog: Catalog) -> None:
    """Raise NotFound or InvalidInput for the first site, or all other problems, of a request."""
    for job in request.jobs:
        if job.site not in catalog.sites:
            raise NotFound(f"site {job.site!r} not found")
    problems: list[dict[str, Any]] = []
    position: dict[uuid.UUID, int] = {}
    for index, (job, job_id) in enumerate(zip(request.jobs, ids, strict=True)):
        if job_id in position:
            twin = position[job_id]
            problems.append(_problem(index, "id", f"id {job_id} is also used by jobs[{twin}]"))
        position.setdefault(job_id, index)
        apps = catalog.apps.get(job.site)
        if apps is not None:
            problems.extend(_check_app(index, job, apps))
        problems.extend(_check_locations(index, job, catalog.locations.get(job.site, frozenset())))
        problems.extend(_check_paths(index, job))
        for p_index, parent in enumerate(job.parent_ids):
            sibling = position.get(parent)
            if (sibling is None or sibling == index) and parent not in catalog.own_jobs:
                problems.append(_parent_problem(index, p_index, parent, parent in ids))
        if len(problems) >= MAX_DETAILS:
            break
    if problems:
        raise invalid_from_errors(problems, "invalid submission")


def _check_app(
    index: int, job: JobSubmission, apps: Mapping[str, AppInterface]
) -> list[dict[str, Any]]:
    app = apps.get(job.app)
    if app is None:
        known = ", ".join(sorted(apps)[:20])
        return [_problem(index, "app", f"site {job.site!r} has no app {job.app!r} (apps: {known})")]
    if job.calls:
        return _check_calls(index, job, app) + _check_slots(index, job, app)
    parameters, slots = job.parameters.keys(), job.transfers.keys()
    mistyped = _mistyped(index, job, app) if app.types else []
    if (
        not mistyped
        and parameters <= app.parameters
        and app.required_parameters <= parameters
        and slots <= app.slots
        and app.required_slots <= slots
    ):
        return []  # the common case, without the four sorted differences below
    problems = mistyped + [
        _problem(index, "parameters", f"app {job.app!r} at {job.site!r} has no parameter {name!r}")
        for name in sorted(job.parameters.keys() - app.parameters)
    ]
    problems += [
        _problem(index, "parameters", f"app {job.app!r} requires parameter {name!r}")
        for name in sorted(app.required_parameters - job.parameters.keys())
    ]
    return problems + _check_slots(index, job, app)


def _check_slots(index: int, job: JobSubmission, app: AppInterface) -> list[dict[str, Any]]:
    return [
        _problem(index, "transfers", f"app {job.app!r} has no transfer slot {name!r}")
        for name in sorted(job.transfers.keys() - app.slots)
    ] + [
        _problem(index, "transfers", f"app {job.app!r} requires transfer slot {name!r}")
        for name in sorted(app.required_slots - job.transfers.keys())
    ]


def _check_calls(index: int, job: JobSubmission, app: AppInterface) -> list[dict[str, Any]]:
    """Each call's parameters as :func:`_check_app` checks a job's, located by call."""
    if not app.python:
        why = f"app {job.app!r} at {job.site!r} is a shell app: calls are for Python functions"
        return [_problem(index, "calls", why)]
    problems = []
    for number, call in enumerate(job.calls):
        where = f"app {job.app!r} at {job.site!r}: call {number}"
        problems += [_call_problem(index, number, f"{where} has no parameter {name!r}")
                     for name in sorted(call.keys() - app.parameters)]  # fmt: skip
        problems += [_call_problem(index, number, f"{where} lacks required parameter {name!r}")
                     for name in sorted(app.required_parameters - call.keys())]  # fmt: skip
        for name, value in call.items():
            declared = app.types.get(name)
            problem = None if declared is None else type_problem(declared, value)
            if problem is not None:
                msg = f"{where}: parameter {name!r} {problem}"
                problems.append(_call_problem(index, number, msg, "invalid_type"))
        if len(problems) >= MAX_DETAILS:
            break
    return problems


def _call_problem(
    index: int, number: int, msg: str, kind: str = "invalid_reference"
) -> dict[str, Any]:
    return {"loc": ["body", "jobs", index, "calls", number], "msg": msg, "type": kind}


def _check_locations(
    index: int, job: JobSubmission, locations: frozenset[str]
) -> list[dict[str, Any]]:
    """Every slot must stage through a location its site trusts (``site.locations_set``)."""
    if not job.transfers:
        return []
    known = ", ".join(sorted(locations)[:20]) or "none declared"
    return [
        _problem(
            index,
            "transfers",
            f"transfer slot {slot!r}: site {job.site!r} has no transfer location "
            f"{spec.location!r} (its locations: {known})",
        )
        for slot, spec in sorted(job.transfers.items())
        if spec.location not in locations
    ]


def _check_paths(index: int, job: JobSubmission) -> list[dict[str, Any]]:
    """Every slot's remote path must be one that a backend can move (the rule the site's
    backends apply again to what they are given)."""
    return [
        {"loc": ["body", "jobs", index, "transfers", slot, "path"],
         "msg": f"transfer slot {slot!r}: {problem}", "type": "value_error"}
        for slot, spec in sorted(job.transfers.items())
        if (problem := remote_path_problem(spec.path)) is not None
    ]  # fmt: skip


def _parent_problem(
    index: int, p_index: int, parent: uuid.UUID, in_request: bool
) -> dict[str, Any]:
    reason = (
        "is a later job of this request (list parents before their children)"
        if in_request
        else "is neither one of your jobs nor an earlier job of this request"
    )
    return _problem(index, "parent_ids", f"parent {parent} {reason}", p_index)


def _mistyped(index: int, job: JobSubmission, app: AppInterface) -> list[dict[str, Any]]:
    """A problem for each parameter whose value is not of the type its app declares."""
    problems = []
    for name, value in job.parameters.items():
        declared = app.types.get(name)
        problem = None if declared is None else type_problem(declared, value)
        if problem is not None:
            msg = f"app {job.app!r} at {job.site!r}: parameter {name!r} {problem}"
            problems.append(_problem(index, "parameters", msg, name, kind="invalid_type"))
    return problems


def _problem(
    index: int,
    name: str,
    msg: str,
    item: int | str | None = None,
    *,
    kind: str = "invalid_reference",
) -> dict[str, Any]:
    loc: list[str | int] = ["body", "jobs", index, name]
    if item is not None:
        loc.append(item)
    return {"loc": loc, "msg": msg, "type": kind}


def created_runnable(job: JobSubmission, app: AppInterface | None) -> bool:
    """Whether ``job`` is created runnable: nothing for the controller or the site agent to do
    before a pilot may run it (:data:`~lodestream.schemas.states.CREATED_RUNNABLE`).

    No parents to wait for, no transfer items (the fold refuses a runnable job that has any,
    so one with only stage-out items goes the controller's way too) and no ``preprocess``
    hook at its app, as the read model shows the app now. An app whose hooks change later
    changes only the jobs created after the api has seen the change; an app the api does not
    know yet is left to the controller, which decides in log order.
    """
    return app is not None and not (job.parent_ids or job.transfers or app.preprocess)


@dataclass(frozen=True, slots=True)
class Plan:
    """The events to append, and the jobs of the request that a retry already created."""

    to_append: list[JobCreated]
    already: dict[int, Existing]  # request index -> the job as it was created


def build_events(
    request: SubmitRequest,
    ids: Sequence[uuid.UUID],
    catalog: Catalog,
    *,
    user: str,
    now: datetime,
    secret: bytes,
) -> Plan:
    """One ``job.created`` per job, except jobs this very request (a retry) already created.

    Raises Conflict when a job id is taken by a job this request did not create.
    """
    key = request.idempotency_key
    who = actor(user)
    to_append: list[JobCreated] = []
    already: dict[int, Existing] = {}
    conflicts: list[dict[str, Any]] = []
    eids = event_ids(ids, key, secret)
    for index, (job, job_id, eid) in enumerate(zip(request.jobs, ids, eids, strict=True)):
        existing = catalog.existing.get(job_id)
        if existing is not None:
            if existing.owner == user and existing.created_event_id == eid:
                already[index] = existing
            else:
                conflicts.append(
                    _problem(index, "id", f"job {job_id} already exists", kind="taken")
                )
            continue
        data = job
        if created_runnable(job, catalog.apps.get(job.site, {}).get(job.app)):
            # model_copy does not validate: CREATED_RUNNABLE is the one skip the fold accepts.
            data = job.model_copy(update={"skipped": CREATED_RUNNABLE})
        to_append.append(
            JobCreated.create(
                site=job.site,
                aggregate_id=job_id,
                actor=who,
                # A JobSubmission is a JobSpec: passed as-is, it is not validated again, and
                # JobCreated.data serialises by its declared type, so ``id`` never reaches the log.
                data=data,
                event_id=eid,
                occurred_at=now,
            )
        )
    if conflicts:
        raise Conflict(
            f"{conflicts[0]['msg']}"
            f"{f' (and {len(conflicts) - 1} more)' if len(conflicts) > 1 else ''}; "
            "nothing was appended",
            conflicts[:MAX_DETAILS],
        )
    return Plan(to_append, already)
