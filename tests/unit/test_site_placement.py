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
from lodestream.services.api.errors import InvalidInput
from lodestream.services.api.models import SiteCreate, SubmitRequest
from lodestream.services.api.placement import (
    THROUGHPUT_FLOOR_PER_S,
    Placer,
    SiteLoad,
    choose,
)
from lodestream.services.api.submit import AppInterface, Catalog

WINDOW = 600.0
NOW = datetime(2025, 1, 2, tzinfo=UTC)


def load(backlog: int = 0, finished: int = 0, **assigned: int) -> SiteLoad:
    return SiteLoad(backlog=backlog, finished_recently=finished, assigned=dict(assigned))


def placer(loads: Mapping[str, SiteLoad], apps: Mapping[str, set[str]] | None = None) -> Placer:
    defined = {site: frozenset((apps or {}).get(site, {"sim"})) for site in loads}
    return Placer(loads, defined, {}, window_s=WINDOW)


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


def test_fastest_eta_weighs_the_backlog_by_the_measured_rate() -> None:
    # a finished 60 jobs in the window (0.1/s), b 6 (0.01/s), c nothing (the floor).
    p = placer({"a": load(backlog=20, finished=60), "b": load(finished=6), "c": load()})
    first = p.place("sim", "fastest_eta")
    assert first is not None
    assert first.chosen == "b"  # 1 / 0.01 = 100 s beats (20 + 1) / 0.1 = 210 s
    a = first.candidates["a"]
    assert (a.backlog, a.throughput_per_s) == (20, 0.1)
    assert a.eta_s == pytest.approx(210.0)
    assert first.candidates["c"].throughput_per_s == THROUGHPUT_FLOOR_PER_S
    # Each job placed adds to its site's backlog: b takes the next one (200 s), then a's
    # 210 s and 220 s beat b's 300 s; the unmeasured site c, at 3600 s, gets none.
    assert sequence(p, "fastest_eta", 3) == ["b", "a", "a"]


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
