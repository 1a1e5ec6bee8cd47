"""Choosing a site for ``site: "auto"`` jobs (services/api/placement.py, submit.resolve_auto):
pure strategies over figures, no stack."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from datetime import UTC, datetime

import pytest
from pydantic import ValidationError

from lodestream.schemas.codec import decode, encode
from lodestream.schemas.events import JobCreated
from lodestream.schemas.placement import SiteChoice, SiteFigures
from lodestream.schemas.strategies import Strategy
from lodestream.services.api import submit
from lodestream.services.api.capacity import (
    NO_PILOT_WAIT_S,
    Node,
    RunTimes,
    SiteCapacity,
)
from lodestream.services.api.errors import InvalidInput
from lodestream.services.api.models import SiteCreate, SubmitRequest
from lodestream.services.api.placement import Placer, SiteLoad, choose
from lodestream.services.api.submit import AppInterface, Catalog

NOW = datetime(2025, 1, 2, tzinfo=UTC)


def load(backlog: int = 0, capacity: SiteCapacity | None = None, **assigned: int) -> SiteLoad:
    return SiteLoad(backlog=backlog, assigned=dict(assigned), capacity=capacity or SiteCapacity())


def pilot(slots: int, run_s: float | None = None, **queued: int) -> SiteCapacity:
    """A site with one open pilot of ``slots`` one-core nodes, running sim in ``run_s``."""
    return SiteCapacity(
        pilots=(tuple(Node(cores=1) for _ in range(slots)),),
        run_s={} if run_s is None else {"sim": run_s},
        queued=queued,
    )


def placer(
    loads: Mapping[str, SiteLoad],
    apps: Mapping[str, set[str]] | None = None,
    runs: RunTimes | None = None,
) -> Placer:
    defined = {site: frozenset((apps or {}).get(site, {"sim"})) for site in loads}
    return Placer(loads, defined, {}, runs)


def sequence(p: Placer, strategy: Strategy, n: int, app: str = "sim") -> list[str]:
    chosen = []
    for _ in range(n):
        choice = p.place(app, strategy)
        assert choice is not None
        chosen.append(choice.chosen)
    return chosen


def test_round_robin_rotates_from_the_counts_and_catches_up_a_new_site() -> None:
    even = placer({"c": load(), "a": load(), "b": load()})
    assert sequence(even, "round_robin", 7) == ["a", "b", "c", "a", "b", "c", "a"]
    # b already holds two of the user's sim jobs, c one: they wait their turn.
    behind = placer({"a": load(sim=2), "b": load(sim=2), "c": load(sim=1)})
    assert sequence(behind, "round_robin", 4) == ["c", "a", "b", "c"]
    # Other apps' jobs do not count towards this app's turn.
    other = placer({"a": load(other=9), "b": load(sim=1)})
    assert sequence(other, "round_robin", 2) == ["a", "a"]


def test_shortest_backlog_fills_the_emptiest_site_first() -> None:
    p = placer({"a": load(backlog=5), "b": load(backlog=2), "c": load(backlog=0)})
    assert sequence(p, "shortest_backlog", 6) == ["c", "c", "b", "c", "b", "c"]


def test_fastest_eta_splits_one_request_by_capacity() -> None:
    # Three pilots of 2 slots each; sim runs in 0.3 s, 1 s and 3 s. One job at a time to
    # where it would finish first: the best static split of 60 jobs, 44 / 12 / 4 (6.6 s).
    p = placer({
        "fast": load(capacity=pilot(2, 0.3)),
        "mid": load(capacity=pilot(2, 1.0)),
        "slow": load(capacity=pilot(2, 3.0)),
    })  # fmt: skip
    placed = sequence(p, "fastest_eta", 60)
    assert {site: placed.count(site) for site in ("fast", "mid", "slow")} == {
        "fast": 44, "mid": 12, "slow": 4,
    }  # fmt: skip
    last = p.place("sim", "fastest_eta")
    assert last is not None
    fast = last.candidates["fast"]
    assert fast.throughput_per_s == pytest.approx(2 / 0.3)
    assert fast.eta_s == pytest.approx(23 * 0.3)  # 44 jobs ahead on 2 slots: wave 23
    assert fast.backlog == 44


def test_fastest_eta_counts_the_work_queued_at_each_site() -> None:
    # a is twice as fast but has 8 sim jobs queued on its 2 slots: 4 waves of 1 s ahead.
    p = placer({"a": load(capacity=pilot(2, 1.0, sim=8)), "b": load(capacity=pilot(2, 2.0))})
    first = p.place("sim", "fastest_eta")
    assert first is not None
    assert first.chosen == "b"  # 2 s beats 5 s
    assert first.candidates["a"].eta_s == pytest.approx(5.0)
    # b's second slot also ends at 2 s, its next two at 4 s; then a's two slots at 5 s.
    assert sequence(p, "fastest_eta", 5) == ["b", "b", "b", "a", "a"]


def test_fastest_eta_sends_work_to_a_site_without_a_pilot_only_when_all_else_is_later() -> None:
    loads = {"busy": load(capacity=pilot(1, 1000.0, sim=3)), "idle": load()}
    p = placer(loads, runs=RunTimes({"sim": 1000.0}))
    first = p.place("sim", "fastest_eta")
    assert first is not None
    idle = first.candidates["idle"]
    assert idle.eta_s == pytest.approx(NO_PILOT_WAIT_S + 1000.0)  # the app's time elsewhere
    assert first.chosen == "busy"  # 4000 s beats 4600 s
    assert sequence(p, "fastest_eta", 2) == ["idle", "busy"]


def test_only_sites_defining_the_app_and_its_locations_are_candidates() -> None:
    loads = {"a": load(), "b": load(), "c": load()}
    apps = {"a": frozenset({"sim"}), "b": frozenset({"fit"}), "c": frozenset({"sim"})}
    p = Placer(loads, apps, {"c": frozenset({"beamline"})})
    assert p.sites_for("sim") == ["a", "c"]
    assert p.sites_for("sim", frozenset({"beamline"})) == ["c"]
    assert p.place("nope", "round_robin") is None
    choice = p.place("sim", "shortest_backlog", frozenset({"beamline"}))
    assert choice is not None
    assert (choice.chosen, set(choice.candidates)) == ("c", {"c"})


def test_ties_go_by_site_name() -> None:
    figures = SiteFigures(backlog=1, throughput_per_s=1.0, eta_s=2.0)
    for strategy in ("round_robin", "shortest_backlog", "fastest_eta"):
        assert choose(strategy, {"zz": figures, "mm": figures, "yy": figures}).chosen == "mm"


def catalog(loads: Mapping[str, SiteLoad], apps: Mapping[str, set[str]]) -> Catalog:
    interface = AppInterface.from_row({}, {})
    return Catalog(
        sites=frozenset(loads),
        apps={site: dict.fromkeys(names, interface) for site, names in apps.items()},
        own_jobs=frozenset(),
        loads=loads,
    )


def request(*jobs: dict[str, object]) -> SubmitRequest:
    return SubmitRequest.model_validate({"jobs": [{"workdir": "w", **job} for job in jobs]})


def test_resolve_auto_records_the_choice_in_the_created_event() -> None:
    cat = catalog({"a": load(backlog=3), "b": load(backlog=1)}, {"a": {"sim"}, "b": {"sim"}})
    req = request(
        {"site": "auto", "app": "sim"},
        {"site": "a", "app": "sim"},
        {"site": "auto", "app": "sim", "strategy": "round_robin"},
    )
    resolved = submit.resolve_auto(req, cat)
    assert [job.site for job in resolved.jobs] == ["b", "a", "a"]
    assert resolved.jobs[1] is req.jobs[1]  # a named site is passed through untouched
    ids = [uuid.uuid4() for _ in resolved.jobs]
    submit.check(resolved, ids, cat)
    plan = submit.build_events(resolved, ids, cat, user="ada", now=NOW, secret=b"s")
    event = plan.to_append[0]
    assert event.site == "b"
    again = decode(encode(event))  # as every consumer reads it from the log
    assert isinstance(again, JobCreated)
    choice = again.data.site_choice
    assert choice is not None
    assert (choice.strategy, choice.chosen) == ("shortest_backlog", "b")
    assert {s: f.backlog for s, f in choice.candidates.items()} == {"a": 3, "b": 1}
    assert b'"strategy"' not in encode(plan.to_append[1])  # the request's field stays out
    assert plan.to_append[1].data.site_choice is None


def test_auto_with_no_site_defining_the_app_is_a_clear_422() -> None:
    cat = catalog({"a": load(), "b": load()}, {"a": {"sim"}})
    with pytest.raises(InvalidInput) as caught:
        submit.resolve_auto(
            request({"site": "a", "app": "sim"}, {"site": "auto", "app": "fit"}), cat
        )
    assert "none of your sites defines app 'fit' (your sites: a, b)" in str(caught.value)
    problems = caught.value.details
    assert problems[0]["loc"] == ["body", "jobs", 1, "site"]


def test_bad_auto_input_is_refused_by_the_request_model() -> None:
    with pytest.raises(ValidationError, match='strategy applies only to site "auto"'):
        request({"site": "a", "app": "sim", "strategy": "round_robin"})
    with pytest.raises(ValidationError, match="strategy"):
        request({"site": "auto", "app": "sim", "strategy": "fastest"})
    figures = {"backlog": 0, "throughput_per_s": 1, "eta_s": 1}
    choice = {"strategy": "round_robin", "chosen": "a", "candidates": {"a": figures}}
    with pytest.raises(ValidationError, match="site_choice"):
        request({"site": "a", "app": "sim", "site_choice": choice})
    with pytest.raises(ValidationError, match="not among the candidates"):
        SiteChoice.model_validate({**choice, "chosen": "b"})


def test_no_site_may_be_registered_as_auto() -> None:
    with pytest.raises(ValidationError, match="'auto' is reserved"):
        SiteCreate(name="auto")
    assert SiteCreate(name="autos").name == "autos"
