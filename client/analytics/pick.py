"""Which messages a copy of the log keeps when ``lode analytics export`` is asked for some jobs.

The copy is selected as every analysis selects (:class:`Selection`): a job by its
``job.created`` (app, tags, created no later than ``until``), and each later event of a
picked job with it, so that its timeline in the copy is whole. Everything that is not a
job's event (pilot sessions, batch jobs, apps, sites) is kept: an analysis of the copy
clips those to its own window, and a session that opened before ``until`` may close after.

A ``job.created`` the shared rule refuses is kept as it is, so the analysis of the copy
counts and lists the refusal as one of the log would; nothing of its job follows it.
"""

from __future__ import annotations

import uuid

from lodestream.client.analytics.intake import Raw
from lodestream.client.analytics.selection import Selection
from lodestream.schemas.errors import SchemaError
from lodestream.schemas.events.job import JobCreated
from lodestream.schemas.subjects import parse_event_subject
from lodestream.schemas.trust import event_from_message


class JobPick:
    """Decides, message by message and in log order, what a filtered copy keeps."""

    def __init__(self, selection: Selection) -> None:
        self._selection = selection
        self._picked: set[str] = set()

    @staticmethod
    def needed(selection: Selection) -> bool:
        """Whether ``selection`` narrows the jobs (sites and the start are the reader's)."""
        return bool(selection.apps or selection.tags or selection.until is not None)

    def keeps(self, raw: Raw) -> bool:
        try:
            subject = parse_event_subject(raw.subject)
        except SchemaError:
            return True  # no event of a job: the analysis refuses it and says so
        if subject.kind != "job":
            return True
        if subject.name != "created":
            return _canonical(subject.aggregate_id) in self._picked
        return self._created(raw)

    def _created(self, raw: Raw) -> bool:
        try:
            event = event_from_message(raw.subject, raw.data)
        except SchemaError:
            return True
        # The rule matches the type to the subject; anything else is kept for it to judge.
        if isinstance(event, JobCreated) and not self._selection.admits_job(event):
            return False
        self._picked.add(str(event.aggregate_id))
        return True


def _canonical(aggregate_id: str) -> str:
    """The id as ``str(UUID)`` writes it, whatever case the subject spelt it in."""
    try:
        return str(uuid.UUID(aggregate_id))
    except ValueError:
        return aggregate_id
