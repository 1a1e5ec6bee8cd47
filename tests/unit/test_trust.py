"""The shared rule of schemas.trust: what every consumer refuses before acting on a message."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import orjson
import pytest

from lodestream.schemas.codec import encode
from lodestream.schemas.envelope import Event
from lodestream.schemas.errors import Untrusted
from lodestream.schemas.events import (
    AppRegistered,
    JobCreated,
    JobFinished,
    JobPreprocessed,
    ScalerBacklog,
    ScalerDecided,
    SiteKeyBound,
)
from lodestream.schemas.events.job import FinishedData, RunResultData, StepData
from lodestream.schemas.events.scaler import (
    ScalerBacklogData,
    ScalerDecidedData,
    ScalerLimits,
    scaler_id,
)
from lodestream.schemas.events.session import Heartbeat
from lodestream.schemas.events.site import SiteKeyData
from lodestream.schemas.nkey import new_user_seed, user_public_key
from lodestream.schemas.placement import SiteChoice, SiteFigures
from lodestream.schemas.resources import App, JobSpec
from lodestream.schemas.trust import (
    MARKER_HEADER,
    SOURCE_HEADER,
    HeartbeatBeat,
    HeartbeatExpired,
    check_event,
    check_own_site,
    event_from_message,
    heartbeat_message,
)
from tests.support.builders import job_created, lifecycle

JOB = uuid.UUID("01900000-0000-7000-8000-000000000001")
SESSION = uuid.UUID("01900000-0000-7000-8000-000000000002")
PUBLIC_KEY = user_public_key(new_user_seed())


def spec(site: str = "alpha") -> JobSpec:
    return JobSpec(site=site, app="demo", workdir="w")


def preprocessed(work_site: str = "alpha", site: str = "alpha") -> JobPreprocessed:
    return JobPreprocessed.create(
        site=site, aggregate_id=JOB, actor="controller:main",
        data=StepData(skipped=("job.ready", "job.staged_in"), work=spec(work_site)),
    )  # fmt: skip


def refused(subject: str, event: Event) -> str:
    with pytest.raises(Untrusted) as info:
        check_event(subject, event)
    return str(info.value)


def test_a_valid_event_passes_on_its_own_subject() -> None:
    created = job_created("alpha", "ada")
    for event in (created, *lifecycle(created)):
        assert check_event(event.subject, event) is event
        assert event_from_message(event.subject, encode(event)) == event


def test_subject_and_payload_must_agree() -> None:
    event = preprocessed()
    assert "on a subject of site 'beta'" in refused(event.subject.replace("alpha", "beta"), event)
    assert "on a subject for job.started" in refused(
        event.subject.replace("preprocessed", "started"), event
    )
    other = f"evt.alpha.job.{uuid.uuid4()}.preprocessed"
    assert "on a subject for" in refused(other, event)
    assert "not an event subject" in refused("evt.alpha.job.preprocessed", event)


def test_a_payload_may_not_name_another_site() -> None:
    """Spec-cache poisoning and spec leaks: a site's event carrying another site's job."""
    event = preprocessed(work_site="beta")
    assert "names site 'beta'" in refused(event.subject, event)
    created = JobCreated.model_validate(
        {**job_created("alpha", "ada").model_dump(), "data": spec("beta")}
    )
    assert "names site 'beta'" in refused(created.subject, created)
    finished = JobFinished.create(
        site="alpha", aggregate_id=JOB, actor=f"launcher:{SESSION}",
        data=FinishedData(skipped=("job.run_done", "job.postprocessed", "job.staged_out"),
                          run=RunResultData(return_code=0, work=spec("beta"))),
    )  # fmt: skip
    assert "names site 'beta'" in refused(finished.subject, finished)
    app = AppRegistered.create(
        site="alpha", aggregate_id=JOB, actor="site:alpha", data=App(site="beta", name="demo")
    )
    assert "names site 'beta'" in refused(app.subject, app)


def test_the_actor_must_be_of_a_writer_of_the_type() -> None:
    """Key takeover: a site cannot pass for a user, even if its payload says so."""
    bound = SiteKeyBound.create(
        site="alpha", aggregate_id=JOB, actor="site:alpha", data=SiteKeyData(public_key=PUBLIC_KEY)
    )
    assert "appended by the control, not by site:alpha" in refused(bound.subject, bound)
    created = JobCreated.model_validate(
        {**job_created("alpha", "ada").model_dump(), "actor": "launcher:x"}
    )
    assert "not by launcher:x" in refused(created.subject, created)
    leased = lifecycle(job_created("alpha", "ada"))[1].model_copy(update={"actor": "user:ada"})
    assert "appended by the site, not by user:ada" in refused(leased.subject, leased)


def test_the_backlog_is_the_control_planes_and_the_decisions_the_sites() -> None:
    def backlog(actor: str) -> ScalerBacklog:
        return ScalerBacklog.create(site="alpha", aggregate_id=scaler_id("alpha"), actor=actor,
                                    data=ScalerBacklogData(as_of_seq=1))  # fmt: skip

    def decided(actor: str) -> ScalerDecided:
        return ScalerDecided.create(site="alpha", aggregate_id=scaler_id("alpha"), actor=actor,
                                    data=ScalerDecidedData(limits=ScalerLimits()))  # fmt: skip

    for good in (backlog("controller:main"), decided("site:alpha")):
        assert check_event(good.subject, good) is good
    forged = backlog("site:alpha")
    assert "appended by the control, not by site:alpha" in refused(forged.subject, forged)
    forged_decision = decided("controller:main")
    assert "appended by the site, not by controller:main" in refused(
        forged_decision.subject, forged_decision
    )
    beta = decided("site:beta")
    assert "signed by site:beta" in refused(beta.subject, beta)


def test_a_site_actor_must_be_the_events_site() -> None:
    app = AppRegistered.create(
        site="alpha", aggregate_id=JOB, actor="site:beta", data=App(site="alpha", name="demo")
    )
    assert "signed by site:beta" in refused(app.subject, app)


def test_garbage_is_untrusted_not_an_error() -> None:
    for data in (b"", b"\xff\xfe", b"[]", b'{"type": "job.exploded"}', b"null"):
        with pytest.raises(Untrusted):
            event_from_message(f"evt.alpha.job.{JOB}.started", data)


def test_check_own_site() -> None:
    event = preprocessed()
    assert check_own_site(event, "alpha") is event
    with pytest.raises(Untrusted, match="delivered to site 'beta'"):
        check_own_site(event, "beta")


def _beat(site: str = "alpha") -> bytes:
    body = Heartbeat(session_id=SESSION, site=site, at=datetime.now(UTC))
    return orjson.dumps(body.model_dump(mode="json"))


def test_heartbeats_and_the_servers_markers() -> None:
    subject = f"hb.alpha.{SESSION}"
    beat = heartbeat_message(subject, {SOURCE_HEADER: "HBIN 1 > > hb"}, _beat())
    assert isinstance(beat, HeartbeatBeat)
    assert beat.session_id == SESSION
    marker = heartbeat_message(subject, {MARKER_HEADER: "MaxAge"}, b"")
    assert marker == HeartbeatExpired("alpha", SESSION)


def test_a_forged_marker_is_not_an_expiry() -> None:
    """A site's own marker header arrives sourced from HBIN: it is read as a heartbeat."""
    headers = {MARKER_HEADER: "MaxAge", SOURCE_HEADER: "HBIN 3 > > hb.alpha.x"}
    with pytest.raises(Untrusted, match="invalid heartbeat"):
        heartbeat_message(f"hb.alpha.{SESSION}", headers, b"")
    assert isinstance(heartbeat_message(f"hb.alpha.{SESSION}", headers, _beat()), HeartbeatBeat)


@pytest.mark.parametrize(
    "subject", ["hb.alpha.not-a-uuid", "hb.Alpha.x", "hb.alpha", "hb..", "evt.alpha.x", ""]
)
def test_malformed_heartbeat_subjects_are_untrusted(subject: str) -> None:
    with pytest.raises(Untrusted, match="not a heartbeat subject"):
        heartbeat_message(subject, {MARKER_HEADER: "MaxAge"}, b"")


def test_a_heartbeat_must_match_its_subject() -> None:
    with pytest.raises(Untrusted, match="does not match"):
        heartbeat_message(f"hb.alpha.{SESSION}", None, _beat(site="beta"))


def test_a_site_choice_must_have_chosen_the_events_site() -> None:
    """A job.created recording ``site: "auto"``'s choice names the other candidates only as
    figures; the chosen site must be the one the event is for."""
    figures = SiteFigures(backlog=0, throughput_per_s=1.0, eta_s=1.0)

    def created(chosen: str) -> JobCreated:
        base = job_created("alpha", "ada")
        choice = SiteChoice(
            strategy="fastest_eta", chosen=chosen, candidates={"alpha": figures, "beta": figures}
        )
        return base.model_copy(
            update={"data": base.data.model_copy(update={"site_choice": choice})}
        )

    chosen_here = created("alpha")
    assert check_event(chosen_here.subject, chosen_here) is chosen_here
    elsewhere = created("beta")
    assert "names site 'beta'" in refused(elsewhere.subject, elsewhere)
