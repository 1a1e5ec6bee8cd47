"""Every command of README's "Using it" block, as written, against a real `lode up`.

The block is read from README.md, so the test follows it: each command runs in a shell with
the venv's `lode` on PATH, in a home and a working directory of its own, against a stack
started with `lode up` whose state directory is where the commands look (`LODE_STATE_DIR`).
Only what a reader substitutes is substituted: the ids in angle brackets (from the API, the
independent source), the `…` of the example URLs, and `&` (the pilot is started in the
background and stopped at the end). Commands that follow the log forever (`lode watch`,
`--follow`) run for a few seconds and must still be running, with nothing on stderr.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import httpx
import pytest

from tests.fixtures.postgres import postgres_tempdir
from tests.integration.test_embedded_stack import WAIT_S, LodeUp

pytestmark = pytest.mark.slow

README: Final = Path(__file__).parents[2] / "README.md"
FOLLOWERS: Final = ("lode watch", "--follow")
FOLLOW_S: Final = 4.0


def readme_commands() -> list[str]:
    text = README.read_text()
    block = re.search(r"## Using it\s+```bash\n(.*?)```", text, re.S)
    assert block is not None, "README has no 'Using it' block"
    commands: list[str] = []
    for raw in block.group(1).splitlines():
        line = re.sub(r"\s+#\s.*$", "", raw).strip()
        if line and not line.startswith("source "):
            commands += [part.strip() for part in line.split(" ; ")]
    return commands


@pytest.fixture(scope="module")
def stack() -> Iterator[LodeUp]:
    with postgres_tempdir() as root:
        up = LodeUp(root / "state")
        up.start()
        try:
            yield up
        finally:
            if up.proc is not None:
                up.stop()


class Reader:
    """A person at a terminal: a home, a working directory, the stack's state directory."""

    def __init__(self, stack: LodeUp, home: Path) -> None:
        self.stack = stack
        self.home = home
        self.token = json.loads((stack.state / "client.json").read_text())["token"]
        bin_dir = Path(sys.executable).parent
        env = {k: v for k, v in os.environ.items() if not k.startswith("LODE_")}
        self.env = {**env, "HOME": str(home), "PATH": f"{bin_dir}:{env.get('PATH', '')}",
                    "LODE_STATE_DIR": str(stack.state), "COLUMNS": "200"}  # fmt: skip
        self.background: list[subprocess.Popen[str]] = []

    def api(self, path: str, token: str | None = None) -> Any:
        headers = {"Authorization": f"Bearer {token or self.token}"}
        response = httpx.get(f"{self.stack.api_url}{path}", headers=headers, timeout=30)
        assert response.status_code == 200, response.text
        return response.json()

    def run(self, command: str, env: dict[str, str] | None = None) -> str:
        if command.endswith("&"):
            self.background.append(self._spawn(command.removesuffix("&")))
            return ""
        if any(f in command for f in FOLLOWERS):
            proc = self._spawn(command)
            time.sleep(FOLLOW_S)
            assert proc.poll() is None, f"{command!r} ended: {proc.communicate()}"
            proc.send_signal(signal.SIGINT)
            out, err = proc.communicate(timeout=30)
            assert "Traceback" not in err, f"{command!r}: {err}"
            return out
        done = subprocess.run(["bash", "-c", command], cwd=self.home, env=env or self.env,
                              capture_output=True, text=True, timeout=WAIT_S,
                              check=False)  # fmt: skip
        assert done.returncode == 0, (
            f"{command!r} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
        )
        assert "Traceback" not in done.stderr, done.stderr
        return done.stdout

    def _spawn(self, command: str) -> subprocess.Popen[str]:
        return subprocess.Popen(["bash", "-c", f"exec {command}"], cwd=self.home, env=self.env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)  # fmt: skip

    def stop(self) -> None:
        for proc in self.background:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.communicate(timeout=60)


def test_every_readme_command_runs_as_written(stack: LodeUp, tmp_path: Path) -> None:
    reader = Reader(stack, tmp_path)
    (tmp_path / "jobs.yaml").write_text(
        "- {site: mysite, app: eigh, workdir: run/2, parameters: {n: '50'}, tags: {run: '1'}}\n"
    )
    job_id = ""
    alice = ""
    try:
        for written in readme_commands():
            command = written
            if "<batch-id>" in command:
                batches = reader.api("/batch-jobs")
                command = command.replace("<batch-id>", str(batches[0]["id"]))
            if command.startswith("lode job kill <job-id>"):
                # A job to kill must not have ended: one that no pilot of the site can run.
                out = reader.run("lode job submit --site mysite --app eigh -p n=10 --num-nodes 99")
                command = command.replace("<job-id>", out.split()[0])
            if "<job-id>" in command:
                command = command.replace("<job-id>", job_id)
            if command.startswith("lode login"):
                command = command.replace("https://…", stack.api_url).replace(
                    "wss://…", json.loads((stack.state / "sites.json").read_text())["websocket_url"]
                )
                out = reader.run(command, env={**reader.env, "LODE_TOKEN": reader.token})
                continue
            if command.startswith("lode token revoke"):
                # Alice's token (made by `lode user create alice`), not the one every other
                # command here uses.
                (token,) = reader.api("/users/me/tokens", alice)
                command = command.replace("<token-id>", str(token["id"]))
                reader.run(command, env={**reader.env, "LODE_TOKEN": alice})
                gone = httpx.get(f"{stack.api_url}/users/me/tokens", timeout=30,
                                 headers={"Authorization": f"Bearer {alice}"})  # fmt: skip
                assert gone.status_code == 401
                continue
            out = reader.run(command)
            if command.startswith("lode job submit --site mysite"):
                job_id = out.split()[0]
            if command.startswith("lode user create"):
                alice = out.strip().splitlines()[-1]
    finally:
        reader.stop()
    # What the block did, from the API: the eigh job ran to the end.
    assert job_id
    assert reader.api(f"/jobs/{job_id}")["state"] in {"JOB_FINISHED", "KILLED"}
