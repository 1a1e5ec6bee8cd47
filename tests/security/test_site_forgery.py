"""Site beta forges events about site alpha's jobs and site: refused, or quarantined and inert.

Each attack uses beta's own nkey over wss. What beta may not publish at all is refused by
nats-server; what it may publish (its own event types, on its own subjects) but that
names alpha's job is stored, quarantined by the projector, and changes nothing of alpha's:
not the read model, not the work alpha's pilots would be handed, not what the controller
appends.
"""

from __future__ import annotations

import uuid
from typing import Any

from nats.js import JetStreamContext
from pydantic import BaseModel

from lodestream.schemas.envelope import Event
from lodestream.schemas.events import (
    JobCreated,
    JobLeased,
    JobPostprocessed,
    JobPreprocessed,
    JobRunDone,
    JobStagedOut,
    JobStarted,
    SiteKeyBound,
    SiteRegistered,
    SiteRemoved,
)
from lodestream.schemas.events.job import LeaseData, RunResultData, StartedData, StepData
from lodestream.schemas.events.site import SiteKeyData, SiteRegisteredData
from lodestream.schemas.ids import derived_id
from lodestream.schemas.subjects import EVENTS_STREAM, HB_IN_STREAM
from tests.security.attack import (
    Api,
    Stored,
    Violations,
    api_client,
    control_connection,
    controller_done_with,
    js_publish,
    last_on,
    pipeline_works,
    site_connection,
    stored,
    try_publish,
    wait_quarantined,
)
from tests.security.forge import forged, spec, subject
from tests.support.stack import SITE_OWNERS, Stack

ADA, BOB = SITE_OWNERS["alpha"], SITE_OWNERS["beta"]


async def victim_job(api: Api, marker: str) -> tuple[uuid.UUID, dict[str, Any]]:
    """An alpha job waiting for a pilot (PREPROCESSED), with ``marker`` in its parameters."""
    job_id = await api.submit(ADA, "alpha", workdir=f"victim/{marker}", parameters={"who": marker})
    return job_id, await api.wait_state(ADA, job_id, "PREPROCESSED")


async def launch_work(js: JetStreamContext, site: str) -> tuple[list[Stored], tuple[int, int]]:
    """What ``launch-<site>`` holds for pilots: its messages, and its (pending, delivered)."""
    info = await js.consumer_info(EVENTS_STREAM, f"launch-{site}")
    filters = list(info.config.filter_subjects or [info.config.filter_subject])
    return await stored(js, filters), (int(info.num_pending), int(info.delivered.stream_seq))


async def test_beta_cannot_append_job_created_for_alphas_job(shared_stack: Stack) -> None:
    """Spec-cache poisoning, step one: a job.created naming alpha's job never reaches the log."""
    violations = Violations()
    async with (
        api_client(shared_stack) as api,
        control_connection(shared_stack) as js,
        site_connection(shared_stack, "beta", violations) as beta,
    ):
        job_id, before = await victim_job(api, f"secret-{uuid.uuid4().hex}")
        poisoned = spec("alpha", app="fails", workdir="elsewhere", parameters={"why": "pwned"})
        for claimed_site, actor in (("alpha", f"user:{ADA}"), ("beta", f"user:{BOB}")):
            payload = forged(JobCreated, site=claimed_site, aggregate_id=job_id, actor=actor,
                             data=poisoned.model_copy(update={"site": claimed_site}))  # fmt: skip
            verdict = await try_publish(
                beta, violations, subject("beta", "job.created", job_id), payload
            )
            assert verdict.refused, verdict
        assert await last_on(js, f"evt.beta.job.{job_id}.>") is None
        assert await api.job(ADA, job_id) == before
        await pipeline_works(api, SITE_OWNERS)


async def test_forged_work_for_alphas_job_on_betas_subjects_changes_nothing_of_alphas(
    shared_stack: Stack,
) -> None:
    """Spec-cache poisoning, step two: types beta may append, naming alpha's job.

    Every variant is stored (beta may publish these types on its own subjects) and every
    one is quarantined: a work item naming alpha's spec with another app, one that claims
    site alpha in its envelope, one consistent for beta but carrying alpha's job id, and
    a lease and a start of alpha's job id (which would take alpha's job if anything keyed
    jobs by id alone).
    """
    violations = Violations()
    marker = f"secret-{uuid.uuid4().hex}"
    async with (
        api_client(shared_stack) as api,
        control_connection(shared_stack) as js,
        site_connection(shared_stack, "beta", violations) as beta,
    ):
        job_id, before = await victim_job(api, marker)
        work_before, consumer_before = await launch_work(js, "alpha")
        alpha_spec = spec("alpha", workdir=before["workdir"], parameters={"who": marker})
        evil = alpha_spec.model_copy(update={"app": "fails", "parameters": {"why": "pwned"}})
        evil_at_beta = evil.model_copy(update={"site": "beta"})
        session = uuid.uuid4()
        attempts: list[tuple[str, bytes]] = [
            ("job.preprocessed", forged(JobPreprocessed, site="beta", aggregate_id=job_id,
                                        actor="site:beta", data=StepData(work=evil))),
            ("job.preprocessed", forged(JobPreprocessed, site="alpha", aggregate_id=job_id,
                                        actor="site:alpha", data=StepData(work=evil))),
            ("job.preprocessed", forged(JobPreprocessed, site="beta", aggregate_id=job_id,
                                        actor="site:beta",
                                        data=StepData(work=evil_at_beta))),
            ("job.leased", forged(JobLeased, site="beta", aggregate_id=job_id,
                                  actor=f"launcher:{session}",
                                  data=LeaseData(session_id=session))),
            ("job.started", forged(JobStarted, site="beta", aggregate_id=job_id,
                                   actor=f"launcher:{session}",
                                   data=StartedData(session_id=session, skipped=("job.leased",)))),
        ]  # fmt: skip
        seqs = []
        for event_type, payload in attempts:
            ack = await js_publish(beta, violations, subject("beta", event_type, job_id), payload)
            assert "error" not in ack, ack
            seqs.append(int(ack["seq"]))

        reasons = await wait_quarantined(shared_stack.database_url, seqs)
        assert all(reasons.values()), reasons
        assert await api.job(ADA, job_id) == before
        work_after, consumer_after = await launch_work(js, "alpha")
        assert work_after == work_before
        assert consumer_after == consumer_before
        alpha_messages = await stored(js, [f"evt.alpha.job.{job_id}.>"])
        assert not any(b"pwned" in m.data for m in alpha_messages)
        await pipeline_works(api, SITE_OWNERS)


async def test_no_spec_of_alpha_leaks_onto_betas_subjects(shared_stack: Stack) -> None:
    """Spec leak: beta reports alpha's job as staged out on its own subjects.

    Were the controller to look alpha's job up by id alone, it would finish it on beta's
    subject with alpha's spec in ``work``, and beta's process consumer would hand it over.
    Beta writes the whole chain (started, run_done, postprocessed, staged_out) so that no
    step is missing for a fold keyed by id.
    """
    violations = Violations()
    marker = f"secret-{uuid.uuid4().hex}"
    async with (
        api_client(shared_stack) as api,
        control_connection(shared_stack) as js,
        site_connection(shared_stack, "beta", violations) as beta,
    ):
        job_id, before = await victim_job(api, marker)
        session = uuid.uuid4()
        launcher = f"launcher:{session}"
        chain: list[tuple[str, bytes]] = [
            ("job.started", forged(JobStarted, site="beta", aggregate_id=job_id, actor=launcher,
                                   data=StartedData(session_id=session, skipped=("job.leased",)))),
            ("job.run_done", forged(JobRunDone, site="beta", aggregate_id=job_id, actor=launcher,
                                    data=RunResultData(return_code=0))),
            ("job.postprocessed", forged(JobPostprocessed, site="beta", aggregate_id=job_id,
                                         actor="site:beta")),
            ("job.staged_out", forged(JobStagedOut, site="beta", aggregate_id=job_id,
                                      actor="site:beta")),
        ]  # fmt: skip
        seqs = []
        for event_type, payload in chain:
            ack = await js_publish(beta, violations, subject("beta", event_type, job_id), payload)
            assert "error" not in ack, ack
            seqs.append(int(ack["seq"]))

        await wait_quarantined(shared_stack.database_url, seqs)
        await controller_done_with(js, seqs[-1])  # it has decided on the staged_out
        assert await last_on(js, f"evt.beta.job.{job_id}.finished") is None
        assert [m.seq for m in await stored(js, [f"evt.beta.job.{job_id}.>"])] == seqs
        leaked = [m.subject for m in await stored(js, ["evt.beta.>"]) if marker.encode() in m.data]
        assert leaked == []
        assert await api.job(ADA, job_id) == before
        await pipeline_works(api, SITE_OWNERS)


async def test_beta_cannot_take_over_alphas_site_or_key(shared_stack: Stack) -> None:
    """Key takeover: site events are the control plane's; alpha's key keeps working."""
    violations = Violations()
    site_id = derived_id("site", "alpha")
    beta_key = shared_stack.public_keys["beta"]
    attempts: list[tuple[str, type[Event], BaseModel | None]] = [
        ("site.key_bound", SiteKeyBound, SiteKeyData(public_key=beta_key)),
        ("site.registered", SiteRegistered,
         SiteRegisteredData(name="alpha", owner=BOB, public_key=beta_key)),
        ("site.removed", SiteRemoved, None),
    ]  # fmt: skip
    async with (
        api_client(shared_stack) as api,
        control_connection(shared_stack) as js,
        site_connection(shared_stack, "beta", violations) as beta,
    ):
        registration = await last_on(js, f"evt.*.site.{site_id}.>")
        assert registration is not None
        for event_type, kind, data in attempts:
            payload = forged(kind, site="alpha", aggregate_id=site_id, actor=f"user:{ADA}",
                             data=data)  # fmt: skip
            for on_site in ("beta", "alpha"):
                verdict = await try_publish(
                    beta, violations, subject(on_site, event_type, site_id), payload
                )
                assert verdict.refused, (event_type, on_site, verdict)
        assert await last_on(js, f"evt.*.site.{site_id}.>") == registration

        sites = (await api.client.get("/sites", headers=api.auth(ADA))).json()
        assert [(s["name"], s["public_key"]) for s in sites] == [
            ("alpha", shared_stack.public_keys["alpha"])
        ]
        alpha_violations = Violations()
        async with site_connection(shared_stack, "alpha", alpha_violations) as alpha:
            info = await try_publish(
                alpha, alpha_violations, "$JS.API.CONSUMER.INFO.EVENTS.launch-alpha"
            )
            assert info.json["name"] == "launch-alpha", info
            beat = await js_publish(alpha, alpha_violations, f"hb.alpha.{uuid.uuid4()}", b"{}")
            assert beat["stream"] == HB_IN_STREAM, beat
        assert alpha_violations.errors == []
        await pipeline_works(api, SITE_OWNERS)


async def test_beta_cannot_create_a_job_the_log_never_accepted(shared_stack: Stack) -> None:
    """A job.created is the API's alone: refused by nats-server, so nothing exists to run."""
    violations = Violations()
    job_id = uuid.uuid4()
    async with (
        api_client(shared_stack) as api,
        control_connection(shared_stack) as js,
        site_connection(shared_stack, "beta", violations) as beta,
    ):
        work_before, consumer_before = await launch_work(js, "beta")
        for actor in (f"user:{BOB}", "site:beta", "controller:main"):
            payload = forged(JobCreated, site="beta", aggregate_id=job_id, actor=actor,
                             data=spec("beta", parameters={"who": "nobody asked"}))  # fmt: skip
            verdict = await try_publish(
                beta, violations, subject("beta", "job.created", job_id), payload
            )
            assert verdict.refused, (actor, verdict)
        assert await last_on(js, f"evt.*.job.{job_id}.>") is None
        assert await api.job(BOB, job_id) is None
        assert await launch_work(js, "beta") == (work_before, consumer_before)
        await pipeline_works(api, SITE_OWNERS)
