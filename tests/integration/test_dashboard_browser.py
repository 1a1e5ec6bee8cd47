"""The dashboard in a real browser (Debian's headless ``chromium``) while a real stack runs jobs.

A stack (nats-server, Postgres, projector, controller, api) and a pilot of site ``alpha``
run sleeper jobs and one that fails. One chromium page opens ``/ui`` and is looked at
twice, seconds apart, without reloading: the numbers it shows (pushed events, stream
position, finished jobs) must have moved, which only the pushed feed can do. Both
screenshots are kept under ``tests/artifacts/`` (ignored by git; the paths are printed).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Final

import pytest

from lodestream.infra.postgres.server import EmbeddedPostgres
from tests.security.attack import api_client
from tests.support.browser import Page, chromium_path, headless_page
from tests.support.processes import terminate
from tests.support.stack import SITE_OWNERS, running_stack

pytestmark = pytest.mark.slow

ARTIFACTS: Final = Path(__file__).resolve().parents[1] / "artifacts"
ADA: Final = SITE_OWNERS["alpha"]
PAGE_TIMEOUT_S: Final = 60.0

if chromium_path() is None and os.geteuid() != 0:
    pytest.skip(
        "chromium is not installed and this run is not root: `sudo make ui-deps`",
        allow_module_level=True,
    )

NUMBERS = """(() => {
  const cell = (k) => document.querySelector(`tr[data-site="alpha"] td[data-k="${k}"]`);
  return {
    pushed: +document.getElementById("pushed").textContent,
    position: +document.getElementById("position").textContent,
    feed: document.getElementById("feed").textContent,
    finished: cell("finished") ? +cell("finished").textContent : -1,
    failures: document.getElementById("failures").textContent,
  };
})()"""


async def look(page: Page, name: str) -> dict[str, Any]:
    ARTIFACTS.mkdir(exist_ok=True)
    png = ARTIFACTS / f"{name}.png"
    await page.screenshot(png)
    assert png.stat().st_size > 10_000, "an empty screenshot"
    print(f"dashboard screenshot: {png}")
    numbers: dict[str, Any] = await page.evaluate(NUMBERS)
    return numbers


async def test_the_dashboard_shows_numbers_that_change_while_jobs_run(
    tmp_path: Path, postgres_server: EmbeddedPostgres
) -> None:
    with running_stack(tmp_path / "stack", postgres_server) as stack:
        pilot = None
        try:
            async with api_client(stack) as api:
                failing = await api.submit(ADA, "alpha", app="fails", parameters={"why": "disk"})
                for n in range(40):
                    await api.submit(ADA, "alpha", wait=False, app="sleeper",
                                     parameters={"seconds": "1"}, tags={"n": str(n)})  # fmt: skip
                url = f"{stack.api_url}/ui#token={stack.tokens[ADA]}"
                async with headless_page(url) as page:
                    await page.wait_for("document.getElementById('feed').textContent === 'live'",
                                        PAGE_TIMEOUT_S)  # fmt: skip
                    pilot = stack.pilot("alpha", "pilot-ui")
                    # No site agent runs here to decide on a retry: the run stays RUN_ERROR.
                    await api.wait_state(ADA, failing, "RUN_ERROR", timeout_s=PAGE_TIMEOUT_S)
                    await page.wait_for(NUMBERS + ".finished > 0", PAGE_TIMEOUT_S)
                    first = await look(page, "dashboard-1")
                    await page.wait_for(NUMBERS + f".finished > {first['finished']}",
                                        PAGE_TIMEOUT_S)  # fmt: skip
                    second = await look(page, "dashboard-2")
        finally:
            if pilot is not None:
                terminate(pilot)

    assert first["feed"] == "live"
    assert first["pushed"] > 0, "the page received events from the feed"
    assert second["pushed"] > first["pushed"]
    assert second["position"] > first["position"]
    assert second["finished"] > first["finished"] > 0
    assert "disk" in second["failures"], "the failed run's cause is shown"
