"""Retry rules at the site: an app's budget and backoff over the site's, what the site decides
(``job.restart_ready`` with the wait in it), and how a pilot reads the due time."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from lodestream.agents.launcher.work import work_item
from lodestream.agents.site.apps import AppDefinitionError, ApplicationDefinition, Decision
from lodestream.agents.site.processing import Processing
from lodestream.agents.site.retries import RetryRules
from lodestream.agents.site.settings import ProcessingSettings
from lodestream.schemas.codec import encode
from lodestream.schemas.events import JobFailed, JobRestartReady, JobRunErrored, JobRunTimedOut
from lodestream.schemas.events.job import RetryData, RunResultData
from lodestream.schemas.resources import JobSpec
from lodestream.schemas.retry import RetryBackoff, backoff_s

SITE = "alpha"
SITE_BACKOFF = RetryBackoff(base_s=10, factor=2, max_s=600, jitter=0.2)
FAILED_AT = datetime(2026, 3, 4, 5, 6, 7, tzinfo=UTC)


def app(name: str, **attrs: Any) -> type[ApplicationDefinition]:
    return type(name.title(), (ApplicationDefinition,), {"name": name, "command_template": "false",
                                                         **attrs})  # fmt: skip


Plain = app("plain")
Patient = app("patient", retry_budget=1, retry_backoff={"base_s": 120, "jitter": 0})
Stubborn = app("stubborn", retry_budget=0)


class Picky(ApplicationDefinition):
    name = "picky"
    command_template = "false"

    def handle_error(self) -> Decision:
        return Decision.FAIL if self.job.return_code == 2 else super().handle_error()


APPS = {a.spec.name: a for a in (Plain, Patient, Stubborn, Picky)}
RULES = RetryRules.build(ProcessingSettings(retry_budget=3, retry_backoff=SITE_BACKOFF), APPS)


# --- the app's attributes ------------------------------------------------------------------


def test_an_app_keeps_the_sites_rules_unless_it_sets_its_own() -> None:
    assert RULES.of("plain").max_attempts == 4  # the site's budget of 3 retries
    assert RULES.of("plain").backoff == SITE_BACKOFF
    assert RULES.of("patient").max_attempts == 2
    # Only the fields the app names change; the others are the site's.
    assert RULES.of("patient").backoff == RetryBackoff(base_s=120, factor=2, max_s=600, jitter=0)
    assert RULES.of("stubborn").max_attempts == 1
    assert RULES.of("unknown").max_attempts == 4


def test_the_default_budget_is_three_retries() -> None:
    assert RetryRules.build(ProcessingSettings(), {}).site.max_attempts == 4


@pytest.mark.parametrize(
    ("attrs", "message"),
    [
        ({"retry_budget": -1}, "retry_budget must be None .* or an int from 0 to 100"),
        ({"retry_budget": 101}, "retry_budget must be None"),
        ({"retry_budget": True}, "retry_budget must be None"),
        ({"retry_budget": "3"}, "retry_budget must be None"),
        ({"retry_backoff": 5}, "retry_backoff must be a dict"),
        ({"retry_backoff": {"base": 5}}, r"unknown keys \['base'\]; known: base_s, factor"),
        ({"retry_backoff": {"base_s": "5"}}, r"retry_backoff\['base_s'\] must be a finite number"),
        ({"retry_backoff": {"jitter": True}}, r"retry_backoff\['jitter'\] must be a finite"),
        ({"retry_backoff": {"max_s": float("inf")}}, r"must be a finite number"),
    ],
)
def test_a_malformed_retry_attribute_fails_when_the_class_is_defined(
    attrs: dict[str, Any], message: str
) -> None:
    with pytest.raises(AppDefinitionError, match=message):
        app("broken", **attrs)


def test_an_override_that_breaks_the_sites_backoff_names_the_app_at_start() -> None:
    # Each value is a number, so the class is fine; merged with the site's max_s it is not.
    slow = app("slow", retry_backoff={"base_s": 900})
    with pytest.raises(
        AppDefinitionError, match=r"Slow: retry_backoff .* base_s \(900.0\) is more"
    ):
        RetryRules.build(ProcessingSettings(retry_backoff=SITE_BACKOFF), {"slow": slow})
    with pytest.raises(AppDefinitionError, match=r"Slow: .*jitter: Input should be less"):
        RetryRules.build(ProcessingSettings(), {"slow": app("slow", retry_backoff={"jitter": 3})})


# --- what the site decides -----------------------------------------------------------------


def processing(tmp_path: Path) -> Processing:
    return Processing(None, site=SITE, apps=APPS, data_dir=tmp_path, retries=RULES)  # type: ignore[arg-type]


def run_errored(app_name: str, attempt: int, job: uuid.UUID, code: int = 1) -> JobRunErrored:
    spec = JobSpec(site=SITE, app=app_name, workdir="w")
    return JobRunErrored.create(
        site=SITE, aggregate_id=job, actor=f"launcher:{uuid.uuid4()}", occurred_at=FAILED_AT,
        data=RunResultData(return_code=code, stderr_tail="boom", work=spec, attempt=attempt),
    )  # fmt: skip


async def decide(tmp_path: Path, event: JobRunErrored | JobRunTimedOut) -> Any:
    data = event.data
    assert data.work is not None
    return await processing(tmp_path)._decide(event, data.work, APPS[data.work.app])


async def test_a_retry_carries_its_wait_and_due_time(tmp_path: Path) -> None:
    job = uuid.uuid4()
    waits = []
    for attempt in (1, 2, 3):
        outcome = await decide(tmp_path, run_errored("plain", attempt, job))
        assert isinstance(outcome, JobRestartReady)
        data = outcome.data
        assert data.attempt == attempt + 1
        assert data.max_attempts == 4
        assert data.backoff_s == backoff_s(SITE_BACKOFF, job, attempt)
        assert data.retry_at == FAILED_AT + timedelta(seconds=data.backoff_s)
        assert data.reason == "retry after error"
        waits.append(data.backoff_s)
    # 10, 20, 40 s, each shortened by at most the jitter (a fifth).
    assert all(0.8 * c <= w <= c for c, w in zip([10, 20, 40], waits, strict=True)), waits
    last = await decide(tmp_path, run_errored("plain", 4, job))
    assert isinstance(last, JobFailed)
    assert "run error on attempt 4 (retry budget exhausted)" in last.data.reason


async def test_deciding_again_yields_the_very_same_event(tmp_path: Path) -> None:
    cause = run_errored("plain", 2, uuid.uuid4())
    first, again = await decide(tmp_path, cause), await decide(tmp_path, cause)
    assert first.id == again.id
    assert first.data == again.data


async def test_a_timeout_backs_off_like_an_error(tmp_path: Path) -> None:
    job = uuid.uuid4()
    errored = run_errored("plain", 1, job)
    timed_out = JobRunTimedOut.create(
        site=SITE, aggregate_id=job, actor="controller:main", occurred_at=FAILED_AT,
        data=errored.data,
    )  # fmt: skip
    outcome = await decide(tmp_path, timed_out)
    assert isinstance(outcome, JobRestartReady)
    assert outcome.data.reason == "retry after timeout"
    assert outcome.data.backoff_s == backoff_s(SITE_BACKOFF, job, 1) > 0


async def test_the_apps_own_budget_and_backoff_are_used(tmp_path: Path) -> None:
    job = uuid.uuid4()
    first = await decide(tmp_path, run_errored("patient", 1, job))
    assert isinstance(first, JobRestartReady)
    assert first.data.max_attempts == 2
    assert first.data.backoff_s == 120  # its base_s, no jitter
    second = await decide(tmp_path, run_errored("patient", 2, job))
    assert isinstance(second, JobFailed)
    assert "attempt 2 (retry budget exhausted)" in second.data.reason
    never = await decide(tmp_path, run_errored("stubborn", 1, job))
    assert isinstance(never, JobFailed)


async def test_a_hook_that_decides_fail_fails_at_once(tmp_path: Path) -> None:
    outcome = await decide(tmp_path, run_errored("picky", 1, uuid.uuid4(), code=2))
    assert isinstance(outcome, JobFailed)
    assert "handle_error decided FAIL" in outcome.data.reason


# --- what a pilot reads --------------------------------------------------------------------


@dataclass
class Delivery:
    subject: str
    data: bytes
    metadata: Any


def delivered(event: JobRestartReady) -> Delivery:
    return Delivery(
        event.subject, encode(event), SimpleNamespace(sequence=SimpleNamespace(stream=7))
    )


def test_a_pilot_sees_when_a_retry_falls_due() -> None:
    spec = JobSpec(site=SITE, app="plain", workdir="w")
    due = FAILED_AT + timedelta(seconds=30)
    restart = JobRestartReady.create(
        site=SITE, aggregate_id=uuid.uuid4(), actor=f"site:{SITE}",
        data=RetryData(attempt=2, work=spec, backoff_s=30, retry_at=due),
    )  # fmt: skip
    item = work_item(delivered(restart), SITE)
    assert item.not_before == due
    assert item.wait_s(FAILED_AT) == 30
    assert item.wait_s(due) == 0
    assert item.wait_s(due + timedelta(hours=1)) == 0
    # A restart with no due time (every v1 event) is runnable at once.
    at_once = JobRestartReady.create(
        site=SITE, aggregate_id=uuid.uuid4(), actor=f"site:{SITE}",
        data=RetryData(attempt=2, work=spec),
    )  # fmt: skip
    assert work_item(delivered(at_once), SITE).wait_s(FAILED_AT) == 0
