"""A lodestream site on the real test Slurm (tests/fixtures/slurm.py), as its user runs it.

A whole stack (api, projector, controller as processes), a site directory with
``scheduler: {type: slurm}`` and machine ``generic-slurm`` (nodes from ``SLURM_JOB_NODELIST``),
its agent as ``lode site start``, and the user's side through ``lode`` and the SDK. The agent
runs Slurm's commands, so it gets the cluster's ``SLURM_CONF``; the pilots it submits inherit
that environment (sbatch's default ``--export=ALL``).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from lodestream.agents.site.settings import SiteSettings, load_site_settings
from lodestream.client.config import ClientConfig
from lodestream.client.sdk import LodeClient
from lodestream.infra.postgres.server import EmbeddedPostgres
from tests.fixtures.slurm import SlurmCluster
from tests.support.processes import terminate
from tests.support.site import make_site_dir
from tests.support.stack import Stack, kill_strays, running_stack

SITE, OWNER = "alpha", "ada"
WAIT_S = 90.0


@dataclass
class SlurmSite:
    stack: Stack
    slurm: SlurmCluster
    site_dir: Path
    client: LodeClient
    env: dict[str, str]  # for `lode` commands: the API and the user's token
    agent_env: dict[str, str]  # the agent's, and so its pilots'
    agent: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def settings(self) -> SiteSettings:
        return load_site_settings(self.site_dir)

    def lode(self, *args: str) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "lodestream.client.cli.main", *args], env=self.env,
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert done.returncode == 0, f"lode {' '.join(args)}: {done.stdout}{done.stderr}"
        return done.stdout

    def queue_ls(self) -> dict[str, dict[str, Any]]:
        return {job["id"]: job for job in json.loads(self.lode("queue", "ls", "--json"))}

    def submit_pilot(self, *options: str) -> str:
        out = self.lode("queue", "submit", "--site", SITE, *options)
        return out.split()[0]

    def write_settings(self, **updates: Any) -> SiteSettings:
        """Rewrite ``settings.yml`` with top-level sections replaced (validated on reading).

        The agent reads the file when it starts, each pilot when it starts.
        """
        settings = self.settings.model_copy(update=updates)
        (self.site_dir / "settings.yml").write_text(settings.to_yaml())
        return self.settings

    def start_agent(self) -> None:
        assert self.agent is None or self.agent.poll() is not None, "the agent runs already"
        with self.stack.log_path("site-agent").open("ab") as log:
            self.agent = subprocess.Popen(
                [sys.executable, "-m", "lodestream.client.cli.main", "site", "start",
                 str(self.site_dir)],
                env=self.agent_env, stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip

    def stop_agent(self) -> None:
        if self.agent is not None:
            terminate(self.agent)
            self.agent = None

    def pilot_output(self) -> str:
        logs = sorted((self.site_dir / "batch").glob("pilot-*.*.*"))
        agent = self.stack.log_text("site-agent")[-3000:]
        return "\n".join([*(p.read_text()[-2000:] for p in logs), "--- agent", agent])


def until(what: str, check: Callable[[], Any], site: SlurmSite, timeout_s: float = WAIT_S) -> Any:
    """Poll ``check`` until it returns something true; fail with the pilots' output if not."""
    deadline = time.monotonic() + timeout_s
    while not (found := check()):
        if time.monotonic() > deadline:
            pytest.fail(f"{what} within {timeout_s:g} s\n{site.pilot_output()}")
        time.sleep(0.2)
    return found


def batch_in(site: SlurmSite, batch: str, *states: str) -> dict[str, Any] | None:
    job = site.client.get_batch_job(batch)
    return job if job["state"] in states else None


def jobs_in(site: SlurmSite, ids: list[str], state: str) -> bool:
    return all(site.client.get_job(i)["state"] == state for i in ids)


@contextlib.contextmanager
def running_slurm_site(
    slurm: SlurmCluster,
    root: Path,
    postgres: EmbeddedPostgres,
    *,
    scheduler: Mapping[str, Any] | None = None,
    elastic: Mapping[str, Any] | None = None,
    agent_env: Mapping[str, str] | None = None,
    stack_env: Mapping[str, str] | None = None,
    apps: Mapping[str, str] | None = None,
    app_names: Collection[str] = ("hello",),
    **launcher: Any,
) -> Iterator[SlurmSite]:
    """A stack and site ``alpha`` whose agent submits pilots to ``slurm``; torn down after.

    ``scheduler``, ``elastic`` and ``launcher`` add to the site's settings; ``apps`` are
    further app files (name: source), ``app_names`` the apps to wait for; ``agent_env`` adds
    to the agent's environment, ``stack_env`` to the services'. The agent is running, and has
    published its apps, when this yields.
    """
    with running_stack(root / "stack", postgres, env=stack_env) as stack:
        settings = make_site_dir(
            root / "sites", SITE, wss_url=stack.websocket_url, ca_file=stack.ca_file,
            seed_file=stack.seed_files[SITE],
            scheduler={"type": "slurm", "queue": "debug", "sync_interval_s": 0.5,
                       "jobcomp_path": str(slurm.jobcomp_path), **(scheduler or {})},
            elastic=dict(elastic) if elastic else None,
            **{"machine": "generic-slurm", "virtual_nodes": 1, "cores_per_node": None,
               "idle_ttl_s": 3, **launcher},
        )  # fmt: skip
        for name, source in (apps or {}).items():
            (settings.apps_dir / name).write_text(source)
        token = stack.auth(OWNER)["Authorization"].removeprefix("Bearer ")
        client = LodeClient(ClientConfig(stack.api_url, token))
        env = {**os.environ, "LODE_API_URL": stack.api_url, "LODE_TOKEN": token}
        site = SlurmSite(
            stack, slurm, settings.directory, client, env, {**slurm.env, **(agent_env or {})}
        )
        try:
            site.start_agent()
            until("the agent registered its apps",
                  lambda: set(app_names) <= {a["name"] for a in client.list_apps(SITE)},
                  site)  # fmt: skip
            yield site
        finally:
            client.close()
            site.stop_agent()
            slurm.cancel_all()
            kill_strays(root)
