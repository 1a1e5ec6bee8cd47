"""What ``site: "auto"`` reads of the owner's sites: four queries per request, not per job.

The rows go to the pure functions of :mod:`lodestream.services.api.capacity`; the counts
to :class:`lodestream.services.api.placement.SiteLoad`.
"""

from __future__ import annotations

from collections.abc import Collection
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import ColumnElement, DateTime, func, over, select
from sqlalchemy.ext.asyncio import AsyncConnection

from lodestream.infra.postgres.tables import jobs, sessions
from lodestream.schemas.states import NON_FINAL, JobState
from lodestream.services.api.capacity import (
    RUN_SAMPLE,
    RUN_WINDOW_S,
    SLOT_STATES,
    RunTimes,
    read_capacities,
)
from lodestream.services.api.placement import SiteLoad


def _stage(state: JobState) -> ColumnElement[Any]:
    """When the job entered ``state``, from its ``stage_times`` (NULL if it did not)."""
    entered: ColumnElement[Any] = jobs.c.stage_times[state.value].astext
    return entered.cast(DateTime(timezone=True))


async def site_loads(
    conn: AsyncConnection, owner: str, names: Collection[str], now: datetime | None
) -> tuple[dict[str, SiteLoad], RunTimes]:
    """Each site's load and capacity, and the apps' run times across the sites:

    * its jobs not final, by app and state (index jobs_site_state): the backlog, and the
      jobs that still need a slot;
    * its open pilots' nodes (index sessions_site_state), those past their deadline left out;
    * the run times (RUNNING → RUN_DONE, or JOB_FINISHED when the run ended the job) of the
      last ``RUN_SAMPLE`` jobs of each app it finished within ``RUN_WINDOW_S`` (index
      jobs_updated: a finished job is never updated again);
    * the owner's jobs per app there (index jobs_app), round robin's turn.
    """
    listed = sorted(names)
    at = now or datetime.now(UTC)
    count = func.count()
    result = await conn.execute(
        select(jobs.c.site, jobs.c.app, jobs.c.state, count)
        .where(jobs.c.site.in_(listed), jobs.c.state.in_(sorted(s.value for s in NON_FINAL)))
        .group_by(jobs.c.site, jobs.c.app, jobs.c.state)
    )
    backlog = dict.fromkeys(listed, 0)
    queued: list[tuple[str, str, int]] = []
    for site, app, state, n in result:
        backlog[site] += n
        if state in SLOT_STATES:
            queued.append((site, app, n))
    result = await conn.execute(
        select(sessions.c.site, sessions.c.nodes).where(
            sessions.c.site.in_(listed), sessions.c.state == "open", sessions.c.deadline > at
        )
    )
    pilots = [(site, nodes) for site, nodes in result]
    run_s = func.extract(
        "epoch", func.coalesce(_stage(JobState.RUN_DONE), _stage(JobState.JOB_FINISHED))
        - _stage(JobState.RUNNING)
    )  # fmt: skip
    recent = (
        select(
            jobs.c.site,
            jobs.c.app,
            run_s.label("run_s"),
            over(
                func.row_number(),
                partition_by=(jobs.c.site, jobs.c.app),
                order_by=jobs.c.updated_at.desc(),
            ).label("n"),
        )
        .where(
            jobs.c.updated_at > at - timedelta(seconds=RUN_WINDOW_S),
            jobs.c.site.in_(listed),
            jobs.c.state == JobState.JOB_FINISHED.value,
        )
        .subquery()
    )
    result = await conn.execute(
        select(recent.c.site, recent.c.app, recent.c.run_s).where(
            recent.c.n <= RUN_SAMPLE, recent.c.run_s.is_not(None)
        )
    )
    runs = [(site, app, float(seconds)) for site, app, seconds in result]
    capacities, run_times = read_capacities(listed, pilots, runs, queued)
    loads = {
        site: SiteLoad(backlog=backlog[site], assigned={}, capacity=capacities[site])
        for site in listed
    }
    result = await conn.execute(
        select(jobs.c.site, jobs.c.app, count)
        .where(jobs.c.site.in_(listed), jobs.c.owner == owner)
        .group_by(jobs.c.site, jobs.c.app)
    )
    for site, app, n in result:
        loads[site].assigned[app] = n
    return loads, run_times
