"""The SDK's typed reads: the API's own response models, instead of dicts.

``Job``, ``JobDetail``, ``JobEvent``, ``Site``, ``App``, ``BatchJob``, ``Transfer`` and
``RunResult`` are the pydantic models the API's OpenAPI document describes
(``services/api/models.py``, which imports neither FastAPI nor SQLAlchemy at run time), so
a field the API adds reaches both at once. The dict-returning methods stay as they were;
each typed method is named for what it returns::

    for job in lode.jobs(state="JOB_FINISHED"):     # Iterator[Job]
        print(job.id, job.parameters, job.updated_at)
    lode.result(job.id).result                      # RunResult: a Python app's return value

(``RunResult`` is what ``GET /jobs/{id}/result`` says of a job; the executor's
:class:`~lodestream.client.futures.JobResult` is what a shell app's future resolves to.)
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, Final, Protocol

if TYPE_CHECKING:
    from lodestream.services.api.models import AppOut as App
    from lodestream.services.api.models import BatchJobOut as BatchJob
    from lodestream.services.api.models import JobDetail
    from lodestream.services.api.models import JobEventOut as JobEvent
    from lodestream.services.api.models import JobOut as Job
    from lodestream.services.api.models import JobResultOut as RunResult
    from lodestream.services.api.models import SiteOut as Site
    from lodestream.services.api.models import TransferItemOut as Transfer

# The API's models load the event models, half a second that every `lode` command (pilots
# and agents included) would pay at start: they are imported when a typed read is first made.
MODELS: Final = "lodestream.services.api.models"
_NAMES: Final = {
    "App": "AppOut", "BatchJob": "BatchJobOut", "Job": "JobOut", "JobDetail": "JobDetail",
    "JobEvent": "JobEventOut", "RunResult": "JobResultOut", "Site": "SiteOut",
    "Transfer": "TransferItemOut",
}  # fmt: skip


def __getattr__(name: str) -> Any:
    if name in _NAMES:
        return getattr(importlib.import_module(MODELS), _NAMES[name])
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "App", "BatchJob", "Job", "JobDetail", "JobEvent", "RunResult", "Site", "Transfer",
    "TypedReads",
]  # fmt: skip

Json = dict[str, Any]


class _Reads(Protocol):
    """The dict-returning methods of ``LodeClient`` the typed ones are made from."""

    def get_job(self, job_id: str) -> Json: ...
    def list_jobs(self, *, page_size: int = 500, **filters: Any) -> Iterator[Json]: ...
    def job_events(self, job_id: str) -> list[Json]: ...
    def job_result(self, job_id: str) -> Json: ...
    def job_results(self, job_ids: Sequence[str]) -> Json: ...
    def events_page(self, after_seq: int = 0, limit: int = 1000) -> Json: ...
    def list_sites(self) -> list[Json]: ...
    def list_apps(self, site: str | None = None) -> list[Json]: ...
    def list_batch_jobs(
        self, site: str | None = None, *, state: Sequence[str] = (), limit: int = 100
    ) -> list[Json]: ...
    def get_batch_job(self, batch_id: str) -> Json: ...
    def site_transfers(
        self,
        site: str,
        *,
        state: Sequence[str] = (),
        direction: str | None = None,
        job_id: str | None = None,
        limit: int = 100,
    ) -> list[Json]: ...


class TypedReads:
    """Typed twins of ``LodeClient``'s reads; mixed into ``LodeClient`` (and so into
    ``AsyncLodeClient``, where each is awaited)."""

    def job(self: _Reads, job_id: str) -> JobDetail:
        """One job (:meth:`get_job`), with its transfer items."""
        from lodestream.services.api.models import JobDetail  # noqa: PLC0415

        return JobDetail.model_validate(self.get_job(str(job_id)))

    def jobs(self: _Reads, *, page_size: int = 500, **filters: Any) -> Iterator[Job]:
        """Your jobs matching ``filters``, as :meth:`list_jobs` pages through them."""
        from lodestream.services.api.models import JobOut as Job  # noqa: PLC0415

        for item in self.list_jobs(page_size=page_size, **filters):
            yield Job.model_validate(item)

    def job_history(self: _Reads, job_id: str) -> list[JobEvent]:
        """One job's events, oldest first (:meth:`job_events`)."""
        from lodestream.services.api.models import JobEventOut as JobEvent  # noqa: PLC0415

        return [JobEvent.model_validate(e) for e in self.job_events(str(job_id))]

    def result(self: _Reads, job_id: str) -> RunResult:
        """What the job's newest run came to (:meth:`job_result`)."""
        from lodestream.services.api.models import JobResultOut as RunResult  # noqa: PLC0415

        return RunResult.model_validate(self.job_result(str(job_id)))

    def results(self: _Reads, job_ids: Sequence[str]) -> list[RunResult]:
        """Up to 5,000 jobs' results in one request; ids that are not your jobs are left out
        (:meth:`job_results` names them)."""
        from lodestream.services.api.models import JobResultOut as RunResult  # noqa: PLC0415

        page = self.job_results([str(i) for i in job_ids])
        return [RunResult.model_validate(r) for r in page["results"]]

    def events(self: _Reads, after_seq: int = 0, limit: int = 1000) -> list[JobEvent]:
        """One page of your job events after ``after_seq`` (:meth:`events_page`)."""
        from lodestream.services.api.models import JobEventOut as JobEvent  # noqa: PLC0415

        return [JobEvent.model_validate(e) for e in self.events_page(after_seq, limit)["items"]]

    def sites(self: _Reads) -> list[Site]:
        """Your sites (:meth:`list_sites`)."""
        from lodestream.services.api.models import SiteOut as Site  # noqa: PLC0415

        return [Site.model_validate(s) for s in self.list_sites()]

    def apps(self: _Reads, site: str | None = None) -> list[App]:
        """The apps your sites registered, each with its version and any load error."""
        from lodestream.services.api.models import AppOut as App  # noqa: PLC0415

        return [App.model_validate(a) for a in self.list_apps(site)]

    def batch_jobs(
        self: _Reads, site: str | None = None, *, state: Sequence[str] = (), limit: int = 100
    ) -> list[BatchJob]:
        """Your pilot batch jobs, newest first (:meth:`list_batch_jobs`)."""
        from lodestream.services.api.models import BatchJobOut as BatchJob  # noqa: PLC0415

        return [BatchJob.model_validate(b) for b in self.list_batch_jobs(site, state=state,
                                                                         limit=limit)]  # fmt: skip

    def batch_job(self: _Reads, batch_id: str) -> BatchJob:
        """One pilot batch job (:meth:`get_batch_job`)."""
        from lodestream.services.api.models import BatchJobOut as BatchJob  # noqa: PLC0415

        return BatchJob.model_validate(self.get_batch_job(str(batch_id)))

    def transfers(
        self: _Reads,
        site: str,
        *,
        state: Sequence[str] = (),
        direction: str | None = None,
        job_id: str | None = None,
        limit: int = 100,
    ) -> list[Transfer]:
        """A site's transfer items (:meth:`site_transfers`, same filters)."""
        from lodestream.services.api.models import TransferItemOut as Transfer  # noqa: PLC0415

        items = self.site_transfers(
            site, state=state, direction=direction, job_id=job_id, limit=limit
        )
        return [Transfer.model_validate(t) for t in items]
