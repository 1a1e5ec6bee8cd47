"""The table of what each site receives, and everything derived from it, agree."""

from __future__ import annotations

import re

import pytest

from lodestream.eventlog.consumers import consumer_config
from lodestream.infra.nats.auth import (
    render_authorization,
    site_consumers,
    site_inbox_prefix,
    site_permissions,
)
from lodestream.schemas.codec import EVENT_CLASSES
from lodestream.schemas.errors import SubjectError
from lodestream.schemas.nkey import new_user_seed, user_public_key
from lodestream.schemas.states import CREATED_RUNNABLE, RUNNABLE, TRANSITIONS
from lodestream.schemas.subjects import EVENTS_STREAM
from lodestream.schemas.topology import (
    CONTROLLER,
    KILLS,
    LAUNCH,
    PEERS,
    PROCESS,
    SITE_CONSUMERS,
    SITE_FEEDS,
    LiveFeed,
    PullFeed,
)
from lodestream.schemas.trust import WRITERS

SITES = ("alpha", "beta-2", "x")
# Every JetStream subject that acts on a named consumer: the durable is the 5th token of an
# API subject and the 4th of an ack subject.
CONSUMER_API = re.compile(
    r"^\$JS\.API\.CONSUMER\.[A-Z.]+?\.(?P<stream>[A-Z]+)\.(?P<durable>[^.]+)$"
)
ACK = re.compile(r"^\$JS\.ACK\.(?P<stream>[A-Z]+)\.(?P<durable>[^.]+)\.>$")


def _consumer_grants(subjects: list[str]) -> dict[str, set[str]]:
    """durable -> the kinds of grant the subjects give on it (``NEXT``, ``INFO``, ``ACK``)."""
    grants: dict[str, set[str]] = {}
    for subject in subjects:
        if subject.startswith("$JS.API.CONSUMER."):
            match = CONSUMER_API.match(subject)
            assert match, f"unexpected consumer API grant {subject}"
            verb = subject.removeprefix("$JS.API.CONSUMER.").split(".")[0]
            verb = "NEXT" if verb == "MSG" else verb
        elif subject.startswith("$JS.ACK."):
            match = ACK.match(subject)
            assert match, f"unexpected ack grant {subject}"
            verb = "ACK"
        else:
            continue
        assert match["stream"] == EVENTS_STREAM
        grants.setdefault(match["durable"], set()).add(verb)
    return grants


@pytest.mark.parametrize("site", SITES)
def test_a_site_may_fetch_and_ack_exactly_its_tables_consumers(site: str) -> None:
    publish = site_permissions(site)["publish"]["allow"]
    wanted = {feed.durable(site): {"NEXT", "INFO", "ACK"} for feed in SITE_CONSUMERS}
    assert _consumer_grants(publish) == wanted


@pytest.mark.parametrize("site", SITES)
def test_a_site_may_subscribe_to_its_inbox_and_its_live_feeds_only(site: str) -> None:
    live = [
        s for feed in SITE_FEEDS if isinstance(feed, LiveFeed) for s in feed.filter_subjects(site)
    ]
    subscribe = site_permissions(site)["subscribe"]["allow"]
    assert subscribe == [f"{site_inbox_prefix(site)}.>", *live]


def test_the_rendered_config_grants_consumers_of_the_table_only() -> None:
    """What nats-server is given, read back from the config text: every consumer grant of
    every site names one of that site's table rows, and each row is granted."""
    sites = {site: user_public_key(new_user_seed()) for site in SITES}
    text = render_authorization("lodestream", "pw", sites)
    subjects = [s for s in re.findall(r'"([^"]*)"', text) if s.startswith("$JS.")]
    granted = _consumer_grants(subjects)
    assert granted == {
        feed.durable(site): {"NEXT", "INFO", "ACK"} for site in SITES for feed in SITE_CONSUMERS
    }
    assert sorted(site_consumers("alpha")) == sorted(f.durable("alpha") for f in SITE_CONSUMERS)


@pytest.mark.parametrize("feed", SITE_CONSUMERS, ids=lambda f: f.purpose)
def test_consumer_configs_are_the_rows(feed: PullFeed) -> None:
    config = consumer_config(feed, "alpha")
    assert config.durable_name == f"{feed.purpose}-alpha"
    assert config.filter_subjects == [
        f"evt.alpha.{t.replace('.', '.*.')}" for t in feed.event_types
    ]
    assert config.ack_wait == feed.ack_wait_s
    assert (config.max_ack_pending, config.max_waiting) == (feed.max_ack_pending, feed.max_waiting)


def test_every_row_is_well_formed() -> None:
    purposes = [feed.purpose for feed in SITE_FEEDS]
    assert len(purposes) == len(set(purposes)), "one row per purpose"
    for feed in SITE_FEEDS:
        assert re.fullmatch(r"[a-z]+", feed.purpose), "a durable name token, never a wildcard"
        heartbeats = isinstance(feed, LiveFeed) and feed.heartbeats
        assert bool(feed.event_types) != heartbeats, feed.purpose  # events, or heartbeats
        assert len(set(feed.event_types)) == len(feed.event_types), feed.purpose
        assert set(feed.event_types) <= set(EVENT_CLASSES), feed.purpose
    assert set(CONTROLLER.event_types) <= set(EVENT_CLASSES)


def test_pilots_are_handed_exactly_the_events_that_leave_a_job_runnable_and_free() -> None:
    freed = {
        t.event
        for t in TRANSITIONS.values()
        if (t.target in RUNNABLE and t.lease == "none")
        or (t.target is None and t.lease == "release")
    }
    # A pilot's refusal carries the work on, so that a pilot that fits leases on it.
    freed.add("job.placement_refused")
    # job.created too: with CREATED_RUNNABLE skipped, it leaves its job runnable and free.
    assert TRANSITIONS[CREATED_RUNNABLE[-1]].target in RUNNABLE
    assert set(LAUNCH.event_types) == freed | {"job.created"}
    assert LAUNCH.reader == "pilot"
    assert PROCESS.reader == "site agent"


def test_kills_come_from_the_control_plane_only() -> None:
    # A live feed is trusted to stop tasks; a site key must not be able to publish on it.
    for event_type in KILLS.event_types:
        assert "site" not in WRITERS[event_type]
    assert KILLS.filter_subjects("alpha") == ("evt.alpha.job.*.killed",)


def test_pilots_hear_their_own_sites_heartbeats_only() -> None:
    # Data-aware dispatch: a pilot learns what its peers cache from their heartbeats.
    assert PEERS.filter_subjects("alpha") == ("hb.alpha.*",)
    assert PEERS.grants("alpha").subscribe == ("hb.alpha.*",)
    assert "hb.beta.*" not in site_permissions("alpha")["subscribe"]["allow"]
    assert not PEERS.carries("job.killed")


def test_the_controllers_filters_follow_its_row() -> None:
    filters = CONTROLLER.filter_subjects()
    assert "evt.*.job.*.created" in filters
    assert filters[-2:] == ["evt.*.app.>", "evt.*.site.>"]
    assert len(filters) == len(CONTROLLER.event_types) + len(CONTROLLER.kinds)


@pytest.mark.parametrize("site", ["", "Alpha", "al.pha", "al*", "al>", "-a"])
def test_a_bad_site_name_renders_nothing(site: str) -> None:
    for feed in SITE_FEEDS:
        with pytest.raises(SubjectError):
            feed.grants(site)
    with pytest.raises(SubjectError):
        LAUNCH.durable(site)
