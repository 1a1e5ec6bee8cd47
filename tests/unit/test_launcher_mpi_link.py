"""Rank 0's link and a worker rank's loop, talking over an in-memory wire instead of MPI
(``agents/launcher/mpi_link.py``, ``mpi_serve.py``). Time is a fake clock moved by hand;
tasks are the fake launcher's."""

from __future__ import annotations

import collections
import os
import select
import signal
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

from lodestream.agents.launcher.mpi_link import LOST_STATUS, RankLauncher, RankLink, RemoteTask
from lodestream.agents.launcher.mpi_protocol import (
    Assign,
    Bye,
    Message,
    Start,
    Started,
    Stop,
    decode,
    encode,
)
from lodestream.agents.launcher.mpi_serve import WorkerExit, WorkerLoop
from lodestream.platform_adapters.compute.base import NodePlacement
from lodestream.platform_adapters.errors import StartFailed
from lodestream.platform_adapters.launchers import FakeLauncher, FakeOutcome, TaskSpec
from lodestream.platform_adapters.packing import Allocation

TIMEOUT_S = 30.0
REAL_WAIT_S = 10.0  # how long a test waits for a thread to act; never a measured duration


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Wire:
    """Mailboxes by rank; deques, so the link's thread and the test may both use them."""

    def __init__(self) -> None:
        self.boxes: dict[int, collections.deque[tuple[int, bytes]]] = collections.defaultdict(
            collections.deque
        )

    def end(self, rank: int) -> WireEnd:
        return WireEnd(self, rank)

    def taken(self, rank: int) -> list[Message]:
        """What is waiting for ``rank``, taken out of its box."""
        box = self.boxes[rank]
        return [decode(box.popleft()[1]) for _ in range(len(box))]


class WireEnd:
    def __init__(self, wire: Wire, rank: int) -> None:
        self.wire = wire
        self.rank = rank

    def post(self, rank: int, message: Message) -> None:
        self.wire.boxes[rank].append((self.rank, encode(message)))

    def poll(self) -> tuple[int, bytes] | None:
        try:
            return self.wire.boxes[self.rank].popleft()
        except IndexError:
            return None

    def progress(self) -> int:
        return 0


def spec(tmp_path: Path, job_id: str = "job-1", host: str = "n1") -> TaskSpec:
    return TaskSpec(
        job_id=job_id, script="true", workdir=tmp_path, env={"PATH": "/usr/bin"},
        allocation=Allocation(job_id, (NodePlacement(host, (0,)),)),
        stdout_path=tmp_path / f"{job_id}.out", stderr_path=tmp_path / f"{job_id}.err",
    )  # fmt: skip


def until(condition: Callable[[], bool], step: Callable[[], object] = lambda: None) -> None:
    deadline = time.monotonic() + REAL_WAIT_S
    while not condition():
        assert time.monotonic() < deadline, "nothing happened"
        step()
        time.sleep(0.001)


class Ranks:
    """Rank 0's link (its own thread) and worker rank 1 (stepped by the test)."""

    def __init__(self, clock: Clock, fake: FakeLauncher) -> None:
        self.wire = Wire()
        self.clock = clock
        self.fake = fake
        self.link = RankLink(self.wire.end(0), {1: "n1"}, timeout_s=TIMEOUT_S, clock=clock)
        self.worker = WorkerLoop(self.wire.end(1), lambda gpu_env: fake, rank=1, clock=clock,
                                 sleep=lambda _s: None)  # fmt: skip
        self.wire.end(0).post(1, Assign("n1", TIMEOUT_S))
        self.pool = ThreadPoolExecutor(1)

    def start(self, task: TaskSpec, timeout_s: float = REAL_WAIT_S) -> Future[RemoteTask]:
        return self.pool.submit(self.link.start_task, 1, task, timeout_s)

    def started(self, task: TaskSpec) -> RemoteTask:
        answer = self.start(task)
        until(answer.done, self.worker.step)
        return answer.result()


@pytest.fixture
def clock() -> Clock:
    return Clock()


def outcome(task: TaskSpec) -> FakeOutcome:
    """Job ``fails`` fails at once; every other job runs until it is stopped."""
    if task.job_id == "fails":
        return FakeOutcome(returncode=3, duration_s=0.0, stderr="boom\n")
    return FakeOutcome(duration_s=None)


@pytest.fixture
def ranks(clock: Clock) -> Iterator[Ranks]:
    both = Ranks(clock, FakeLauncher(outcome, clock=clock))
    both.link.start()
    yield both
    closing = both.pool.submit(both.link.close, "test over", REAL_WAIT_S)
    until(closing.done, both.worker.step)  # rank 1 says bye, unless it was lost
    both.pool.shutdown()


def readable(fd: int) -> bool:
    return bool(select.select([fd], [], [], 0)[0])


def test_a_job_runs_on_its_worker_and_its_end_comes_back_through_a_descriptor(
    ranks: Ranks, tmp_path: Path
) -> None:
    task = ranks.started(spec(tmp_path))
    assert isinstance(task, RemoteTask)
    assert task.pid == ranks.fake.started[0].pid  # the worker's process, on its node
    fd = task.exit_fd()
    assert fd is not None
    assert task.poll() is None
    assert not readable(fd)
    task.terminate(grace_s=1.0)  # the worker terminates it; its status comes back
    until(lambda: task.poll() is not None, ranks.worker.step)
    assert task.returncode == -signal.SIGTERM
    assert task.lost is None
    assert readable(fd)  # the reaper wakes for it like for a local task's pidfd
    os.close(fd)


def test_a_failing_job_brings_its_stderr_tail_back_from_the_worker(
    ranks: Ranks, tmp_path: Path
) -> None:
    task = ranks.started(spec(tmp_path, "fails"))
    until(lambda: task.poll() is not None, ranks.worker.step)
    (tmp_path / "fails.err").unlink()  # read on the worker's node, not from rank 0's files
    assert (task.returncode, task.stderr_tail()) == (3, "boom\n")


def test_a_job_the_worker_cannot_start_fails_to_start_with_its_reason(
    ranks: Ranks, tmp_path: Path
) -> None:
    answer = ranks.start(spec(tmp_path / "missing"))
    until(answer.done, ranks.worker.step)
    with pytest.raises(StartFailed, match="no directory"):
        answer.result()


def test_a_silent_worker_is_lost_with_its_jobs_and_takes_no_more(
    ranks: Ranks, clock: Clock, tmp_path: Path
) -> None:
    task = ranks.started(spec(tmp_path))
    clock.now += TIMEOUT_S + 1  # the worker says nothing any more
    until(lambda: task.poll() is not None)
    assert task.returncode == LOST_STATUS
    assert task.lost is not None
    assert task.lost.startswith("worker rank 1 (node n1) lost: silent for 30 s")
    assert ranks.link.lost == {1: "silent for 30 s"}
    with pytest.raises(StartFailed, match=r"worker rank 1 .* lost"):
        ranks.link.start_task(1, spec(tmp_path, "job-2"), REAL_WAIT_S)


def test_once_a_rank_is_known_dead_five_silent_beats_are_enough(
    ranks: Ranks, clock: Clock, tmp_path: Path
) -> None:
    task = ranks.started(spec(tmp_path))
    ranks.link.failure_reported()
    clock.now += 5.5
    until(lambda: task.poll() is not None)
    assert task.lost is not None
    assert "silent for 5 s" in task.lost


def test_a_start_answered_too_late_is_killed_on_the_worker(ranks: Ranks, tmp_path: Path) -> None:
    answer = ranks.start(spec(tmp_path), timeout_s=0.01)  # the worker is not stepped meanwhile
    with pytest.raises(StartFailed, match="did not answer"):
        answer.result(REAL_WAIT_S)
    until(lambda: bool(ranks.fake.started) and not ranks.fake.started[0].alive,
          ranks.worker.step)  # fmt: skip


def test_stop_ends_the_workers_jobs_and_is_answered_with_a_bye(
    clock: Clock, tmp_path: Path
) -> None:
    wire, fake = Wire(), FakeLauncher(FakeOutcome(duration_s=None), clock=clock)
    worker = WorkerLoop(wire.end(1), lambda _gpu: fake, rank=1, clock=clock, sleep=lambda _s: None)
    rank0 = wire.end(0)
    rank0.post(1, Assign("n1", TIMEOUT_S))
    rank0.post(1, Start(spec(tmp_path)))
    rank0.post(1, Stop("the pilot exits"))
    assert worker.serve() == WorkerExit(0, "the pilot exits")
    assert not fake.started[0].alive
    kinds = [type(m).__name__ for m in wire.taken(0)]
    assert kinds == ["Started", "Exited", "Bye"]


def test_a_worker_that_hears_nothing_from_rank_0_kills_its_jobs_and_leaves(
    clock: Clock, tmp_path: Path
) -> None:
    wire, fake = Wire(), FakeLauncher(FakeOutcome(duration_s=None), clock=clock)
    worker = WorkerLoop(wire.end(1), lambda _gpu: fake, rank=1, clock=clock, sleep=lambda _s: None)
    wire.end(0).post(1, Assign("n1", TIMEOUT_S))
    wire.end(0).post(1, Start(spec(tmp_path)))
    worker.step()
    assert isinstance(wire.taken(0)[0], Started)
    clock.now += TIMEOUT_S + 1
    assert worker.serve() == WorkerExit(1, "rank 0 silent for 30 s")
    assert not fake.started[0].alive  # nobody could report it any more


def test_a_worker_that_serves_no_node_waits_for_the_end(clock: Clock) -> None:
    wire = Wire()
    worker = WorkerLoop(wire.end(2), lambda _gpu: FakeLauncher(), rank=2, clock=clock,
                        sleep=lambda _s: None)  # fmt: skip
    wire.end(0).post(2, Assign(None, TIMEOUT_S))
    for _ in range(3):
        worker.step()
    assert not worker.stopping
    wire.end(0).post(2, Stop("done"))
    assert worker.serve().code == 0
    assert isinstance(wire.taken(0)[-1], Bye)


def test_the_rank_launcher_runs_rank_0s_node_here_and_says_which_rank_ran_each_job(
    ranks: Ranks, clock: Clock, tmp_path: Path
) -> None:
    here = FakeLauncher(clock=clock)
    launcher = RankLauncher(ranks.link, {"n0": 0, "n1": 1}, here, start_timeout_s=REAL_WAIT_S)
    local = launcher.start(spec(tmp_path, "job-0", host="n0"))
    assert local is here.started[0]
    assert local.spec.env["LODE_WORKER_RANK"] == "0"
    answer = ranks.pool.submit(launcher.start, spec(tmp_path, "job-1", host="n1"))
    until(answer.done, ranks.worker.step)
    assert ranks.fake.started[0].spec.env["LODE_WORKER_RANK"] == "1"
    with pytest.raises(StartFailed, match="no rank serves nodes n9"):
        launcher.start(spec(tmp_path, "job-9", host="n9"))


def test_the_link_drops_what_it_cannot_read_and_goes_on(ranks: Ranks, tmp_path: Path) -> None:
    ranks.wire.boxes[0].append((1, b"garbage"))
    ranks.wire.boxes[0].append((7, encode(Bye())))  # a rank that serves no node
    task = ranks.started(spec(tmp_path))
    assert task.poll() is None
    assert threading.active_count() >= 2  # the link thread is still there
