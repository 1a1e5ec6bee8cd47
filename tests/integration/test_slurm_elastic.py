"""The elastic queue against the real test Slurm (tests/fixtures/slurm.py).

A whole stack whose controller sends backlogs every half second, and site ``alpha`` whose agent
(``lode site start``) runs the elastic queue from ``elastic:`` in its settings, every second;
the pilots it asks for are submitted with ``sbatch`` and run as ``generic-slurm`` pilots. The
user only submits jobs.

* Under a backlog of six single-node jobs, with the cluster full (a job of someone else holds
  every node), it asks for pilots of at most two nodes, never more than ``max_queued_jobs``
  (two) waiting at once, in the read model as in ``squeue``; once the cluster frees up they
  run the jobs, and with the backlog gone it asks for nothing more.
* With ``use_backfill``, two nodes busy and the third idle until a reservation starts in 14
  minutes, it reads that window from ``sinfo`` (one node, 13 minutes) and asks for a pilot
  fitted into it (one node, the window less the pad), which Slurm starts on that node at once.

Every ``scaler.decided`` is read back through ``GET /sites/alpha/scaler`` and replayed: the
policy, given the inputs it records, decides the same.
"""

from __future__ import annotations

import contextlib
import re
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import httpx
import psycopg
import pytest

from lodestream.agents.site.elastic.policy import plan
from lodestream.agents.site.settings import ElasticSettings
from lodestream.infra.postgres.server import EmbeddedPostgres
from lodestream.schemas.events.scaler import ScalerBacklogData, ScalerLimits, WindowData
from lodestream.schemas.states import FINAL
from tests.fixtures.slurm import SlurmCluster
from tests.support.slurm_site import SITE, SlurmSite, jobs_in, running_slurm_site, until

pytestmark = pytest.mark.slow  # each runs for tens of seconds, a few of them waiting on purpose

SCALER_PERIOD_S = 0.5  # the controller's backlog period
ELASTIC: dict[str, Any] = {
    "enabled": True, "period_s": 1, "queue": "debug", "job_mode": "serial",
    "min_nodes": 1, "max_nodes": 2, "min_wall_time_min": 5, "max_wall_time_min": 10,
    "wall_time_pad_min": 1, "max_queued_jobs": 2,
}  # fmt: skip
WAITING = frozenset({"requested", "submitted", "queued"})
ELASTIC_ACTOR = f"site:{SITE}"


@pytest.fixture(scope="module")
def elastic_site(
    slurm_cluster: SlurmCluster,
    tmp_path_factory: pytest.TempPathFactory,
    postgres_server: EmbeddedPostgres,
) -> Iterator[SlurmSite]:
    root = tmp_path_factory.mktemp("slurm-elastic")
    with running_slurm_site(
        slurm_cluster, root, postgres_server,
        stack_env={"LODE_CONTROLLER__SCALER_PERIOD_S": str(SCALER_PERIOD_S)},
    ) as site:  # fmt: skip
        yield site


@pytest.fixture
def site(elastic_site: SlurmSite) -> Iterator[SlurmSite]:
    """The site with its agent running, no elastic queue yet; whatever the test left is
    killed or cancelled after it."""
    restart_agent(elastic_site, ElasticSettings())
    yield elastic_site
    elastic_site.stop_agent()
    for job in unfinished_jobs(elastic_site):
        with contextlib.suppress(Exception):
            elastic_site.client.kill_job(job)
    elastic_site.slurm.cancel_all()


def restart_agent(site: SlurmSite, elastic: ElasticSettings) -> None:
    site.stop_agent()
    assert site.write_settings(elastic=elastic).elastic == elastic
    site.start_agent()


def start_elastic(site: SlurmSite, **limits: Any) -> ElasticSettings:
    """Restart the site's agent with ``elastic:`` (``ELASTIC`` and ``limits``) in its settings."""
    elastic = ElasticSettings.model_validate(ELASTIC | limits)
    restart_agent(site, elastic)
    return elastic


def runnable_jobs(site: SlurmSite, count: int, **spec: Any) -> list[str]:
    """``count`` hello jobs, once the agent has preprocessed them all (the backlog is whole)."""
    submitted = site.client.submit_jobs([
        {"site": SITE, "app": "hello", "workdir": f"e/{uuid.uuid4()}", **spec}
        for _ in range(count)
    ], wait=True)  # fmt: skip
    jobs = [j["id"] for j in submitted["jobs"]]
    until("the jobs are runnable", lambda: jobs_in(site, jobs, "PREPROCESSED"), site)
    return jobs


def rows(site: SlurmSite, query: str, *args: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(site.stack.database_url) as conn:
        return list(conn.execute(query, args).fetchall())


def unfinished_jobs(site: SlurmSite) -> list[str]:
    found = rows(site, "SELECT id, state FROM rm.jobs WHERE site = %s", SITE)
    return [str(job) for job, state in found if state not in FINAL]


def elastic_batch_jobs(site: SlurmSite, since: datetime) -> list[dict[str, Any]]:
    """The batch jobs the elastic queue requested since ``since``, oldest first."""
    found = rows(
        site,
        "SELECT id, state, num_nodes, wall_time_min, queue, job_mode, scheduler_id "
        "FROM rm.batch_jobs WHERE site = %s AND requested_by = %s AND created_at >= %s "
        "ORDER BY created_at, id",
        SITE, ELASTIC_ACTOR, since,
    )  # fmt: skip
    keys = ("id", "state", "num_nodes", "wall_time_min", "queue", "job_mode", "scheduler_id")
    return [dict(zip(keys, row, strict=True)) for row in found]


@dataclass(frozen=True)
class Decision:
    """One ``scaler.decided`` as ``GET /sites/{site}/scaler`` shows it."""

    seq: int
    decided_at: datetime
    reason: str
    queued: int
    running: int
    requests: list[dict[str, Any]]
    windows: list[WindowData] | None
    backlog: ScalerBacklogData | None
    limits: ScalerLimits

    def replayed(self) -> tuple[list[dict[str, Any]], str]:
        """What the policy decides on the recorded inputs: the requests and the reason."""
        result = plan(self.backlog, self.windows, self.limits, self.decided_at)
        return [p.request.model_dump(mode="json") for p in result.requests], result.reason


def decisions(site: SlurmSite, after_seq: int = 0) -> list[Decision]:
    """The site's decisions after ``after_seq``, oldest first."""
    response = httpx.get(
        f"{site.stack.api_url}/sites/{SITE}/scaler", params={"limit": 1000},
        headers={"Authorization": f"Bearer {site.env['LODE_TOKEN']}"}, timeout=30,
    )  # fmt: skip
    response.raise_for_status()
    found = []
    for d in response.json()["decisions"]:
        if d["seq"] <= after_seq:
            continue
        found.append(Decision(
            seq=d["seq"], decided_at=datetime.fromisoformat(d["decided_at"]),
            reason=d["reason"], queued=d["queued"], running=d["running"],
            requests=d["requests"],
            windows=None if d["windows"] is None else [WindowData(**w) for w in d["windows"]],
            backlog=None if d["backlog"] is None else ScalerBacklogData(**d["backlog"]),
            limits=ScalerLimits(**d["limits"]),
        ))  # fmt: skip
    return sorted(found, key=lambda d: d.seq)


def last_seq(site: SlurmSite) -> int:
    return max((d.seq for d in decisions(site)), default=0)


@dataclass
class QueueWatch:
    """What waited in the queue, as often as the test looked: the read model and squeue."""

    site: SlurmSite
    since: datetime
    waiting: list[int] = field(default_factory=list)  # the elastic queue's, read model
    pending: list[int] = field(default_factory=list)  # lode's pilots PENDING in squeue

    def look(self) -> None:
        jobs = elastic_batch_jobs(self.site, self.since)
        self.waiting.append(sum(1 for j in jobs if j["state"] in WAITING))
        listed = self.site.slurm.run("squeue", "-h", "-t", "PENDING", "-o", "%j").stdout
        self.pending.append(sum(1 for name in listed.split() if name.startswith("lode-")))


def now_db(site: SlurmSite) -> datetime:
    [(now,)] = rows(site, "SELECT now()")
    assert isinstance(now, datetime)
    return now


def check_recorded(history: list[Decision], limits: ScalerLimits) -> None:
    """Each decision records the site's limits, replays to itself and respects max_queued."""
    for decided in history:
        assert decided.limits == limits
        requests, reason = decided.replayed()
        assert requests == [r["request"] for r in decided.requests]
        assert reason == decided.reason
        assert decided.queued + len(decided.requests) <= limits.max_queued_jobs


def stays_quiet(site: SlurmSite, after_seq: int, periods: int, period_s: float) -> list[Decision]:
    """The decisions made after ``after_seq`` while ``periods`` elastic periods go by."""
    time.sleep(periods * period_s)
    return decisions(site, after_seq)


def test_the_elastic_queue_fills_slurm_up_to_max_queued_and_stops_with_the_backlog(
    site: SlurmSite,
) -> None:
    slurm = site.slurm
    # Someone else's job holds the whole cluster: whatever is submitted waits in the queue.
    blocker = slurm.sbatch("#!/bin/bash\nsleep 600\n", nodes=3, exclusive=True, time=30,
                           job_name="blocker")  # fmt: skip
    slurm.wait_state(blocker, {"RUNNING"}, timeout=60)
    jobs = runnable_jobs(site, 6)
    since, first_seq = now_db(site), last_seq(site)
    elastic = start_elastic(site)
    watch = QueueWatch(site, since)

    def two_queued() -> bool:
        watch.look()
        found = elastic_batch_jobs(site, since)
        return len(found) == 2 and all(j["state"] == "queued" for j in found)

    until("two pilots queued at Slurm", two_queued, site)
    queued = elastic_batch_jobs(site, since)
    assert [(j["num_nodes"], j["wall_time_min"], j["queue"], j["job_mode"]) for j in queued] == [
        (2, 5, "debug", "serial")
    ] * 2  # 6 nodes short, 2 at most per pilot; 0 + 1 min pad, raised to min_wall_time_min
    for job in queued:
        shown = slurm.run("scontrol", "-o", "show", "job", job["scheduler_id"]).stdout
        assert "JobState=PENDING" in shown
        assert "NumNodes=2" in shown
        assert "TimeLimit=00:05:00" in shown
        assert f"JobName=lode-{job['id']}" in shown

    # Under the same backlog, the queue full: it says so and asks for nothing more.
    def says_full() -> bool:
        watch.look()
        return any("max_queued_jobs is 2" in d.reason for d in decisions(site, first_seq))

    until("a decision that the queue is full", says_full, site)
    for _ in range(10):  # ten looks over five elastic periods
        watch.look()
        time.sleep(elastic.period_s / 2)
    assert len(elastic_batch_jobs(site, since)) == 2

    # The cluster frees up: the pilots run the jobs, and the backlog goes away.
    slurm.run("scancel", str(blocker))

    def finished() -> bool:
        watch.look()
        return jobs_in(site, jobs, "JOB_FINISHED")

    until("the pilots ran the backlog", finished, site, 180)

    def nothing_runnable() -> list[Decision]:
        watch.look()
        return [d for d in decisions(site, first_seq) if d.reason == "nothing runnable"]

    quiet_from = until("a decision on the empty backlog", nothing_runnable, site)[0].seq

    def all_ended() -> bool:
        watch.look()
        return all(j["state"] == "finished" for j in elastic_batch_jobs(site, since))

    until("the elastic pilots ended", all_ended, site, 180)
    later = stays_quiet(site, quiet_from, periods=5, period_s=elastic.period_s)
    assert [d.requests for d in later] == [[]] * len(later)
    watch.look()
    until("Slurm has nothing left to run", lambda: not slurm.active_jobs(), site)

    history = decisions(site, first_seq)
    check_recorded(history, elastic.limits)
    assert all(d.windows is None for d in history)  # no use_backfill: no sinfo asked
    asked = [d for d in history if d.requests]
    assert [r["request"]["num_nodes"] for r in asked[0].requests] == [2, 2]
    assert asked[0].backlog is not None
    assert asked[0].backlog.runnable_jobs == 6
    full = next(d for d in history if "max_queued_jobs is 2" in d.reason)
    assert (full.queued, full.requests) == (2, [])
    assert full.backlog is not None
    assert full.backlog.runnable_jobs == 6
    ended = elastic_batch_jobs(site, since)
    assert len(ended) == sum(len(d.requests) for d in history)
    assert all(j["state"] == "finished" for j in ended)
    assert max(watch.waiting) == 2
    assert max(watch.pending) == 2


@contextlib.contextmanager
def reservation(slurm: SlurmCluster, node: str, *, starts_in_min: int) -> Iterator[datetime]:
    """A reservation of ``node`` for root, starting in ``starts_in_min``; yields its start."""
    name = f"soon{uuid.uuid4().hex[:8]}"
    slurm.run("scontrol", "create", "reservation", f"reservationname={name}",
              f"starttime=now+{starts_in_min}minutes", "duration=60", f"nodes={node}",
              "users=root")  # fmt: skip
    try:
        shown = slurm.run("scontrol", "-o", "show", "reservation", name).stdout
        start = re.search(r"\bStartTime=(\S+)", shown)
        assert start is not None, shown
        yield datetime.fromisoformat(start.group(1)).astimezone()  # Slurm's local time
    finally:
        slurm.run("scontrol", "delete", f"reservation={name}", check=False)


def test_with_use_backfill_it_fits_a_pilot_into_the_window_sinfo_shows(site: SlurmSite) -> None:
    slurm = site.slurm
    # n1 and n2 busy for half an hour; n3 idle, but reserved from 14 minutes on: the one
    # backfill window is one node for 13 minutes (14, less the seconds already gone).
    blocker = slurm.sbatch("#!/bin/bash\nsleep 600\n", nodes=2, nodelist="n1,n2",
                           exclusive=True, time=30, job_name="blocker")  # fmt: skip
    slurm.wait_state(blocker, {"RUNNING"}, timeout=60)
    with reservation(slurm, "n3", starts_in_min=14) as reserved_from:
        # Three 5-minute jobs: 3 nodes short, a pilot wanted for 5 + 5 minutes.
        jobs = runnable_jobs(site, 3, wall_time_min=5)
        since, first_seq = now_db(site), last_seq(site)
        elastic = start_elastic(
            site, use_backfill=True, max_nodes=3, max_queued_jobs=1, min_wall_time_min=2,
            max_wall_time_min=60, wall_time_pad_min=5,
        )  # fmt: skip

        [pilot] = until("a pilot fitted into the window",
                        lambda: elastic_batch_jobs(site, since), site)  # fmt: skip
        fitted = next(d for d in decisions(site, first_seq) if d.requests)
        assert fitted.windows is not None
        [window] = fitted.windows
        assert (window.queue, window.nodes) == ("debug", 1)
        # As long as until the reservation starts, as sinfo told it just before deciding.
        left = int((reserved_from - fitted.decided_at).total_seconds()) // 60
        assert window.minutes in {left, left + 1}
        assert window.minutes >= 11  # a pilot of its minutes less the pad takes 5-minute jobs
        [request] = fitted.requests
        assert request["window"] == window.model_dump(mode="json")
        # One node, as long as the window less the pad: shorter than the 10 it wanted.
        wall = window.minutes - 5
        assert (request["request"]["num_nodes"], request["request"]["wall_time_min"]) == (1, wall)
        assert (pilot["num_nodes"], pilot["wall_time_min"], pilot["queue"]) == (1, wall, "debug")

        until("the pilot ran the backlog", lambda: jobs_in(site, jobs, "JOB_FINISHED"), site, 180)

        def nothing_runnable() -> list[Decision]:
            return [d for d in decisions(site, first_seq) if d.reason == "nothing runnable"]

        quiet_from = until("a decision on the empty backlog", nothing_runnable, site)[0].seq
        until("the pilot ended",
              lambda: elastic_batch_jobs(site, since)[0]["state"] == "finished", site)  # fmt: skip
        later = stays_quiet(site, quiet_from, periods=5, period_s=elastic.period_s)
        assert [d.requests for d in later] == [[]] * len(later)

    [pilot] = elastic_batch_jobs(site, since)
    ran = until("Slurm recorded the pilot's end",
                lambda: slurm.jobcomp().get(pilot["scheduler_id"]), site)  # fmt: skip
    # Slurm started it at once, on the node of the window, for the minutes it was fitted to.
    assert (ran["JobState"], ran["NodeList"], ran["TimeLimit"]) == ("COMPLETED", "n3", str(wall))
    history = decisions(site, first_seq)
    check_recorded(history, elastic.limits)
    assert all(d.windows is not None for d in history)  # sinfo asked at every decision
