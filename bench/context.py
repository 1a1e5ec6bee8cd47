"""What the phases share: the stack, one NATS connection, the site, and the jobs made so far."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import httpx
from nats.aio.client import Client
from pydantic import SecretStr

from bench.append import Appender
from bench.probe import Positions
from bench.stack import BenchError, BenchStack
from bench.workload import Events, now_iso
from lodestream.natsconn import connect
from lodestream.settings import NatsSettings

SITE = "bench"
HTTP_TIMEOUT_S = 120.0
SITE_TIMEOUT_S = 60.0


@dataclass(slots=True)
class Bench:
    stack: BenchStack
    nc: Client
    appender: Appender
    positions: Positions
    events: Events
    scale: float
    next_index: int = 0  # global job index: tags and apps follow it (see workload)
    fresh_jobs: list[str] = field(default_factory=list)  # jobs still CREATED, for lifecycles

    @property
    def owner(self) -> str:
        return self.stack.info.user

    def take_indexes(self, count: int) -> int:
        first = self.next_index
        self.next_index += count
        return first

    def scaled(self, n: int, minimum: int = 1) -> int:
        return max(minimum, round(n * self.scale))

    def http(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(
            base_url=self.stack.info.api_url,
            headers={
                "Authorization": f"Bearer {self.stack.info.token}",
                "Content-Type": "application/json",
            },
            timeout=HTTP_TIMEOUT_S,
        )

    async def take_fresh_jobs(self, count: int, timeout_s: float) -> list[str]:
        """``count`` jobs in state CREATED; appends new ones if the submit phase left too few."""
        missing = count - len(self.fresh_jobs)
        if missing > 0:
            first = self.take_indexes(missing)
            at = now_iso()
            jobs = [self.events.ids.take() for _ in range(missing)]
            created = [self.events.created(job, first + k, at) for k, job in enumerate(jobs)]
            await self.appender.append(created, timeout_s)
            self.fresh_jobs.extend(jobs)
            await self.positions.caught_up(timeout_s, "projecting the jobs a phase needs")
        taken, self.fresh_jobs = self.fresh_jobs[:count], self.fresh_jobs[count:]
        return taken


async def register_site(bench: Bench) -> None:
    async with bench.http() as client, asyncio.timeout(SITE_TIMEOUT_S):
        response = await client.post("/sites", params={"wait": "true"}, json={"name": SITE})
    if response.status_code not in {200, 201}:
        raise BenchError(f"POST /sites: {response.status_code} {response.text[:500]}")


@asynccontextmanager
async def open_bench(stack: BenchStack, scale: float) -> AsyncIterator[Bench]:
    info = stack.info
    nc = await connect(
        NatsSettings(
            url=info.nats_url, user=info.control_user, password=SecretStr(info.control_password)
        ),
        name="lode-bench",
    )
    positions = await Positions.connect(nc.jetstream(), info.database_url)
    try:
        bench = Bench(
            stack=stack,
            nc=nc,
            appender=Appender.over(nc),
            positions=positions,
            events=Events(SITE, info.user),
            scale=scale,
        )
        await register_site(bench)
        yield bench
    finally:
        await positions.close()
        await asyncio.wait_for(nc.close(), 10)
