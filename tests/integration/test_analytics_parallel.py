"""A replay of ``EVENTS`` split across processes against nats-server: the parent reads the
range once and hands each process its share to fold; merged, the shares are exactly the
replay of one process, and ``lode analytics summary --workers`` prints the same figures
either way. A read that fails says why in the words of the one-process replay, a process
killed is an error, and no process outlives the call, nor a parent killed outright.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import os
import re
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from nats.aio.client import Client
from nats.js import JetStreamContext
from pydantic import SecretStr

from lodestream.client.analytics.errors import AnalyticsError, NothingSelected, SourceError
from lodestream.client.analytics.intake import Raw
from lodestream.client.analytics.jsonout import summary_json
from lodestream.client.analytics.load import load_stream
from lodestream.client.analytics.parallel import pool
from lodestream.client.analytics.parallel.load import (
    load_stream_parallel,
    load_stream_shares,
    replay_range,
)
from lodestream.client.analytics.parallel.pool import Shares
from lodestream.client.analytics.parallel.worker import ORPHANED_EXIT, ShareTask
from lodestream.client.analytics.selection import Selection
from lodestream.client.analytics.summary import Loaded, summarize
from lodestream.eventlog.rawpull import Wire
from lodestream.schemas.subjects import EVENTS_STREAM
from lodestream.settings import NatsSettings
from tests.support.analytics import varied_log

# A wrong password: nats-server answers -ERR 'Authorization Violation' and closes, and the
# client reads the one or meets the other first, depending on timing.
REFUSED = r"Authorization Violation|Connection reset by peer"


async def store(js: JetStreamContext, raws: list[Raw]) -> None:
    for raw in raws:  # in order: the stream gives them the sequences they carry
        ack = await js.publish(raw.subject, raw.data, headers={"Nats-Msg-Id": str(uuid.uuid4())})
        assert ack.seq == raw.seq


def figures(loaded: Loaded) -> str:
    try:
        return json.dumps(summary_json(summarize(loaded)))
    except NothingSelected as exc:
        return f"nothing selected: {exc}"


def assert_same(split: Loaded, whole: Loaded) -> None:
    assert split == whole
    for name in ("jobs", "sessions", "batches"):  # the order the figures add in, too
        assert list(getattr(split.timelines, name)) == list(getattr(whole.timelines, name))
    assert figures(split) == figures(whole)


def assert_no_process_left() -> None:
    assert multiprocessing.active_children() == []


def lode(settings: NatsSettings, *args: str) -> subprocess.CompletedProcess[str]:
    """``lode analytics …`` as an operator runs it, with the control plane's settings."""
    assert settings.user is not None
    assert settings.password is not None
    env = {**os.environ, "COLUMNS": "200", "NATS_URL": settings.url,
           "LODE_NATS__USER": settings.user,
           "LODE_NATS__PASSWORD": settings.password.get_secret_value()}  # fmt: skip
    argv = [sys.executable, "-m", "lodestream.client.cli.main", "analytics", *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False, env=env)


@pytest.mark.parametrize(
    ("selection", "shares"),
    [
        (Selection(), 3),
        (Selection.of(sites=["beta"], since_seq=30), 2),
        (Selection.of(apps=["nothing-by-this-name"]), 2),  # read, and nothing selected
        (Selection.of(since_seq=10_000), 2),  # past the end: nothing to read, no process
    ],
)
async def test_the_shares_merged_are_the_replay_of_one_process(
    nc: Client, js: JetStreamContext, selection: Selection, shares: int
) -> None:
    await store(js, varied_log())
    whole = await load_stream(nc, selection)
    split = await load_stream_shares(nc, selection, shares=shares)
    assert_same(split, whole)
    if selection == Selection():  # what was compared holds refusals past what is listed
        assert (whole.intake.read, whole.intake.refused, whole.intake.illegal) == (187, 121, 1)
        assert len(whole.intake.listed) == 100
    assert_no_process_left()


async def test_one_worker_is_the_replay_in_this_process(
    nc: Client, js: JetStreamContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    await store(js, varied_log())
    started: list[int] = []
    start = Shares.start

    def counted(shares: Shares) -> None:  # the real start, counted
        started.append(len(shares.processes))
        start(shares)

    monkeypatch.setattr(pool.Shares, "start", counted)
    one = await load_stream_parallel(nc, Selection(), workers=1)
    assert_same(one, await load_stream(nc, Selection()))
    # A short log: no process is worth starting, whatever the cores.
    assert_same(await load_stream_parallel(nc, Selection()), one)
    assert started == []


async def test_the_command_prints_the_same_figures_however_many_workers(
    js: JetStreamContext, nats_settings: NatsSettings, tmp_path: Path
) -> None:
    await store(js, varied_log())
    common = ["summary", "--json", "--control-plane", "--state-dir", str(tmp_path / ".lode")]
    one = await asyncio.to_thread(lode, nats_settings, *common, "--workers", "1")
    two = await asyncio.to_thread(lode, nats_settings, *common, "--workers", "2")
    wrong = nats_settings.model_copy(update={"password": SecretStr("not the password")})
    refused = await asyncio.to_thread(lode, wrong, *common, "--workers", "2")
    misplaced = await asyncio.to_thread(lode, nats_settings, "summary", "--workers", "2",
                                        "--from-file", str(tmp_path / "copy.jsonl"))  # fmt: skip
    for result in (one, two, refused, misplaced):
        assert "Traceback" not in result.stdout + result.stderr, result.stderr
    assert (one.returncode, two.returncode) == (0, 0), one.stderr + two.stderr
    assert json.loads(two.stdout) == json.loads(one.stdout)
    assert json.loads(one.stdout)["read"]["refused_by_shared_rule"] == 121
    assert refused.returncode == 1
    assert "cannot connect to NATS" in refused.stderr
    assert re.search(REFUSED, refused.stderr), refused.stderr
    assert misplaced.returncode == 2
    assert "only a replay of the stream read with --control-plane" in misplaced.stderr


async def test_a_stream_deleted_under_the_reader_is_a_source_error(
    nc: Client, js: JetStreamContext
) -> None:
    await store(js, varied_log()[:20])
    # The range's end was taken; the stream goes before it is read: the processes are
    # started, and stopped when the read fails.
    await js.delete_stream(EVENTS_STREAM)
    with pytest.raises(SourceError, match=f"cannot read the {EVENTS_STREAM} stream"):
        await replay_range(nc, Selection(), 20, 2)
    assert_no_process_left()


def test_a_share_killed_is_an_error_and_the_others_are_stopped() -> None:
    shares = Shares([ShareTask(Selection(), 10, share, 2) for share in (0, 1)])

    def ended() -> list[Loaded]:
        shares.finish()  # refused by the process killed, or taken by the kernel for it
        return shares.collect()

    shares.start()
    try:
        # Each waits for its first chunk: killed before it is sent any.
        os.kill(shares.processes[0].pid or 0, signal.SIGKILL)
        with pytest.raises(AnalyticsError, match=r"process 0 of 2 ended without its result "
                                                 r"\(killed by signal 9\)"):  # fmt: skip
            ended()
    finally:
        shares.stop()
    assert_no_process_left()


def test_a_share_that_fails_says_why_and_the_others_are_stopped() -> None:
    shares = Shares([ShareTask(Selection(), 10, share, 2) for share in (0, 1)])
    # What no reader of the stream hands on: a reply subject that is no JetStream delivery.
    bogus: list[Wire] = [(b"evt.alpha.job.x.created", b"not a reply subject", b"{}", None)]

    def fed() -> list[Loaded]:
        for _ in range(3):  # the failure is seen at a later chunk, or at the end
            shares.send(0, bogus)
        shares.finish()
        return shares.collect()

    shares.start()
    try:
        with pytest.raises(AnalyticsError, match=r"replay process 0 of 2 failed: ReadError\(.*"
                                                 r"not a JetStream delivery"):  # fmt: skip
            fed()
    finally:
        shares.stop()
    assert_no_process_left()


@pytest.mark.skipif(sys.platform != "linux", reason="a child subreaper is Linux's")
def test_a_parent_killed_outright_takes_its_shares_with_it() -> None:
    run = subprocess.run([sys.executable, "-m", "tests.support.orphans"],
                         capture_output=True, text=True, timeout=120, check=True)  # fmt: skip
    statuses = json.loads(run.stdout)
    # Each saw its parent go (the status of its watch, or of its pipe's end) while it waited
    # for its first chunk; without them it would wait there for ever.
    assert list(statuses.values()) == [ORPHANED_EXIT, ORPHANED_EXIT]
