"""A leaf-node site rides out a WAN cut (docs/architecture.md §11).

Real processes on loopback: the stack's hub (nats-server with the JetStream domain ``hub``,
Postgres, projector, controller, api), site ``alpha``'s leaf node (its own nats-server in
domain ``alpha``) linked to the hub's ``wss://`` listener through a proxy the test cuts,
and the site's agent and a pilot connected to the leaf. ``LODE_LEAF_CUT_S`` sets how long
the ride-out test keeps the link cut (``make leaf-cut`` runs it for 60 s).
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Final

import nats.errors
import pytest
from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from lodestream.infra.nats.leaf import HUB_DOMAIN
from lodestream.infra.postgres.server import EmbeddedPostgres
from lodestream.schemas.subjects import EVENTS_STREAM
from tests.security.attack import Api, api_client, control_connection
from tests.support.leaf import LeafSite, job_events, leaf_site
from tests.support.stack import SITE_OWNERS, running_stack

pytestmark = pytest.mark.slow

ADA: Final = SITE_OWNERS["alpha"]
CUT_S: Final = float(os.environ.get("LODE_LEAF_CUT_S", "0"))  # 0: as long as the jobs need
WAIT_S: Final = 60.0 + CUT_S


async def until(what: str, check: Callable[[], Awaitable[bool]], timeout_s: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.1)


def types(events: list[tuple[int, str, str]]) -> list[str]:
    return [t for _, t, _ in events]


async def site_ready(api: Api) -> None:
    """Wait until the hub knows the app the jobs run: submitted before that, they are
    created CREATED and wait for the controller's retries instead of starting together."""

    async def apps_known() -> bool:
        response = await api.client.get(
            "/apps", params={"site": "alpha"}, headers=api.stack.auth(ADA)
        )
        return response.status_code == 200 and any(
            app["name"] == "sleeper" for app in response.json()
        )

    await until("the site's apps at the hub", apps_known)


async def test_a_leaf_site_rides_out_a_cut_and_hears_a_kill_after(
    tmp_path: Path, postgres_server: EmbeddedPostgres
) -> None:
    # The hub keeps a session whose heartbeats stop for its TTL: the cut must be shorter,
    # with a beat interval (TTL/4) to spare. A 60 s cut needs a TTL above 80 s.
    ttl = max(20, round(CUT_S * 1.5))
    with running_stack(tmp_path / "s", postgres_server, leaf_sites=["alpha"],
                       heartbeat_ttl_s=ttl) as stack:  # fmt: skip
        async with leaf_site(stack, "alpha", heartbeat_ttl_s=ttl) as leaf, \
                api_client(stack) as api, control_connection(stack) as js:  # fmt: skip
            leaf.agent()
            leaf.pilot("pilot")
            await site_ready(api)
            # Submitted without waiting for the read model, so that they start together.
            # Four to a node: the pilot's two nodes start all five at once.
            doomed = await api.submit(ADA, "alpha", wait=False, app="sleeper",
                                      node_packing_count=4,
                                      parameters={"seconds": "120"})  # fmt: skip
            short = [await api.submit(ADA, "alpha", wait=False, app="sleeper",
                                      node_packing_count=4, parameters={"seconds": "8"})
                     for _ in range(4)]  # fmt: skip
            jobs = [str(j) for j in [*short, doomed]]

            async def all_started() -> bool:
                events = await job_events(js, "alpha")
                return all("job.started" in types(events.get(j, [])) for j in jobs)

            await until("every job started", all_started)
            await leaf.proxy.cut()
            cut_at = time.monotonic()
            await api.client.post(f"/jobs/{doomed}/kill", headers=stack.auth(ADA))

            at_cut = await job_events(js, "alpha")
            pending = [j for j in short if "job.finished" not in types(at_cut[str(j)])]
            assert pending, "every short job ended before the cut: nothing to ride out"

            async def results_kept() -> bool:
                return await leaf.outbox_size() >= len(pending)

            await until("the results kept at the site", results_kept)
            if CUT_S:
                await asyncio.sleep(max(0.0, CUT_S - (time.monotonic() - cut_at)))
            await leaf.proxy.restore()
            healed_at = time.monotonic()

            async def all_results() -> bool:
                events = await job_events(js, "alpha")
                return all("job.finished" in types(events[str(j)]) for j in short)

            await until("every kept result at the hub", all_results)
            caught_up_s = time.monotonic() - healed_at
            print(f"\nleaf cut {healed_at - cut_at:.1f} s; heal -> hub has every event: "
                  f"{caught_up_s:.2f} s")  # fmt: skip

            events = await job_events(js, "alpha")
            for job in short:
                kinds = types(events[str(job)])
                assert kinds[-2:] == ["job.started", "job.finished"], kinds
                assert len(set(kinds)) == len(kinds), f"an event twice: {kinds}"
                ids = [i for _, _, i in events[str(job)]]
                assert len(set(ids)) == len(ids)
            assert not any("lease_expired" in t for e in events.values() for t in types(e))

            async def kill_heard() -> bool:  # the pilot's check after the link came back
                return f"stopping job {doomed}" in stack.log_text("pilot")

            await until("the kill reaching the pilot", kill_heard)
            assert types(events[str(doomed)])[-1] == "job.killed"
            assert await leaf.outbox_size() == 0
            await stops_on_sigterm(leaf.processes["agent"])
            # Its forwarder's pull subscription, left open, once kept the closing drain of its
            # connection waiting for nats-py's drain timeout (30 s) on every stop.
            assert "DrainTimeoutError" not in stack.log_text("agent")


async def stops_on_sigterm(proc: subprocess.Popen[bytes]) -> None:
    """The agent ends by itself, and well, on SIGTERM."""
    proc.send_signal(signal.SIGTERM)
    try:
        code = await asyncio.to_thread(proc.wait, WAIT_S)  # a hang, not a speed, is the fault
    except subprocess.TimeoutExpired:
        raise AssertionError("the site agent did not stop on SIGTERM") from None
    assert code == 0, f"the site agent exited with {code}"


async def test_a_lease_the_hub_expired_during_the_cut_wins(
    tmp_path: Path, postgres_server: EmbeddedPostgres
) -> None:
    """The cut outlasts the heartbeat TTL: the hub expires the pilot's session and its
    leases meanwhile. The result the pilot kept for one of them is refused when it is
    forwarded, and the pilot kills the task still running once it hears of the expiry."""
    ttl = 4
    with running_stack(tmp_path / "s", postgres_server, leaf_sites=["alpha"],
                       heartbeat_ttl_s=ttl) as stack:  # fmt: skip
        async with leaf_site(stack, "alpha", heartbeat_ttl_s=ttl) as leaf, \
                api_client(stack) as api, control_connection(stack) as js:  # fmt: skip
            leaf.agent()
            leaf.pilot("pilot")
            await site_ready(api)
            running = await api.submit(ADA, "alpha", wait=False, app="sleeper",
                                       parameters={"seconds": "120"})  # fmt: skip
            late = await api.submit(ADA, "alpha", wait=False, app="sleeper",
                                    parameters={"seconds": "3"})  # fmt: skip
            jobs = [str(late), str(running)]

            async def both_started() -> bool:
                events = await job_events(js, "alpha")
                return all("job.started" in types(events.get(j, [])) for j in jobs)

            await until("both jobs started", both_started)
            await leaf.proxy.cut()

            async def expired_at_hub() -> bool:  # the controller's run_timed_out, for both
                events = await job_events(js, "alpha")
                return all("job.run_timed_out" in types(events[j]) for j in jobs)

            await until("the hub expiring the leases", expired_at_hub)

            async def result_kept() -> bool:
                return await leaf.outbox_size() >= 1

            await until("the late result kept at the site", result_kept)
            await leaf.proxy.restore()

            async def outbox_drained() -> bool:
                return await leaf.outbox_size() == 0

            await until("the forwarder's verdict", outbox_drained)
            events = await job_events(js, "alpha")
            assert "job.finished" not in types(events[str(late)]), "a late result landed"
            assert f"the hub refused evt.alpha.job.{late}.finished" in stack.log_text("agent")

            async def task_killed() -> bool:
                return f"killing job {running}" in stack.log_text("pilot")

            await until("the pilot killing the fenced task", task_killed)
            events = await job_events(js, "alpha")
            after = types(events[str(running)])
            assert after.index("job.run_timed_out") > after.index("job.started")
            assert "job.finished" not in after
            assert "job.run_done" not in after
            await forged_creation_is_refused(leaf, js)


async def forged_creation_is_refused(leaf: LeafSite, js: JetStreamContext) -> None:
    """Through its leaf, the site's key still cannot append a control-plane type."""
    subject = f"evt.alpha.job.{uuid.uuid4()}.created"
    async with leaf.connection() as nc:
        with pytest.raises((nats.errors.Error, TimeoutError)):
            await nc.jetstream(domain=HUB_DOMAIN).publish(subject, b"{}", timeout=2)
    with pytest.raises(NotFoundError):
        await js.get_msg(EVENTS_STREAM, subject=subject)
