"""Attacks that matter only with real pilots running: dead-pilot detection, and forged work.

Each test gets a stack of its own (it kills pilots) and runs ``lode launcher`` processes of
the victim site as a site would.
"""

from __future__ import annotations

import asyncio
import subprocess
import uuid
from datetime import UTC, datetime

import orjson
import pytest
from nats.js import JetStreamContext

from lodestream.schemas.events import JobPreprocessed
from lodestream.schemas.events.job import StepData
from lodestream.schemas.events.session import Heartbeat
from lodestream.schemas.subjects import EVENTS_STREAM, HB_STREAM
from tests.security.attack import (
    WAIT_S,
    Violations,
    ack_floor,
    api_client,
    control_connection,
    js_publish,
    last_on,
    pipeline_works,
    site_connection,
)
from tests.security.forge import forged, spec, subject
from tests.support.processes import terminate
from tests.support.stack import SITE_OWNERS, Stack, kill_group

pytestmark = pytest.mark.slow

ADA, BOB = SITE_OWNERS["alpha"], SITE_OWNERS["beta"]
MARKER = {"Nats-Marker-Reason": "MaxAge"}


async def controller_read_all_of(js: JetStreamContext, heartbeats: str) -> None:
    """Until HB held ``heartbeats``, holds none any more, and the controller acked all it had.

    What a site publishes expires after the heartbeat TTL, and so do the server's markers;
    the controller acks each message only once it has acted on it.
    """
    async with asyncio.timeout(WAIT_S):
        while not (await js.stream_info(HB_STREAM, subjects_filter=heartbeats)).state.subjects:
            await asyncio.sleep(0.05)  # HB sources them from HBIN
        while (await js.stream_info(HB_STREAM, subjects_filter=heartbeats)).state.subjects:
            await asyncio.sleep(0.1)
        last = int((await js.stream_info(HB_STREAM)).state.last_seq)
        while await ack_floor(js, HB_STREAM, "controller-hb") < last:
            await asyncio.sleep(0.05)


async def test_forged_heartbeat_markers_do_not_stop_dead_pilot_detection(
    fresh_stack: Stack,
) -> None:
    violations = Violations()
    pilots: list[subprocess.Popen[bytes]] = []
    try:
        async with (
            api_client(fresh_stack) as api,
            control_connection(fresh_stack) as js,
            site_connection(fresh_stack, "beta", violations) as beta,
        ):
            job = await api.submit(ADA, "alpha", app="sleeper", parameters={"seconds": "60"})
            pilots.append(fresh_stack.pilot("alpha", "pilot-1"))
            await api.wait_state(ADA, job, "RUNNING", timeout_s=60)

            alpha_like = Heartbeat(session_id=uuid.uuid4(), site="alpha", at=datetime.now(UTC))
            session = uuid.uuid4()
            attacks: list[tuple[str, bytes, dict[str, str]]] = [
                ("hb.beta.not-a-uuid", b"", MARKER),
                ("hb.beta.not-a-uuid", b"{}", {}),
                (f"hb.beta.{session}", b"not json", MARKER),
                (f"hb.beta.{uuid.uuid4()}", b"\xff\xfe", {}),
                (f"hb.beta.{uuid.uuid4()}", orjson.dumps(alpha_like.model_dump(mode="json")), {}),
                ("hb.beta.-", b"", MARKER),
            ]
            for on, body, headers in attacks:
                ack = await js_publish(beta, violations, on, body, **headers)
                assert "error" not in ack, ack
            await controller_read_all_of(js, "hb.beta.>")
            assert fresh_stack.alive("controller"), fresh_stack.log_text("controller")[-2000:]

            # Alpha's pilot dies: the controller must still notice and fence its job.
            kill_group(pilots[0])
            events = await api.wait_event(ADA, job, "job.run_timed_out", timeout_s=WAIT_S)
            assert events[-1] == "job.run_timed_out", events
            assert fresh_stack.alive("controller")

            # And a new pilot of alpha still runs a fresh job to the end.
            pilots.append(fresh_stack.pilot("alpha", "pilot-2"))
            fresh = await api.submit(ADA, "alpha", parameters={"who": "after"})
            await api.wait_state(ADA, fresh, "JOB_FINISHED", timeout_s=60)
            await pipeline_works(api, {"beta": BOB})
    finally:
        for pilot in pilots:
            terminate(pilot)


async def test_a_pilot_runs_no_job_the_log_never_accepted(fresh_stack: Stack) -> None:
    violations = Violations()
    ghost = uuid.uuid4()
    marker = f"ghost-{uuid.uuid4().hex[:8]}"
    pilot: subprocess.Popen[bytes] | None = None
    try:
        async with (
            api_client(fresh_stack) as api,
            control_connection(fresh_stack) as js,
            site_connection(fresh_stack, "beta", violations) as beta,
        ):
            work = spec("beta", workdir="ghost", parameters={"who": marker})
            payload = forged(JobPreprocessed, site="beta", aggregate_id=ghost, actor="site:beta",
                             data=StepData(work=work))  # fmt: skip
            ack = await js_publish(
                beta, violations, subject("beta", "job.preprocessed", ghost), payload
            )
            seq = int(ack["seq"])
            pilot = fresh_stack.pilot("beta", "pilot-beta")
            legit = await api.submit(BOB, "beta", parameters={"who": "legit"})
            await api.wait_state(BOB, legit, "JOB_FINISHED", timeout_s=60)
            # The pilot has handled the forged delivery too: launch-beta is past it.
            async with asyncio.timeout(WAIT_S):
                while await ack_floor(js, EVENTS_STREAM, "launch-beta") < seq:
                    await asyncio.sleep(0.05)
            started = await last_on(js, f"evt.beta.job.{ghost}.started")
            finished = await last_on(js, f"evt.beta.job.{ghost}.finished")
            assert (started, finished) == (None, None), "the pilot ran the forged job"
            assert await api.job(BOB, ghost) is None
    finally:
        if pilot is not None:
            terminate(pilot)
