"""Data-aware dispatch: the deferral decision (``decide.cache_deferral``), what a pilot
learns from its peers' heartbeats (``peers.PeerCaches``), and where caches can be filled."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import orjson

from lodestream.agents.launcher.decide import beat_interval_s, cache_deferral
from lodestream.agents.launcher.diffusion import caches_reachable
from lodestream.agents.launcher.peers import PeerCaches
from lodestream.schemas.events import Heartbeat

CACHE_DEFER_S = beat_interval_s(10)  # the default TTL's beat: 2.5 s


def test_a_job_waits_a_bounded_number_of_deliveries_for_the_pilot_with_its_data() -> None:
    assert (
        cache_deferral(here=0, at_peer=1, delivered=1, max_deliveries=2, defer_s=CACHE_DEFER_S)
        == CACHE_DEFER_S
    )
    assert (
        cache_deferral(here=0, at_peer=1, delivered=2, max_deliveries=2, defer_s=CACHE_DEFER_S)
        == CACHE_DEFER_S
    )
    assert (
        cache_deferral(here=0, at_peer=1, delivered=3, max_deliveries=2, defer_s=CACHE_DEFER_S)
        is None
    )  # taken
    assert (
        cache_deferral(here=0, at_peer=1, delivered=1, max_deliveries=0, defer_s=CACHE_DEFER_S)
        is None
    )  # off


def test_a_deferral_lasts_a_peer_advertisement_interval() -> None:
    # Handed back for less, the delivery returns before the peer's next beat (issue 31.13).
    assert CACHE_DEFER_S == 2.5
    assert beat_interval_s(1) == 0.5
    assert PeerCaches("s1", uuid.uuid4, 10).advert_interval_s == CACHE_DEFER_S


def test_no_deferral_when_no_peer_holds_more_than_this_pilot() -> None:
    assert (
        cache_deferral(here=0, at_peer=0, delivered=1, max_deliveries=2, defer_s=CACHE_DEFER_S)
        is None
    )
    assert (
        cache_deferral(here=1, at_peer=1, delivered=1, max_deliveries=2, defer_s=CACHE_DEFER_S)
        is None
    )
    assert (
        cache_deferral(here=2, at_peer=1, delivered=1, max_deliveries=2, defer_s=CACHE_DEFER_S)
        is None
    )
    assert (
        cache_deferral(here=1, at_peer=2, delivered=1, max_deliveries=2, defer_s=CACHE_DEFER_S)
        == CACHE_DEFER_S
    )


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def beat(site: str, session: uuid.UUID, cached: tuple[str, ...]) -> tuple[str, bytes]:
    body = Heartbeat(session_id=session, site=site, at=datetime.now(UTC), cached=cached)
    return f"hb.{site}.{session}", orjson.dumps(body.model_dump(mode="json"))


def test_peers_are_known_from_their_latest_heartbeat_until_a_ttl_passes() -> None:
    own, peer, other = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    clock = Clock()
    peers = PeerCaches("alpha", lambda: own, ttl_s=10, clock=clock)
    a, b = "a" * 16, "b" * 16
    peers.heard(*_split(beat("alpha", peer, (a,))))
    peers.heard(*_split(beat("alpha", own, (a, b))))  # our own: not a peer
    assert peers.best(frozenset({a, b})) == 1
    peers.heard(*_split(beat("alpha", other, (a, b))))
    assert peers.best(frozenset({a, b})) == 2
    peers.heard(*_split(beat("alpha", other, ())))  # its cache moved on
    assert peers.best(frozenset({a, b})) == 1
    clock.now += 11  # no beat for a TTL: gone, as the server's timer would say
    assert peers.best(frozenset({a})) == 0


def test_what_fails_the_shared_rule_is_ignored_and_counted() -> None:
    own, peer = uuid.uuid4(), uuid.uuid4()
    peers = PeerCaches("alpha", lambda: own, ttl_s=10)
    subject, data = beat("alpha", peer, ("a" * 16,))
    peers.heard(f"hb.alpha.{uuid.uuid4()}", None, data)  # body names another session
    peers.heard(subject, None, b"not json")
    peers.heard(subject, None, data.replace(b"a" * 16, b"A" * 16))  # not a source id
    assert peers.refused == 3
    assert peers.best(frozenset({"a" * 16})) == 0


def test_caches_are_filled_only_where_the_pilot_process_reaches_every_node() -> None:
    assert caches_reachable("local", 4, mpi4py_workers=False)
    assert caches_reachable("slurm", 1, mpi4py_workers=False)
    assert not caches_reachable("slurm", 2, mpi4py_workers=False)
    assert not caches_reachable("local", 2, mpi4py_workers=True)


def _split(pair: tuple[str, bytes]) -> tuple[str, None, bytes]:
    return pair[0], None, pair[1]
