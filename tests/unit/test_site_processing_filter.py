"""The processing module tells from the subject and app name which deliveries need no work."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pytest

from lodestream.agents.site.apps import ApplicationDefinition
from lodestream.agents.site.processing import Processing
from lodestream.agents.site.retries import RetryRules
from lodestream.agents.site.settings import ProcessingSettings


class Plain(ApplicationDefinition):
    name = "plain"
    command_template = "/bin/true"


class Cleans(ApplicationDefinition):
    name = "cleans"
    command_template = "/bin/true"
    cleanup_files = ["*.tmp"]


class Post(ApplicationDefinition):
    name = "post"
    command_template = "/bin/true"

    def postprocess(self) -> None:
        return None


@dataclass
class Delivery:
    subject: str
    data: bytes


def delivery(kind: str, app: Any) -> Delivery:
    job = uuid.uuid4()
    body = {"type": f"job.{kind}", "data": {"work": {"app": app}}}
    return Delivery(f"evt.s.job.{job}.{kind}", orjson.dumps(body))


@pytest.fixture
def processing(tmp_path: Path) -> Processing:
    apps = {a.spec.name: a for a in (Plain, Cleans, Post)}
    retries = RetryRules.build(ProcessingSettings(retry_budget=1), apps)
    return Processing(None, site="s", apps=apps, data_dir=tmp_path, retries=retries)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kind", "app", "skipped"),
    [
        ("run_done", "plain", True),
        ("finished", "plain", True),
        ("run_done", "cleans", True),
        ("finished", "cleans", False),  # the cleaner has files to remove
        ("run_done", "post", False),  # postprocess() runs
        ("finished", "post", True),
        ("run_done", "unknown", False),  # the full path fails the job with the reason
        ("run_errored", "plain", False),  # handle_error() decides on a retry
        ("run_timed_out", "plain", False),
        ("staged_in", "plain", False),
        ("run_done", 42, False),
    ],
)
def test_only_deliveries_without_a_hook_are_skipped(
    processing: Processing, kind: str, app: Any, skipped: bool
) -> None:
    assert processing._nothing_to_do(delivery(kind, app)) is skipped


@pytest.mark.parametrize("data", [b"not json", b"[]", b'{"data": null}', b'{"data": {"work": 1}}'])
def test_malformed_documents_take_the_full_path(processing: Processing, data: bytes) -> None:
    assert processing._nothing_to_do(Delivery("evt.s.job.x.run_done", data)) is False
