"""Every event, once, in order, on every site: watches that share a credential, crash,
stop and resume, or sit idle (issue 30)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import signal
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path

import pytest
from nats.js import JetStreamContext

from lodestream.client.errors import WatchError, WatchGap, WatchNotice
from lodestream.client.watch import Watch, Watched, connect_monitor, watch
from lodestream.infra.nats.monitor import SLOTS, consumer_names, create_subject
from lodestream.schemas.subjects import EVENTS_STREAM
from lodestream.settings import NatsSettings
from tests.fixtures.nats import SecureNats
from tests.support.watching import append_jobs, monitor_for

pytestmark = pytest.mark.filterwarnings("ignore::lodestream.client.errors.WatchNotice")

EVENTS_PER_JOB = 5
CHILD = """
import asyncio, sys
from pathlib import Path
from lodestream.client.credential import MonitorCredential
from lodestream.client.watch import watch

async def main() -> None:
    credential = MonitorCredential.load(Path(sys.argv[1]))
    async with watch(credential, [sys.argv[2]], since=1) as w:
        async for item in w:
            print(item.seq, flush=True)

asyncio.run(main())
"""


@pytest.fixture
def secure_js(secure_nats: SecureNats, js: JetStreamContext) -> JetStreamContext:
    return js


@pytest.fixture
def nats_settings(secure_nats: SecureNats) -> NatsSettings:
    return secure_nats.settings()


async def collect(w: Watch, count: int) -> list[Watched]:
    """Read ``count`` events from ``w`` (already open)."""
    got: list[Watched] = []
    async with asyncio.timeout(60):
        async for item in w:
            got.append(item)
            if len(got) >= count:
                break
    return got


async def stored(js: JetStreamContext, site: str) -> list[int]:
    """The site's events as the stream itself holds them, by sequence."""
    last = (await js.stream_info(EVENTS_STREAM)).state.last_seq
    seqs = []
    for seq in range(1, last + 1):
        msg = await js.get_msg(EVENTS_STREAM, seq)
        if (msg.subject or "").startswith(f"evt.{site}."):
            seqs.append(seq)
    return seqs


def by_site(items: Sequence[Watched]) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for item in items:
        out.setdefault(item.site, []).append(item.seq)
    return out


async def test_a_crashed_watchers_consumer_is_never_adopted(
    secure_nats: SecureNats, secure_js: JetStreamContext, tmp_path: Path
) -> None:
    seqs = await append_jobs(secure_js, "alpha", 6)
    credential = monitor_for(secure_nats, ["alpha"])
    path = credential.save(tmp_path / "monitor.json")
    child = await asyncio.create_subprocess_exec(
        sys.executable, "-c", CHILD, str(path), "alpha", stdout=asyncio.subprocess.PIPE
    )
    assert child.stdout is not None
    async with asyncio.timeout(60):
        printed = [int(await child.stdout.readline()) for _ in range(11)]
    child.send_signal(signal.SIGKILL)  # its consumer stays behind, past all it read
    await child.wait()
    assert printed == seqs[:11]
    async with watch(credential, ["alpha"], since=1) as w:
        got = await collect(w, len(seqs))
    assert [g.seq for g in got] == seqs


@pytest.mark.parametrize("watchers", [2, 3])
async def test_concurrent_watchers_of_one_user_each_get_every_event(
    secure_nats: SecureNats, secure_js: JetStreamContext, watchers: int
) -> None:
    credential = monitor_for(secure_nats, ["alpha", "beta"])
    ws = [watch(credential, ["alpha", "beta"], since="now") for _ in range(watchers)]
    for w in ws:
        await w.__aenter__()
    try:
        alpha = await append_jobs(secure_js, "alpha", 8)
        beta = await append_jobs(secure_js, "beta", 4)
        results = await asyncio.gather(*(collect(w, len(alpha + beta)) for w in ws))
    finally:
        for w in ws:
            await w.close()
    for got in results:
        assert by_site(got) == {"alpha": alpha, "beta": beta}


async def test_a_three_site_watch_cut_and_resumed_from_its_cursor_misses_nothing(
    secure_nats: SecureNats, secure_js: JetStreamContext
) -> None:
    sites = ["fast", "mid", "slow"]
    credential = monitor_for(secure_nats, sites)
    await append_jobs(secure_js, "fast", 20)
    await append_jobs(secure_js, "mid", 2)  # slow: nothing before the cut
    w = watch(credential, sites, since=1)
    async with w:
        first = await collect(w, 37)  # cut mid-stream: part of fast, maybe some of mid
    cursor = w.positions
    assert set(cursor) == set(sites)
    assert cursor["slow"] == 1
    for site in sites:  # appended during the cut
        await append_jobs(secure_js, site, 3)
    expected = {site: await stored(secure_js, site) for site in sites}
    total = sum(map(len, expected.values()))
    w2 = watch(credential, sites, since=cursor)
    async with w2:
        rest = await collect(w2, total - len(first))
    assert by_site(first + rest) == expected  # every sequence once, in order, per site
    assert w2.resumes == 0


async def test_since_positions_keeps_an_idle_site(
    secure_nats: SecureNats, secure_js: JetStreamContext
) -> None:
    credential = monitor_for(secure_nats, ["alpha", "beta"])
    w = watch(credential, ["alpha", "beta"], since="now")
    async with w:
        alpha = await append_jobs(secure_js, "alpha", 2)
        await collect(w, len(alpha))
    cursor = w.positions
    assert cursor == {"alpha": alpha[-1] + 1, "beta": alpha[0]}  # beta: where the watch began
    beta = await append_jobs(secure_js, "beta", 2)  # while nobody watches
    async with watch(credential, ["alpha", "beta"], since=cursor) as again:
        got = await collect(again, len(beta))
    assert by_site(got) == {"beta": beta}


async def test_a_cursor_the_log_cannot_honour_is_an_error(
    secure_nats: SecureNats, secure_js: JetStreamContext
) -> None:
    credential = monitor_for(secure_nats, ["alpha", "beta"])
    with pytest.raises(WatchError, match="no position for site 'beta'"):
        watch(credential, ["alpha", "beta"], since={"alpha": 1})
    # The log is never purged (deny_purge): a log restored from a backup that starts later
    # stands for what a retention limit or an operator's mistake would leave.
    config = (await secure_js.stream_info(EVENTS_STREAM)).config
    await secure_js.delete_stream(EVENTS_STREAM)
    await secure_js.add_stream(dataclasses.replace(config, first_seq=100))
    await append_jobs(secure_js, "alpha", 1)
    with pytest.raises(WatchGap, match="its first is 100"):
        async with watch(credential, ["alpha"], since=1):
            pass


async def test_leftover_consumers_are_reclaimed_and_live_ones_are_not(
    secure_nats: SecureNats, secure_js: JetStreamContext
) -> None:
    credential = monitor_for(secure_nats, ["alpha"])
    live = [watch(credential, ["alpha"], since="now") for _ in range(SLOTS)]
    try:
        for w in live:
            await w.__aenter__()
        reading = [asyncio.ensure_future(collect(w, 5)) for w in live]
        with pytest.raises(WatchError, match="held by watchers that are reading"):
            async with watch(credential, ["alpha"], since=1):
                pass
        seqs = await append_jobs(secure_js, "alpha", 1)
        for w, got in zip(live, await asyncio.gather(*reading), strict=True):
            assert [g.seq for g in got] == seqs
            assert w.resumes == 0
    finally:
        for w in live:
            await w.close()
    # Consumers nobody pulls from, in every slot: the next watch takes one over.
    nc = await connect_monitor(credential, [])
    try:
        for name in consumer_names(credential.public_key):
            body = {"stream_name": EVENTS_STREAM, "action": "create",
                    "config": {"name": name, "filter_subject": "evt.alpha.>",
                               "ack_policy": "none", "deliver_policy": "all"}}  # fmt: skip
            reply = await nc.request(create_subject(name, "alpha"), json.dumps(body).encode(), 5)
            assert "error" not in json.loads(reply.data)
    finally:
        await nc.close()
    async with watch(credential, ["alpha"], since=1) as w:
        assert [g.seq for g in await collect(w, len(seqs))] == seqs


@pytest.mark.slow
async def test_an_idle_watch_stays_connected_without_notices(
    secure_nats: SecureNats, secure_js: JetStreamContext
) -> None:
    credential = monitor_for(secure_nats, ["alpha", "beta"])
    w = watch(credential, ["alpha", "beta"], since="now")
    with warnings.catch_warnings(record=True) as told:
        warnings.simplefilter("always", WatchNotice)
        async with w:
            iterator = aiter(w)
            waiting = asyncio.ensure_future(anext(iterator))
            done, _ = await asyncio.wait({waiting}, timeout=60)  # several pull expiries
            assert not done
            seqs = await append_jobs(secure_js, "beta", 1)
            got = [await asyncio.wait_for(waiting, 10)]
            while len(got) < len(seqs):
                got.append(await asyncio.wait_for(anext(iterator), 10))
    assert [g.seq for g in got] == seqs
    assert (w.resumes, w.notices, told) == (0, [], [])
