"""The controller's backlog feed against a real read model of 100,000 jobs, 2,000 of them
runnable: one aggregate through an index per period (not a scan of the table), the right
numbers, and an event only when something changed."""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from typing import Any

import psycopg
import pytest

from lodestream.eventlog import Appended, Rejected
from lodestream.schemas.envelope import Event
from lodestream.schemas.events.scaler import ScalerBacklog, scaler_id
from lodestream.services.controller import reads as reads_module
from lodestream.services.controller.backlog import BacklogFeed
from lodestream.services.controller.reads import ReadModel

JOBS = 100_000
RUNNABLE = 2_000  # of site alpha; every other job has finished
POSITION = 100_000


class CapturingLog:
    """An EventLog that keeps what it is asked to append."""

    def __init__(self) -> None:
        self.events: list[Event] = []

    async def append_many(
        self, items: Sequence[tuple[Event, int | None]]
    ) -> list[Appended | Rejected]:
        self.events += [event for event, _ in items]
        return [Appended(event, len(self.events), duplicate=False) for event, _ in items]


def _fill(dsn: str) -> None:
    """100,000 jobs at two sites; 2,000 of alpha's runnable, 500 of those leased."""
    resources = (
        "jsonb_build_object('num_nodes', 1 + n %% 2, 'node_packing_count', 1 + n %% 4, "
        "'wall_time_min', n %% 50, 'ranks_per_node', 1, 'threads_per_rank', 1, "
        "'threads_per_core', 1, 'gpus_per_rank', 0, 'launch_params', '{}'::jsonb)"
    )
    state = (
        f"CASE WHEN n <= {RUNNABLE} THEN (CASE WHEN n %% 2 = 0 THEN 'PREPROCESSED' "
        "ELSE 'RESTART_READY' END) ELSE 'JOB_FINISHED' END"
    )
    beta = f"n %% 3 = 0 AND n > {RUNNABLE}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO rm.sites (name, id, owner, created_at, last_seq) VALUES "
            "('alpha', gen_random_uuid(), 'ada', now(), 1), "
            "('beta', gen_random_uuid(), 'bob', now(), 2)"
        )
        conn.execute(
            f"""
            INSERT INTO rm.jobs (id, site, owner, app, state, workdir, parameters, tags, data,
                                 resources, transfers, parent_ids, lease_session, created_seq,
                                 last_seq, created_at, updated_at, stage_times)
            SELECT gen_random_uuid(), CASE WHEN {beta} THEN 'beta' ELSE 'alpha' END,
                   CASE WHEN {beta} THEN 'bob' ELSE 'ada' END, 'hello', {state}, 'w/' || n,
                   '{{}}', '{{}}', '{{}}', {resources}, '{{}}', '{{}}',
                   CASE WHEN n <= 500 THEN gen_random_uuid() END, n, n, now(), now(), '{{}}'
            FROM generate_series(1, %s) AS n
            """,
            (JOBS,),
        )
        conn.execute("ANALYZE rm.jobs")
        conn.execute(
            "INSERT INTO rm.projector_position (stream, seq, updated_at) "
            "VALUES ('EVENTS', %s, now())",
            (POSITION,),
        )
        conn.execute(
            "INSERT INTO rm.scalers (site, scaler_id, last_seq) VALUES (%s, %s, 3)",
            ("alpha", scaler_id("alpha")),
        )


def _expected(dsn: str) -> tuple[int, float, int]:
    """The same numbers, the slow way, to check the aggregate against."""
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT resources FROM rm.jobs WHERE site = 'alpha' AND lease_session IS NULL "
            "AND state IN ('PREPROCESSED', 'RESTART_READY')"
        ).fetchall()
    footprint = sum(r["num_nodes"] / r["node_packing_count"] for (r,) in rows)
    return len(rows), round(footprint, 6), max(r["wall_time_min"] for (r,) in rows)


def _plan(dsn: str) -> dict[str, Any]:
    statement = reads_module._BACKLOG
    params = statement.params(sites=["alpha"], states=["PREPROCESSED", "RESTART_READY"])
    with psycopg.connect(dsn) as conn:
        query = statement.sql.as_string(conn)
        (plan,) = conn.execute("EXPLAIN (FORMAT JSON) " + query, params).fetchone()  # type: ignore[misc]
    return plan[0]["Plan"]  # type: ignore[no-any-return]


def _nodes(plan: dict[str, Any]) -> list[dict[str, Any]]:
    return [plan, *(n for child in plan.get("Plans", []) for n in _nodes(child))]


@pytest.fixture
def filled(database_url: str) -> str:
    _fill(database_url)
    return database_url


async def test_the_backlog_is_one_aggregate_on_the_site_state_index(filled: str) -> None:
    scans = [n for n in _nodes(_plan(filled)) if "Scan" in n["Node Type"]]
    # An index (or bitmap) scan, jobs_site_state as a rule, and the heap rows it finds: never
    # a scan of the whole table.
    assert "Seq Scan" not in {n["Node Type"] for n in scans}, json.dumps(scans)
    assert any("Index Name" in n for n in scans), json.dumps(scans)
    assert {n["Relation Name"] for n in scans if "Relation Name" in n} <= {"jobs"}

    read_model = ReadModel(filled)
    try:
        [alpha] = (await read_model.backlogs(["alpha", "beta"])).values()
    finally:
        await read_model.close()
    jobs, footprint, max_wall = _expected(filled)
    assert (alpha.jobs, round(alpha.node_footprint, 6), alpha.max_wall_time_min) == (
        jobs, footprint, max_wall,
    )  # fmt: skip
    assert jobs == RUNNABLE - 500


async def test_a_backlog_is_appended_for_elastic_sites_only_and_only_when_it_changed(
    filled: str,
) -> None:
    captured = CapturingLog()
    newest_batch = {"alpha": 0}

    async def newest(site: str) -> int:
        return newest_batch.get(site, 0)

    feed = BacklogFeed(ReadModel(filled), captured, newest, period_s=1)  # type: ignore[arg-type]
    try:
        assert await feed.run_once() == 1
        assert await feed.run_once() == 0  # nothing changed: nothing said
        with psycopg.connect(filled, autocommit=True) as conn:
            conn.execute(
                "INSERT INTO rm.batch_jobs (id, site, state, num_nodes, wall_time_min, job_mode, "
                "filter_tags, created_at, updated_at, last_seq, requested_by) VALUES "
                "(%s, 'alpha', 'queued', 4, 30, 'mpi', '{}', now(), now(), 99, 'site:alpha'), "
                "(%s, 'alpha', 'finished', 4, 30, 'mpi', '{}', now(), now(), 98, 'user:ada')",
                (uuid.uuid4(), uuid.uuid4()),
            )
        assert await feed.run_once() == 1
        assert await feed.run_once() == 0
        # A batch event of alpha that changed nothing in the read model (a refused one, say),
        # once the projector is past it: alpha gets a backlog that has seen it, all the same.
        newest_batch["alpha"] = POSITION + 5
        assert await feed.run_once() == 0  # the projector is not past it yet
        with psycopg.connect(filled, autocommit=True) as conn:
            conn.execute("UPDATE rm.projector_position SET seq = seq + 10")
        assert await feed.run_once() == 1
    finally:
        await feed.close()
    first, second, third = captured.events
    assert isinstance(first, ScalerBacklog)
    assert isinstance(second, ScalerBacklog)
    assert {e.site for e in captured.events} == {"alpha"}  # beta has no elastic queue
    assert first.aggregate_id == scaler_id("alpha")
    assert first.data.runnable_jobs == RUNNABLE - 500
    assert first.data.batch_jobs == ()
    [queued] = second.data.batch_jobs  # the finished one is not open
    assert (queued.state, queued.num_nodes, queued.elastic) == ("queued", 4, True)
    assert isinstance(third, ScalerBacklog)
    assert third.data.same_as(second.data)
    assert (second.data.as_of_seq, third.data.as_of_seq) == (POSITION, POSITION + 10)
