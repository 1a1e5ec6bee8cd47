"""One truth about state: the live views fold with the projector's rule and agree with the API.

A real stack (nats-server, Postgres, projector, controller, api) and a pilot of site
``alpha``. Jobs are created runnable (PREPROCESSED, a skipped step), one has a parent that
fails, one fails its run. Three views follow the run: the fold ``lode watch`` runs from
``since=1``, the same fold seeded from the API's snapshot (as ``lode watch`` starts from
``now``), and the dashboard's live path in a headless chromium. Each is compared by state
with the read model's counts (``GET /ui/api/summary``) once the run is idle, at a position
at or past the snapshot's; then ``lode watch`` itself shows its totals and its filters.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Final

import pytest

from lodestream.client.credential import MonitorCredential
from lodestream.client.live import LiveView
from lodestream.client.watch import watch
from lodestream.infra.postgres.server import EmbeddedPostgres
from lodestream.schemas.states import JobState
from lodestream.services.embedded.credentials import CredentialSync
from tests.security.attack import Api, api_client
from tests.support.browser import chromium_path, headless_page
from tests.support.processes import terminate
from tests.support.stack import SITE_OWNERS, Stack, running_stack

pytestmark = [
    pytest.mark.slow,
    pytest.mark.filterwarnings("ignore::lodestream.client.errors.WatchNotice"),
]

ADA: Final = SITE_OWNERS["alpha"]
WAIT_S: Final = 90.0

PAGE_COUNTS = """(() => {
  const counts = {};
  for (const row of document.querySelectorAll("#states tbody tr[data-state]")) {
    counts[row.dataset.state] = +row.cells[1].textContent;
  }
  const cell = (k) => document.querySelector(`tr[data-site="alpha"] td[data-k="${k}"]`);
  if (cell("finished")) counts.JOB_FINISHED = +cell("finished").textContent;
  if (cell("failed")) counts.FAILED = +cell("failed").textContent;
  return { counts };
})()"""


async def summary(api: Api, **params: Any) -> dict[str, Any]:
    answer = await api.client.get("/ui/api/summary", params=params, headers=api.auth(ADA))
    assert answer.status_code == 200, answer.text
    body: dict[str, Any] = answer.json()
    return body


def api_counts(snapshot: dict[str, Any]) -> Counter[str]:
    return +Counter(snapshot["counts"].get("alpha", {}))


def comparable(counts: Counter[str]) -> Counter[str]:
    """The counts the dashboard shows: non-final states, finished and failed (not KILLED)."""
    return +Counter({s: n for s, n in counts.items() if s != JobState.KILLED})


async def submit(api: Api, jobs: list[dict[str, Any]]) -> list[str]:
    answer = await api.client.post("/jobs", json={"jobs": jobs}, params={"wait": "true"},
                                   headers=api.auth(ADA))  # fmt: skip
    assert answer.status_code == 201, answer.text
    return [job["id"] for job in answer.json()["jobs"]]


def sleepers(count: int, batch: str) -> list[dict[str, Any]]:
    return [
        {"site": "alpha", "app": "sleeper", "workdir": f"{batch}/{n}",
         "parameters": {"seconds": "0"}, "tags": {"batch": batch}}
        for n in range(count)
    ]  # fmt: skip


async def idle_with(api: Api, wanted: Counter[str]) -> dict[str, Any]:
    """The snapshot once the read model holds exactly ``wanted`` at alpha."""
    async with asyncio.timeout(WAIT_S):
        while True:
            snapshot = await summary(api)
            if api_counts(snapshot) == wanted:
                return snapshot
            await asyncio.sleep(0.2)


async def settled(read: Any, wanted: Counter[str]) -> Counter[str]:
    """What ``read()`` shows once it equals ``wanted``, or when WAIT_S has passed: the run
    is idle, so a view that folds right reaches the read model's counts and stays there."""
    deadline = asyncio.get_running_loop().time() + WAIT_S
    while True:
        shown: Counter[str] = await read()
        if shown == wanted or asyncio.get_running_loop().time() > deadline:
            return shown
        await asyncio.sleep(0.1)


@contextlib.asynccontextmanager
async def following(
    view: LiveView, credential: MonitorCredential, since: int
) -> AsyncIterator[None]:
    async def run() -> None:
        async with watch(credential, ["alpha"], since=since) as w:
            async for item in w:
                view.apply(item, time.monotonic())

    task = asyncio.create_task(run())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def credential_for(stack: Stack, api: Api, path: Path) -> MonitorCredential:
    credential = MonitorCredential.new(stack.websocket_url, stack.ca_file)
    answer = await api.client.put("/users/me/monitoring-key", headers=api.auth(ADA),
                                  json={"public_key": credential.public_key})  # fmt: skip
    assert answer.status_code == 200, answer.text
    credential.save(path)
    sync = CredentialSync(stack.nats, stack.database_url, stack.control_user,
                          stack.control_password)  # fmt: skip
    async with asyncio.timeout(WAIT_S):
        while not await asyncio.to_thread(sync.sync_once):
            await asyncio.sleep(0.2)
    return credential


async def test_live_views_agree_with_the_api_by_state(
    tmp_path: Path, postgres_server: EmbeddedPostgres
) -> None:
    browser = chromium_path() is not None
    with running_stack(tmp_path / "stack", postgres_server) as stack:
        pilot = None
        try:
            async with api_client(stack) as api, contextlib.AsyncExitStack() as views:
                credential = await credential_for(stack, api, tmp_path / "monitor.json")
                replayed = LiveView.of(["alpha"])
                await views.enter_async_context(following(replayed, credential, since=1))
                page = None
                if browser:
                    url = f"{stack.api_url}/ui#token={stack.tokens[ADA]}"
                    page = await views.enter_async_context(headless_page(url))
                    await page.wait_for("document.getElementById('feed').textContent === 'live'",
                                        WAIT_S)  # fmt: skip

                # Created runnable, a parent and its child, a run that fails: no pilot yet.
                await submit(api, sleepers(6, "a"))
                failing = {"site": "alpha", "app": "fails", "workdir": "p",
                           "parameters": {"why": "disk"}}  # fmt: skip
                [parent] = await submit(api, [failing])
                child = {**sleepers(1, "c")[0], "parent_ids": [parent]}
                await submit(api, [child])
                waiting = Counter({"PREPROCESSED": 7, "AWAITING_PARENTS": 1})
                first = await idle_with(api, waiting)
                seeded = LiveView.of(["alpha"])
                start = seeded.seed(first)
                await views.enter_async_context(following(seeded, credential, since=start + 1))
                await compare(first, replayed, seeded, page)

                pilot = stack.pilot("alpha", "pilot-live")
                # No site agent decides on a retry: the failed run stays RUN_ERROR, its child waits.
                done = Counter({"JOB_FINISHED": 6, "RUN_ERROR": 1, "AWAITING_PARENTS": 1})
                second = await idle_with(api, done)
                await compare(second, replayed, seeded, page)
        finally:
            if pilot is not None:
                terminate(pilot)


async def compare(
    snapshot: dict[str, Any], replayed: LiveView, seeded: LiveView, page: Any
) -> None:
    wanted = api_counts(snapshot)
    for view in (replayed, seeded):

        async def folded(view: LiveView = view) -> Counter[str]:
            return +Counter({s.value: n for s, n in view.sites["alpha"].counts().items()})

        assert await settled(folded, wanted) == wanted
    assert seeded.sites["alpha"].last_seq >= snapshot["position"]
    if page is None:
        return

    async def shown() -> Counter[str]:
        return +Counter((await page.evaluate(PAGE_COUNTS))["counts"])

    assert await settled(shown, comparable(wanted)) == comparable(wanted)


async def test_lode_watch_shows_totals_from_the_start_and_filters(
    tmp_path: Path, postgres_server: EmbeddedPostgres
) -> None:
    with running_stack(tmp_path / "stack", postgres_server) as stack:
        pilot = stack.pilot("alpha", "pilot-watch")
        proc = None
        try:
            async with api_client(stack) as api:
                await submit(api, sleepers(3, "b") + sleepers(2, "other"))
                await idle_with(api, Counter({"JOB_FINISHED": 5}))
                credential = await credential_for(stack, api, tmp_path / "monitor.json")
                log_file = tmp_path / "watch.log"
                env = {**os.environ, "LODE_API_URL": stack.api_url,
                       "LODE_TOKEN": stack.tokens[ADA], "COLUMNS": "220"}  # fmt: skip
                argv = [sys.executable, "-m", "lodestream.client.cli.main", "watch",
                        "--app", "sleeper", "--tag", "batch:b",
                        "--credential", str(tmp_path / "monitor.json"),
                        "--log-file", str(log_file),
                        "--state-dir", str(tmp_path / ".lode")]  # fmt: skip
                assert credential.public_key
                proc = subprocess.Popen(  # noqa: ASYNC220 - it runs beside this loop's stack
                    argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
                )
                await asyncio.sleep(3)  # it has taken its snapshot and started watching
                await submit(api, sleepers(2, "b") + sleepers(4, "other"))
                await idle_with(api, Counter({"JOB_FINISHED": 11}))
                await asyncio.sleep(2)  # it redraws meanwhile; the last frame is printed at exit
                proc.send_signal(signal.SIGINT)
                out, err = await asyncio.to_thread(proc.communicate, timeout=30)
        finally:
            terminate(pilot)
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.communicate()
    text = out.decode()
    assert proc.returncode == 0, text + err.decode()
    assert "(app sleeper, batch:b)" in text
    # site | backlog | running | done/s | finished | failed | events | last seq
    [row] = [line for line in text.splitlines()[-40:] if re.match(r"^\W*alpha\b", line)][-1:]
    cells = [c.strip() for c in re.split(r"[│|┃]", row) if c.strip()]
    assert cells[0] == "alpha"
    assert (cells[4], cells[5]) == ("5", "0"), row  # 3 finished before it began, 2 while on
    assert "WatchNotice" not in text + err.decode()
