"""``ApplicationDefinition``: the base class a site author subclasses in the site's ``apps/*.py``.

Apps are defined at the site and only there; the API and users name an app
and pass parameter *values*, which are rendered as quoted shell words. A
class is checked when Python creates it, so a broken app stops ``lode site
start`` with one message instead of failing jobs later.

An app is either a shell command (``command_template`` with ``{{ param }}``
placeholders) or a Python function (a ``run(self, ...)`` method whose
arguments are the parameters, passed as the JSON values the job gave, and
whose return value goes back to the client as JSON). One instance is made per job, with
the job's ``JobContext`` as ``self.job``, and the site calls the hooks on it.
"""

from __future__ import annotations

import sys
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Final, Literal

from lodestream.agents.site.apps.errors import AppDefinitionError
from lodestream.agents.site.apps.spec import (
    AppSpec,
    Parameter,
    TransferSlot,
    build_spec,
    check_hooks,
)

if TYPE_CHECKING:
    from lodestream.schemas.resources import JobSpec

# Hooks the site processing module calls between events; published in App.hooks so the
# controller can skip a step for apps that keep the default.
SITE_HOOKS: Final = ("preprocess", "postprocess", "handle_error", "handle_timeout")


class Decision(StrEnum):
    """What ``handle_error`` / ``handle_timeout`` decide for the job."""

    RETRY = "retry"
    FAIL = "fail"


@dataclass(frozen=True, slots=True, kw_only=True)
class JobContext:
    """The job as its app's hooks see it; ``return_code``/``stderr_tail`` are of the last run."""

    job_id: uuid.UUID
    workdir: Path
    parameters: Mapping[str, Any] = field(default_factory=dict)
    # A job of many calls (``JobSpec.calls``): run() once per entry, in place of parameters.
    calls: tuple[Mapping[str, Any], ...] = ()
    tags: Mapping[str, str] = field(default_factory=dict)
    data: Mapping[str, Any] = field(default_factory=dict)
    attempt: int = 1
    max_attempts: int = 3
    return_code: int | None = None
    stderr_tail: str = ""

    @classmethod
    def from_spec(
        cls,
        job_id: uuid.UUID,
        spec: JobSpec,
        data_dir: Path,
        *,
        attempt: int = 1,
        max_attempts: int = 3,
        return_code: int | None = None,
        stderr_tail: str = "",
    ) -> JobContext:
        """The context of a job handed to the site as a work item (``spec.workdir`` is relative)."""
        return cls(
            job_id=job_id,
            workdir=data_dir / spec.workdir,
            parameters=dict(spec.parameters),
            calls=tuple(dict(call) for call in spec.calls),
            tags=dict(spec.tags),
            data=dict(spec.data),
            attempt=attempt,
            max_attempts=max_attempts,
            return_code=return_code,
            stderr_tail=stderr_tail,
        )


class ApplicationDefinition:
    """Subclass this in ``apps/<file>.py`` at the site.

    ``class Base(ApplicationDefinition, abstract=True)`` declares a shared base
    (hooks, environment) that is not itself an app and is not validated as one.
    """

    name: ClassVar[str]
    description: ClassVar[str]
    command_template: ClassVar[str | None] = None
    parameters: ClassVar[Mapping[str, Parameter | Mapping[str, Any]]] = {}
    environment_variables: ClassVar[Mapping[str, str]] = {}
    cleanup_files: ClassVar[Sequence[str]] = ()
    transfers: ClassVar[Mapping[str, TransferSlot | Mapping[str, Any]]] = {}
    python_exe: ClassVar[str] = sys.executable
    # A Python-function app's jobs run in the pilot's warm workers ("worker"), or each in a
    # fresh interpreter ("process"): for apps that leave state behind that the next job
    # must not see (threads, signal handlers, a CUDA context on another GPU).
    isolation: ClassVar[Literal["worker", "process"]] = "worker"
    # Retries after a failed run; None keeps the site's processing.retry_budget.
    retry_budget: ClassVar[int | None] = None
    # Fields of the site's processing.retry_backoff this app changes (base_s, factor, max_s,
    # jitter), e.g. {"base_s": 60} for an app whose failures are a busy file system.
    retry_backoff: ClassVar[Mapping[str, float]] = {}

    abstract: ClassVar[bool] = True
    spec: ClassVar[AppSpec]
    _declared_parameters: ClassVar[Mapping[str, object]] = {}

    def __init_subclass__(cls, *, abstract: bool = False, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.abstract = abstract
        if "parameters" in cls.__dict__:
            # Kept apart because ``parameters`` is replaced by the normalised form below and a
            # subclass must start again from what the author wrote.
            cls._declared_parameters = cls.__dict__["parameters"]
        if abstract:
            check_hooks(cls)
            return
        if cls.isolation not in ("worker", "process"):
            raise AppDefinitionError(
                f"{cls.__qualname__}.isolation must be 'worker' or 'process', not {cls.isolation!r}"
            )
        cls.spec = build_spec(cls)
        cls.name = cls.spec.name
        cls.description = cls.spec.description
        cls.parameters = dict(cls.spec.parameters)

    def __init__(self, job: JobContext) -> None:
        if type(self).abstract:
            raise AppDefinitionError(f"{type(self).__qualname__} is abstract; it runs no jobs")
        self.job = job

    def shell_preamble(self) -> str:
        """Lines run before the command in the job script, e.g. ``module load``."""
        return ""

    def preprocess(self) -> None:
        """Runs at the site before the job is leased; raise to fail the job."""

    def postprocess(self) -> None:
        """Runs at the site after a successful run; raise to fail the job."""

    def handle_error(self) -> Decision:
        """After a non-zero exit: retry while the retry budget allows."""
        return Decision.RETRY if self.job.attempt < self.job.max_attempts else Decision.FAIL

    def handle_timeout(self) -> Decision:
        """After the run was cut off by the batch job's wall time: run it again."""
        return Decision.RETRY


def defined_hooks(app_cls: type[ApplicationDefinition]) -> tuple[str, ...]:
    """The site hooks ``app_cls`` (or a base of its own) overrides, in ``SITE_HOOKS`` order."""
    return tuple(
        hook
        for hook in SITE_HOOKS
        if getattr(app_cls, hook) is not getattr(ApplicationDefinition, hook)
    )
