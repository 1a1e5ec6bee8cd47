"""Pilot batch-job events: requested → submitted → queued → running → finished.

The lifecycle these events make, as data, is :mod:`lodestream.schemas.batch`.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, ClassVar, Final, Literal

from pydantic import AfterValidator, Field, StringConstraints

from lodestream.schemas.envelope import EXACT_VERSION, Event, EventData
from lodestream.schemas.resources import (
    INT32_MAX,
    INT32_MIN,
    PRINTABLE_PATTERN,
    TagKey,
    TagValue,
    Text,
)
from lodestream.schemas.upcast import upcaster

MAX_WALL_TIME_MIN: Final = 60 * 24 * 365
MAX_NODES: Final = 1_000_000
MAX_OPTIONS: Final = 32
# A scheduler option's name becomes `--name=value` (Slurm), `-l name=value` (PBS) or
# `-name value` (LSF): a letter first, so it can never be read as a different flag.
SCHEDULER_OPTION_PATTERN: Final = r"^[A-Za-z][A-Za-z0-9_-]{0,63}$"
# A queue or project is the value of one flag and one script directive: a single printable
# word that cannot read as an option.
SCHEDULER_WORD_PATTERN: Final = r"^(?:[^\s\x00-\x1f\x7f-\x9f-][^\s\x00-\x1f\x7f-\x9f]{0,127})?$"
SCHEDULER_NAME_PATTERN: Final = r"^[a-z0-9_-]{0,32}$"

# What a value may be wherever it reaches a scheduler, whose directive lines (#SBATCH, #PBS,
# #BSUB, #COBALT, #flux:) it splits into words on whitespace, honouring quotes, backslashes and
# '#' comments, and a shell that may expand it: letters, digits and `_.,:=+/@%`, and '-'
# anywhere but first (a word that starts with '-' is an option where a flag's value is the next
# word). Nothing else, so no value can end a word, a line or a directive, or start one.
SCHEDULER_VALUE_CHARS: Final = "A-Za-z0-9_.,:=+/@%"
SCHEDULER_VALUE_PATTERN: Final = rf"^(?:[{SCHEDULER_VALUE_CHARS}][{SCHEDULER_VALUE_CHARS}-]*)?$"
SCHEDULER_VALUE_RULE: Final = "letters, digits and '_.,:=+/@%-', not starting with '-'"
_SCHEDULER_VALUE: Final = re.compile(SCHEDULER_VALUE_PATTERN)


def scheduler_value_problem(value: str) -> str | None:
    """Why ``value`` cannot reach a scheduler as one word of data; None if it can."""
    if _SCHEDULER_VALUE.fullmatch(value):
        return None
    if value.startswith("-"):
        return "starts with '-', so it could be read as an option"
    bad = next(c for c in value if not _SCHEDULER_VALUE.fullmatch("a" + c))
    return f"{bad!r} is not one of {SCHEDULER_VALUE_RULE}"


def _renderable(value: str) -> str:
    problem = scheduler_value_problem(value)
    if problem is not None:
        raise ValueError(f"cannot reach the scheduler as one word: {problem}")
    return value


SchedulerWord = Annotated[str, StringConstraints(pattern=SCHEDULER_WORD_PATTERN)]
# What a request may ask for through the API, which refuses (422) what no scheduler could be
# handed as data. Events keep the looser types above, so that an event appended before this rule
# still reads; the site agent refuses such a request when it renders it (batch.submit_failed).
RenderableWord = Annotated[str, StringConstraints(max_length=128), AfterValidator(_renderable)]
RenderableValue = Annotated[str, StringConstraints(max_length=1024), AfterValidator(_renderable)]
OptionName = Annotated[str, StringConstraints(pattern=SCHEDULER_OPTION_PATTERN)]
# One line of a batch script directive: no line break, no control character.
OptionValue = Annotated[str, StringConstraints(max_length=1024, pattern=PRINTABLE_PATTERN)]
SchedulerName = Annotated[str, StringConstraints(pattern=SCHEDULER_NAME_PATTERN)]


class BatchRequestData(EventData):
    """A pilot batch job to submit. ``options`` are scheduler-native settings (Slurm
    ``--qos=debug`` is ``{"qos": "debug"}``); a site passes only the names it allows
    (``scheduler.request_options`` in its settings). ``filter_tags`` restrict the pilot to
    jobs carrying these tags."""

    num_nodes: int = Field(ge=1, le=MAX_NODES)
    wall_time_min: int = Field(ge=1, le=MAX_WALL_TIME_MIN)
    queue: SchedulerWord = ""
    project: SchedulerWord = ""
    job_mode: Literal["serial", "mpi"] = "mpi"
    filter_tags: dict[TagKey, TagValue] = Field(default_factory=dict, max_length=64)
    options: dict[OptionName, OptionValue] = Field(default_factory=dict, max_length=MAX_OPTIONS)


class BatchSubmittedData(EventData):
    scheduler_id: Annotated[str, StringConstraints(min_length=1, max_length=255)]
    scheduler: SchedulerName = ""  # which adapter: slurm, pbs, local, ...


class BatchFinishedData(EventData):
    """How the batch job ended: the script's ``exit_code``, the scheduler's final ``state``
    (a :class:`~lodestream.schemas.resources.SchedulerState` value, e.g. ``walltime_expired``)
    and, in ``reason``, the scheduler's words or why the site concluded it ended."""

    exit_code: int | None = Field(None, ge=INT32_MIN, le=INT32_MAX)
    state: Text = ""
    reason: Text = ""


class BatchReasonData(EventData):
    reason: Text = ""


class BatchJobRequested(Event):
    event_type: ClassVar[str] = "batch.requested"
    type: Literal["batch.requested"] = "batch.requested"
    v: Annotated[Literal[2], EXACT_VERSION] = 2
    data: BatchRequestData


@upcaster("batch.requested", 1)
def _requested_v1(document: dict[str, Any]) -> dict[str, Any]:
    # v2 added data.options (none in v1) and bounded queue and project to one word.
    return document


class BatchJobSubmitted(Event):
    event_type: ClassVar[str] = "batch.submitted"
    type: Literal["batch.submitted"] = "batch.submitted"
    v: Annotated[Literal[2], EXACT_VERSION] = 2
    data: BatchSubmittedData


@upcaster("batch.submitted", 1)
def _submitted_v1(document: dict[str, Any]) -> dict[str, Any]:
    # v2 added data.scheduler, the adapter's name; v1 did not say.
    return document


class BatchJobQueued(Event):
    event_type: ClassVar[str] = "batch.queued"
    type: Literal["batch.queued"] = "batch.queued"
    v: Annotated[Literal[1], EXACT_VERSION] = 1
    data: BatchReasonData = BatchReasonData()


class BatchJobRunning(Event):
    event_type: ClassVar[str] = "batch.running"
    type: Literal["batch.running"] = "batch.running"
    v: Annotated[Literal[1], EXACT_VERSION] = 1
    data: BatchReasonData = BatchReasonData()


class BatchJobFinished(Event):
    event_type: ClassVar[str] = "batch.finished"
    type: Literal["batch.finished"] = "batch.finished"
    v: Annotated[Literal[1], EXACT_VERSION] = 1
    data: BatchFinishedData


class BatchJobSubmitFailed(Event):
    event_type: ClassVar[str] = "batch.submit_failed"
    type: Literal["batch.submit_failed"] = "batch.submit_failed"
    v: Annotated[Literal[1], EXACT_VERSION] = 1
    data: BatchReasonData


class BatchJobDeletionRequested(Event):
    event_type: ClassVar[str] = "batch.deletion_requested"
    type: Literal["batch.deletion_requested"] = "batch.deletion_requested"
    v: Annotated[Literal[1], EXACT_VERSION] = 1
    data: BatchReasonData = BatchReasonData()


BATCH_EVENTS: tuple[type[Event], ...] = (
    BatchJobRequested,
    BatchJobSubmitted,
    BatchJobQueued,
    BatchJobRunning,
    BatchJobFinished,
    BatchJobSubmitFailed,
    BatchJobDeletionRequested,
)
