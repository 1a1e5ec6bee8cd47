"""Headless Chromium driven over the DevTools protocol (aiohttp's websocket client).

``chromium --dump-dom``/``--screenshot`` capture at the load event, before a page's
fetches have answered, and ``--virtual-time-budget`` never ends while an EventSource is
open; a live page needs a browser that stays up while the test looks at it twice.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import shutil
import subprocess
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Final

import aiohttp

from tests.fixtures.ports import free_port
from tests.support.stack import kill_group

START_TIMEOUT_S: Final = 30.0


def chromium_path() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


class Page:
    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self._ws = ws
        self._ids = itertools.count(1)

    async def call(self, method: str, **params: Any) -> dict[str, Any]:
        call_id = next(self._ids)
        await self._ws.send_json({"id": call_id, "method": method, "params": params})
        while True:
            reply = await self._ws.receive_json()
            if reply.get("id") == call_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                result: dict[str, Any] = reply["result"]
                return result

    async def evaluate(self, expression: str) -> Any:
        result = await self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        return result["result"].get("value")

    async def wait_for(self, expression: str, timeout_s: float) -> Any:
        """Until ``expression`` is truthy in the page; its value."""
        async with asyncio.timeout(timeout_s):
            while not (value := await self.evaluate(expression)):
                await asyncio.sleep(0.2)
        return value

    async def screenshot(self, path: Path) -> None:
        shot = await self.call("Page.captureScreenshot", format="png")
        await asyncio.to_thread(path.write_bytes, base64.b64decode(shot["data"]))


@contextlib.asynccontextmanager
async def headless_page(url: str, *, width: int = 1400, height: int = 1100) -> AsyncIterator[Page]:
    binary = chromium_path()
    assert binary is not None, "chromium is missing: run `make ui-deps` (as root)"
    port = free_port()
    # Chromium's helper processes may still be exiting when the profile is removed.
    with tempfile.TemporaryDirectory(prefix="chromium-", ignore_cleanup_errors=True) as profile:
        argv = [
            binary, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
            "--no-first-run", f"--user-data-dir={profile}", f"--remote-debugging-port={port}",
            "--remote-debugging-address=127.0.0.1", f"--window-size={width},{height}",
            "about:blank",
        ]  # fmt: skip
        proc = await asyncio.to_thread(
            subprocess.Popen,
            argv,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # its renderers and helpers go with it
        )
        try:
            async with aiohttp.ClientSession() as http:
                target = await _page_target(http, port)
                async with http.ws_connect(target, max_msg_size=64 << 20) as ws:
                    page = Page(ws)
                    await page.call("Page.enable")
                    await page.call("Page.navigate", url=url)
                    yield page
        finally:
            kill_group(proc)


async def _page_target(http: aiohttp.ClientSession, port: int) -> str:
    async with asyncio.timeout(START_TIMEOUT_S):
        while True:
            with contextlib.suppress(aiohttp.ClientError):
                async with http.get(f"http://127.0.0.1:{port}/json/list") as response:
                    for target in await response.json():
                        if target.get("type") == "page":
                            url: str = target["webSocketDebuggerUrl"]
                            return url
            await asyncio.sleep(0.1)
