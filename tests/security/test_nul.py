"""NUL (U+0000), which Postgres text and jsonb cannot hold, at every door into the read models.

The API must refuse it (422, nothing appended). If it reaches the log anyway (published by
the control plane directly here, standing in for any path that lets it through), the
projector quarantines the event, whether the schemas or Postgres refuse it, and goes on
folding; ``lode projector rebuild`` replays the same log to the same result.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
from pydantic import SecretStr

from lodestream.services.projector.main import rebuild
from lodestream.services.projector.rebuild import RebuildReport
from lodestream.settings import NatsSettings, Settings
from tests.security.attack import (
    Violations,
    api_client,
    control_connection,
    js_publish,
    pipeline_works,
    quarantined,
    site_connection,
    wait_quarantined,
)
from tests.security.forge import raw_event, subject
from tests.support.stack import SITE_OWNERS, Stack

ADA, BOB = SITE_OWNERS["alpha"], SITE_OWNERS["beta"]
NUL = "\u0000"

BAD_JOBS: dict[str, dict[str, Any]] = {
    "parameter-value": {"parameters": {"who": f"a{NUL}b"}},
    "parameter-name": {"parameters": {f"w{NUL}ho": "x"}},
    "workdir": {"workdir": f"w{NUL}d"},
    "tag-value": {"tags": {"k": f"v{NUL}"}},
    "data-nested": {"data": {"deep": [{"x": f"{NUL}"}]}},
    "data-key": {"data": {f"k{NUL}": 1}},
    "launch-param": {"launch_params": {"env": f"A={NUL}"}},
    "app": {"app": f"hello{NUL}"},
}


@pytest.mark.parametrize("field", list(BAD_JOBS))
async def test_the_api_refuses_nul_in_a_job(shared_stack: Stack, field: str) -> None:
    job = {"site": "alpha", "app": "hello", "workdir": "w"} | BAD_JOBS[field]
    async with api_client(shared_stack) as api, control_connection(shared_stack) as js:
        before = (await js.stream_info("EVENTS")).state.last_seq
        response = await api.client.post(
            "/jobs", json={"jobs": [job]}, params={"wait": "true"}, headers=api.auth(ADA)
        )
        assert response.status_code == 422, response.text
        assert (await js.stream_info("EVENTS")).state.last_seq == before


async def test_the_api_refuses_nul_in_a_kill_reason_and_a_site_description(
    shared_stack: Stack,
) -> None:
    async with api_client(shared_stack) as api, control_connection(shared_stack) as js:
        job_id = await api.submit(ADA, "alpha")
        await api.wait_state(ADA, job_id, "PREPROCESSED")
        before = (await js.stream_info("EVENTS")).state.last_seq
        kill = await api.client.post(
            f"/jobs/{job_id}/kill", json={"reason": f"x{NUL}y"}, headers=api.auth(ADA)
        )
        site = await api.client.post(
            "/sites", json={"name": "gamma", "description": f"d{NUL}"}, headers=api.auth(ADA)
        )
        assert (kill.status_code, site.status_code) == (422, 422), (kill.text, site.text)
        assert (await js.stream_info("EVENTS")).state.last_seq == before


async def test_a_site_subject_with_nul_is_quarantined_and_folding_goes_on(
    shared_stack: Stack,
) -> None:
    violations = Violations()
    on = f"evt.beta.job.{uuid.uuid4()}{NUL}x.started"  # '*' in beta's grant matches any token
    async with (
        api_client(shared_stack) as api,
        site_connection(shared_stack, "beta", violations) as beta,
    ):
        ack = await js_publish(beta, violations, on, b"{}")
        assert "error" not in ack, ack
        reasons = await wait_quarantined(shared_stack.database_url, [int(ack["seq"])])
        assert reasons[int(ack["seq"])]
        await pipeline_works(api, SITE_OWNERS)


def with_nul(document: dict[str, Any], *path: str | int) -> bytes:
    """``document`` as JSON, with the string at ``path`` given a NUL in the middle."""
    node: Any = document
    for step in path[:-1]:
        node = node[step]
    node[path[-1]] = f"{node[path[-1]]}{NUL}tail"
    return json.dumps(document).encode()


async def rebuild_read_models(stack: Stack) -> RebuildReport:
    """``lode projector rebuild``, the controller stopped meanwhile (docs/architecture.md §7.1)."""
    stack.stop("controller")
    settings = Settings(
        nats_url=stack.client_url,
        database_url=stack.database_url,
        nats=NatsSettings(
            url=stack.client_url,
            user=stack.control_user,
            password=SecretStr(stack.control_password),
        ),
    )
    try:
        return await rebuild(settings)
    finally:
        stack.start("controller")


@pytest.mark.slow
async def test_nul_on_the_log_is_quarantined_and_the_read_models_rebuild(
    fresh_stack: Stack,
) -> None:
    async with api_client(fresh_stack) as api, control_connection(fresh_stack) as js:
        victim = await api.submit(ADA, "alpha")
        await api.wait_state(ADA, victim, "PREPROCESSED")
        victim_row = await api.job(ADA, victim)
        created_id = uuid.uuid4()
        created = raw_event(
            "job.created", site="alpha", aggregate_id=created_id, actor=f"user:{ADA}",
            data={"site": "alpha", "app": "hello", "workdir": "w", "parameters": {"who": "x"}},
        )  # fmt: skip
        killed = raw_event(
            "job.killed", site="alpha", aggregate_id=victim, actor=f"user:{ADA}",
            data={"reason": "r"},
        )  # fmt: skip
        forged = [
            (subject("alpha", "job.created", created_id),
             with_nul(created, "data", "parameters", "who")),
            (subject("alpha", "job.killed", victim), with_nul(killed, "data", "reason")),
        ]  # fmt: skip
        seqs = [int((await js.publish(s, payload)).seq) for s, payload in forged]

        reasons = await wait_quarantined(fresh_stack.database_url, seqs)
        assert all(reasons.values()), reasons
        assert await api.job(ADA, created_id) is None
        assert await api.job(ADA, victim) == victim_row
        await pipeline_works(api, SITE_OWNERS)

        report = await rebuild_read_models(fresh_stack)
        assert report.quarantined >= len(seqs)
        assert await quarantined(fresh_stack.database_url, seqs) == reasons
        assert await api.job(ADA, victim) == victim_row
        await pipeline_works(api, SITE_OWNERS)
        assert fresh_stack.alive("projector")


@pytest.mark.slow
async def test_integers_postgres_cannot_hold_are_quarantined_and_rebuild_succeeds(
    fresh_stack: Stack,
) -> None:
    """Integers beyond the columns' range, from a site on its own subjects and job.

    Were the schemas to accept them, the live projector would quarantine each one that
    Postgres refuses, but a rebuild (which has no per-message fallback) would abort on it
    for good; so the schemas must refuse them, and the rebuild must go through.
    """
    violations = Violations()
    session = uuid.uuid4()
    launcher = f"launcher:{session}"
    async with (
        api_client(fresh_stack) as api,
        site_connection(fresh_stack, "beta", violations) as beta,
    ):
        own_job = await api.submit(BOB, "beta")
        await api.wait_state(BOB, own_job, "PREPROCESSED")
        batch = uuid.uuid4()
        attempts = [
            (subject("beta", "batch.requested", batch),
             raw_event("batch.requested", site="beta", aggregate_id=batch, actor="site:beta",
                       data={"num_nodes": 2**40, "wall_time_min": 2**31})),
            (subject("beta", "job.started", own_job),
             raw_event("job.started", site="beta", aggregate_id=own_job, actor=launcher,
                       data={"session_id": str(session), "skipped": ["job.leased"]})),
            (subject("beta", "job.run_done", own_job),
             raw_event("job.run_done", site="beta", aggregate_id=own_job, actor=launcher,
                       data={"return_code": 2**31, "attempt": 2**40})),
        ]  # fmt: skip
        seqs = []
        for on, document in attempts:
            ack = await js_publish(beta, violations, on, json.dumps(document).encode())
            assert "error" not in ack, ack
            seqs.append(int(ack["seq"]))
        out_of_range = [seqs[0], seqs[2]]
        refused = await wait_quarantined(fresh_stack.database_url, out_of_range)
        await pipeline_works(api, SITE_OWNERS)

        report = await rebuild_read_models(fresh_stack)
        assert report.quarantined >= len(out_of_range)
        assert await quarantined(fresh_stack.database_url, out_of_range) == refused
        await pipeline_works(api, SITE_OWNERS)
