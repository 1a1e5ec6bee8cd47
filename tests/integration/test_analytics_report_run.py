"""The HTML report of a real mixed run, read back from ``lode analytics export``.

A stack, the site's agent (it decides retries: one per job) and two pilots of 2 nodes x 2
cores run sleepers submitted at a steady pace, two jobs that fail once and then succeed,
two apps that fail for good with different exit codes (3 and 4) and stderr lines, and a
chain of three. The log is exported as a user does, and ``lode analytics report`` of the
copy must hold every section and every image.

With ``LODE_REPORT_RECORDING=path`` the export is also copied there: that is how
``tests/data/analytics/report-run.jsonl`` (the run behind ``docs/report/*.png``, drawn by
``tools/report_figures.py``) was recorded.
"""

from __future__ import annotations

import asyncio
import html
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Final

import pytest

from lodestream.infra.postgres.server import EmbeddedPostgres
from tests.integration.test_analytics_live import lode, monitoring_credential
from tests.security.attack import Api, api_client
from tests.support.processes import terminate
from tests.support.site import make_site_dir
from tests.support.stack import SITE_OWNERS, Stack, running_stack

pytestmark = pytest.mark.slow

ADA: Final = SITE_OWNERS["alpha"]
SLEEPERS: Final = 36
PACE_S: Final = 0.25  # one sleeper submitted every PACE_S: a steady middle for Little's law
WAIT_S: Final = 120.0
# A second app that fails for good, with its own exit code and stderr line.
CRASHES: Final = '''\
from lodestream.agents.site.apps import ApplicationDefinition


class Crashes(ApplicationDefinition):
    """Fails for good with exit code 4 and a message on stderr."""

    name = "crashes"
    command_template = "echo error: {{ why }} >&2; exit 4"
'''
SECTIONS: Final = (
    "Headline figures", "Table 1", "Pilot overhead", "Little's law", "Failures by app",
    "Utilization", "Pilot timelines", "Jobs in each state",
)  # fmt: skip
IMAGES: Final = ("states.png", "throughput.png", "utilization.png", "pilots.png",
                 "latency.png", "backlog.png", "failures.png")  # fmt: skip


def site_dir(stack: Stack, name: str, processing: dict[str, object] | None = None) -> Path:
    # A pilot of 2 nodes x 2 cores: two sleepers (node_packing_count 2) share a node.
    directory = make_site_dir(
        stack.root / "sites" / name, "alpha", wss_url=stack.websocket_url,
        ca_file=stack.ca_file, seed_file=stack.seed_files["alpha"], processing=processing,
        virtual_nodes=2, cores_per_node=2,
    ).directory  # fmt: skip
    (directory / "apps" / "crashes.py").write_text(CRASHES)
    return directory


def start(stack: Stack, name: str, *argv: str) -> subprocess.Popen[bytes]:
    with stack.log_path(name).open("ab") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "lodestream.client.cli.main", *argv],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip


async def wait_for_apps(api: Api) -> None:
    async with asyncio.timeout(WAIT_S):
        while True:
            response = await api.client.get(
                "/apps", params={"site": "alpha"}, headers=api.auth(ADA)
            )
            names = {a["name"] for a in response.json()} if response.status_code == 200 else set()
            if {"sleeper", "flaky", "fails", "crashes"} <= names:
                return
            await asyncio.sleep(0.2)


async def workload(stack: Stack) -> None:
    async with api_client(stack) as api:
        await wait_for_apps(api)
        failing = [
            await api.submit(ADA, "alpha", wait=False, app="fails", parameters={"why": why})
            for why in ("disk full", "disk full")
        ]
        failing += [
            await api.submit(ADA, "alpha", wait=False, app="crashes", parameters={"why": why})
            for why in ("out of memory", "out of memory")
        ]
        finishing = [await api.submit(ADA, "alpha", wait=False, app="flaky",
                                      parameters={"tag": str(i)}) for i in range(2)]  # fmt: skip
        parent: uuid.UUID | None = None
        for _ in range(3):
            parents = [str(parent)] if parent is not None else []
            # wait: a parent must be projected before its child names it.
            parent = await api.submit(ADA, "alpha", app="sleeper", parent_ids=parents,
                                      parameters={"seconds": "0.8"})  # fmt: skip
            finishing.append(parent)
        for i in range(SLEEPERS):
            seconds = f"{0.6 + 0.3 * ((i * 7) % 5):.1f}"
            finishing.append(await api.submit(ADA, "alpha", wait=False, app="sleeper",
                                              node_packing_count=2,
                                              parameters={"seconds": seconds}))  # fmt: skip
            await asyncio.sleep(PACE_S)
        for job in finishing:
            await api.wait_state(ADA, job, "JOB_FINISHED", timeout_s=WAIT_S)
        for job in failing:
            await api.wait_state(ADA, job, "FAILED", timeout_s=WAIT_S)


def test_the_report_of_a_mixed_run_has_every_section_and_image(
    tmp_path: Path, postgres_server: EmbeddedPostgres
) -> None:
    with running_stack(tmp_path / "stack", postgres_server) as stack:
        agent = start(stack, "agent", "site", "start",
                      str(site_dir(stack, "agent", processing={"retry_budget": 1})))  # fmt: skip
        pilots = [
            start(stack, name, "launcher", "--site", str(site_dir(stack, name)),
                  "--wall-time-min", "10")
            for name in ("pilot-a", "pilot-b")
        ]  # fmt: skip
        try:
            asyncio.run(workload(stack))
        finally:
            for pilot in pilots:
                terminate(pilot)  # each closes its session on the way out
            terminate(agent)
        credential = tmp_path / "monitor.json"
        monitoring_credential(stack, credential)
        copy = tmp_path / "run.jsonl"
        lode(stack, "export", "--out", str(copy), "--credential", str(credential),
             "--state-dir", str(tmp_path / ".lode"))  # fmt: skip
    recording = os.environ.get("LODE_REPORT_RECORDING")
    if recording:
        shutil.copy(copy, recording)
    out = tmp_path / "report"
    argv = [sys.executable, "-m", "lodestream.client.cli.main", "analytics", "report",
            "--from-file", str(copy), "--out", str(out)]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    page = html.unescape((out / "index.html").read_text())
    for section in SECTIONS:
        assert section in page, section
    for image in IMAGES:
        assert (out / image).stat().st_size > 0, image
        assert f'src="{image}"' in page, image
    assert "out of memory" in page
    assert "disk full" in page
