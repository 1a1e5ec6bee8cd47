"""One test suite for every app launcher backend: the local one (real processes), the fake, and
the MPI launchers' shared process handling.

Each test describes what the task should do as a ``Behaviour``; a per-backend harness turns it
into a bash script (local) or a ``FakeOutcome`` (fake), and knows how to observe what the task
saw (its environment, its cwd) and which of its processes are still alive. The MPI launchers
run through a stand-in ``mpiexec`` that skips its options and execs the rank's program, so
their start, environment and process-group handling pass the same suite without an MPI; a real
``mpiexec`` is used by ``test_platform_mpi.py`` when one is installed.
"""

from __future__ import annotations

import os
import shlex
import signal
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Protocol

import pytest

from lodestream.platform_adapters.compute import NodePlacement
from lodestream.platform_adapters.errors import StartFailed, UnknownBackend, WaitTimedOut
from lodestream.platform_adapters.launchers import (
    AppLauncher,
    FakeLauncher,
    FakeOutcome,
    FakeTask,
    LocalLauncher,
    MpichLauncher,
    RunningTask,
    TaskSpec,
    get_launcher,
    launcher_names,
)
from lodestream.platform_adapters.packing import Allocation

WAIT_S = 30.0


@dataclass(frozen=True)
class Behaviour:
    exit_code: int = 0
    stdout: str = ""
    stderr: str = ""
    runs_until_stopped: bool = False  # starts a child `sleep 60` and waits for it
    ignores_sigterm: bool = False


def make_spec(
    tmp_path: Path,
    script: str,
    *,
    job_id: str = "job-1",
    gpu_ids: tuple[str, ...] = (),
    env: Mapping[str, str] | None = None,
    threads_per_rank: int = 1,
    merged_output: bool = False,
) -> TaskSpec:
    workdir = tmp_path / "work dir"  # a space, to show nothing re-parses the path
    workdir.mkdir(exist_ok=True)
    placement = NodePlacement("node-a", (0, 1), gpu_ids)
    return TaskSpec(
        job_id=job_id,
        script=script,
        workdir=workdir,
        env=dict(env if env is not None else {"PATH": os.environ["PATH"]}),
        allocation=Allocation(job_id, (placement, NodePlacement("node-b", (0,), ()))),
        stdout_path=workdir / "job.out",
        stderr_path=workdir / ("job.out" if merged_output else "job.err"),
        threads_per_rank=threads_per_rank,
    )


class Harness(Protocol):
    launcher: AppLauncher
    tasks: list[RunningTask]

    def script(self, behaviour: Behaviour) -> str: ...
    def started(self, task: RunningTask) -> None: ...
    def seen_env(self, task: RunningTask) -> dict[str, str]: ...
    def seen_cwd(self, task: RunningTask) -> Path: ...
    def live_pids(self, task: RunningTask) -> list[int]: ...


class LocalHarness:
    """Scripts record what they see in files beside their output."""

    def __init__(self) -> None:
        self.launcher: AppLauncher = LocalLauncher()
        self.tasks: list[RunningTask] = []

    def script(self, behaviour: Behaviour) -> str:
        lines = [
            "env -0 > seen_env",
            'printf %s "$(pwd -P)" > seen_cwd',
            f"printf %s {shlex.quote(behaviour.stdout)}",
            f"printf %s {shlex.quote(behaviour.stderr)} >&2",
        ]
        if behaviour.ignores_sigterm:
            lines.insert(0, "trap '' TERM")  # inherited by the child as well
        if behaviour.runs_until_stopped:
            lines += ["sleep 60 &", "echo $! > child.pid.tmp", "mv child.pid.tmp child.pid", "wait"]
        lines.append(f"exit {behaviour.exit_code}")
        return "\n".join(lines) + "\n"

    def started(self, task: RunningTask) -> None:
        """Wait until the script has spawned its child (when it spawns one)."""
        pid_file = task.spec.workdir / "child.pid"
        deadline = time.monotonic() + WAIT_S
        while "sleep 60" in task.spec.script and not pid_file.exists():
            assert task.poll() is None, task.stderr_tail()
            assert time.monotonic() < deadline, "the script never started its child"
            time.sleep(0.01)

    def seen_env(self, task: RunningTask) -> dict[str, str]:
        raw = (task.spec.workdir / "seen_env").read_bytes().decode()
        return dict(item.split("=", 1) for item in raw.split("\0") if item)

    def seen_cwd(self, task: RunningTask) -> Path:
        return Path((task.spec.workdir / "seen_cwd").read_text())

    def live_pids(self, task: RunningTask) -> list[int]:
        pids = [task.pid]
        pid_file = task.spec.workdir / "child.pid"
        if pid_file.exists():
            pids.append(int(pid_file.read_text()))
        return [pid for pid in pids if _alive(pid)]


# A stand-in launcher: drop the options up to the rank's bash and run that, as one rank would.
SHIM = """#!/bin/sh
while [ "$#" -gt 0 ]; do
  case "$1" in */bash) break ;; esac
  shift
done
exec "$@"
"""


class MpiShimHarness(LocalHarness):
    """The MPICH launcher with the stand-in ``mpiexec``: the script is the local harness's."""

    def __init__(self, shim: Path) -> None:
        super().__init__()
        self.launcher = MpichLauncher(executable=str(shim), cpu_bind="none")


class FakeHarness:
    """Behaviours become outcomes; the fake reports what it would have given the task."""

    def __init__(self) -> None:
        self.outcomes: dict[str, FakeOutcome] = {}
        self.launcher: AppLauncher = FakeLauncher(lambda spec: self.outcomes[spec.script])
        self.tasks: list[RunningTask] = []

    def script(self, behaviour: Behaviour) -> str:
        key = f"# fake {len(self.outcomes)}"
        self.outcomes[key] = FakeOutcome(
            returncode=behaviour.exit_code,
            duration_s=None if behaviour.runs_until_stopped else 0.0,
            stdout=behaviour.stdout,
            stderr=behaviour.stderr,
            ignores_sigterm=behaviour.ignores_sigterm,
        )
        return key

    def started(self, task: RunningTask) -> None:
        pass

    def seen_env(self, task: RunningTask) -> dict[str, str]:
        assert isinstance(task, FakeTask)
        return task.env

    def seen_cwd(self, task: RunningTask) -> Path:
        assert isinstance(task, FakeTask)
        return task.cwd

    def live_pids(self, task: RunningTask) -> list[int]:
        assert isinstance(task, FakeTask)
        return [task.pid] if task.alive else []


def _alive(pid: int) -> bool:
    """Running, not merely a zombie waiting for a parent (PID 1 may never reap it)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    except OSError:  # no /proc: fall back to signal 0, which also counts zombies as alive
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True
    return stat.rpartition(")")[2].split()[0] not in {"Z", "X"}


def _eventually_none_alive(harness: Harness, task: RunningTask) -> list[int]:
    deadline = time.monotonic() + WAIT_S
    while (alive := harness.live_pids(task)) and time.monotonic() < deadline:
        time.sleep(0.01)
    return alive


@pytest.fixture(params=["local", "fake", "mpich-shim"])
def harness(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Harness]:
    chosen: Harness
    if request.param == "local":
        chosen = LocalHarness()
    elif request.param == "fake":
        chosen = FakeHarness()
    else:
        shim = tmp_path_factory.mktemp("shim") / "mpiexec"
        shim.write_text(SHIM)
        shim.chmod(0o755)
        chosen = MpiShimHarness(shim)
    yield chosen
    for task in chosen.tasks:  # no process outlives its test
        if task.poll() is None:
            task.kill()
            task.wait(WAIT_S)


def run(harness: Harness, tmp_path: Path, behaviour: Behaviour, **kw: object) -> RunningTask:
    spec = make_spec(tmp_path, harness.script(behaviour), **kw)  # type: ignore[arg-type]
    task = harness.launcher.start(spec)
    harness.tasks.append(task)
    harness.started(task)
    return task


def test_exit_code_zero(harness: Harness, tmp_path: Path) -> None:
    task = run(harness, tmp_path, Behaviour())
    assert task.wait(WAIT_S) == 0
    assert task.returncode == 0
    assert task.poll() == 0


def test_exit_code_non_zero(harness: Harness, tmp_path: Path) -> None:
    task = run(harness, tmp_path, Behaviour(exit_code=3))
    assert task.wait(WAIT_S) == 3
    assert task.returncode == 3


def test_stdout_and_stderr_land_in_their_files(harness: Harness, tmp_path: Path) -> None:
    task = run(harness, tmp_path, Behaviour(stdout="hello\n", stderr="oops\n"))
    task.wait(WAIT_S)
    assert task.spec.stdout_path.read_text() == "hello\n"
    assert task.spec.stderr_path.read_text() == "oops\n"


def test_stdout_and_stderr_may_share_a_file(harness: Harness, tmp_path: Path) -> None:
    task = run(harness, tmp_path, Behaviour(stdout="out\n", stderr="err\n"), merged_output=True)
    task.wait(WAIT_S)
    assert task.spec.stdout_path.read_text() == "out\nerr\n"


def test_output_files_are_truncated_at_start(harness: Harness, tmp_path: Path) -> None:
    first = run(harness, tmp_path, Behaviour(stdout="a much longer first attempt\n"))
    first.wait(WAIT_S)
    second = run(harness, tmp_path, Behaviour(stdout="second\n"))
    second.wait(WAIT_S)
    assert second.spec.stdout_path.read_text() == "second\n"


def test_stderr_tail(harness: Harness, tmp_path: Path) -> None:
    task = run(
        harness, tmp_path, Behaviour(stderr="x" * 10_000 + "\nTraceback: boom\n", exit_code=1)
    )
    assert task.wait(WAIT_S) == 1
    tail = task.stderr_tail(max_bytes=100)
    assert len(tail) == 100
    assert tail.endswith("Traceback: boom\n")
    assert len(task.stderr_tail()) == 4096


def test_workdir_is_the_cwd(harness: Harness, tmp_path: Path) -> None:
    task = run(harness, tmp_path, Behaviour())
    task.wait(WAIT_S)
    assert harness.seen_cwd(task) == task.spec.workdir.resolve()


def test_environment(harness: Harness, tmp_path: Path) -> None:
    given = {"PATH": os.environ["PATH"], "APP_SETTING": "a b 'c' $(touch pwned)"}
    task = run(
        harness,
        tmp_path,
        Behaviour(),
        job_id="job-42",
        gpu_ids=("1", "3"),
        env=given,
        threads_per_rank=4,
    )
    assert task.wait(WAIT_S) == 0
    env = harness.seen_env(task)
    assert env["OMP_NUM_THREADS"] == "4"
    assert env["CUDA_VISIBLE_DEVICES"] == "1,3"
    assert env["LODE_JOB_ID"] == "job-42"
    assert env["LODE_NODE_HOSTNAMES"] == "node-a,node-b"
    assert env["APP_SETTING"] == given["APP_SETTING"]
    assert not (task.spec.workdir / "pwned").exists()


def test_no_gpus_sets_no_cuda_visible_devices(harness: Harness, tmp_path: Path) -> None:
    task = run(harness, tmp_path, Behaviour(), env={"PATH": os.environ["PATH"]})
    task.wait(WAIT_S)
    assert "CUDA_VISIBLE_DEVICES" not in harness.seen_env(task)


def test_pilot_environment_is_not_inherited(
    harness: Harness, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LODE_PILOT_ONLY", "secret")
    task = run(harness, tmp_path, Behaviour())
    task.wait(WAIT_S)
    assert "LODE_PILOT_ONLY" not in harness.seen_env(task)


def test_missing_output_directory_fails_to_start(harness: Harness, tmp_path: Path) -> None:
    spec = make_spec(tmp_path, harness.script(Behaviour()))
    broken = replace(spec, stderr_path=tmp_path / "no such dir" / "job.err")
    with pytest.raises(StartFailed, match="job-1"):
        harness.launcher.start(broken)


def test_poll_does_not_block(harness: Harness, tmp_path: Path) -> None:
    task = run(harness, tmp_path, Behaviour(runs_until_stopped=True))
    for _ in range(50):
        assert task.poll() is None
    assert task.returncode is None
    with pytest.raises(WaitTimedOut):
        task.wait(timeout=0.01)
    assert task.poll() is None


def test_terminate_kills_the_whole_process_group(harness: Harness, tmp_path: Path) -> None:
    task = run(harness, tmp_path, Behaviour(runs_until_stopped=True))
    assert len(harness.live_pids(task)) >= 1
    task.terminate(grace_s=WAIT_S)
    assert task.wait(WAIT_S) == -signal.SIGTERM
    assert _eventually_none_alive(harness, task) == []


def test_terminate_escalates_to_sigkill(harness: Harness, tmp_path: Path) -> None:
    task = run(harness, tmp_path, Behaviour(runs_until_stopped=True, ignores_sigterm=True))
    task.terminate(grace_s=0.2)
    assert task.wait(WAIT_S) == -signal.SIGKILL
    assert _eventually_none_alive(harness, task) == []


def test_kill(harness: Harness, tmp_path: Path) -> None:
    task = run(harness, tmp_path, Behaviour(runs_until_stopped=True, ignores_sigterm=True))
    task.kill()
    assert task.wait(WAIT_S) == -signal.SIGKILL
    assert _eventually_none_alive(harness, task) == []


def test_terminate_and_kill_after_exit_change_nothing(harness: Harness, tmp_path: Path) -> None:
    task = run(harness, tmp_path, Behaviour(exit_code=5))
    assert task.wait(WAIT_S) == 5
    task.terminate(grace_s=0)
    task.kill()
    assert task.poll() == 5


def test_missing_workdir_fails_to_start(harness: Harness, tmp_path: Path) -> None:
    spec = make_spec(tmp_path, harness.script(Behaviour()))
    broken = replace(
        spec, workdir=tmp_path / "missing", stdout_path=tmp_path / "o", stderr_path=tmp_path / "e"
    )
    with pytest.raises(StartFailed, match="job-1"):
        harness.launcher.start(broken)


def test_render_command_is_a_pure_argv(harness: Harness, tmp_path: Path) -> None:
    spec = make_spec(tmp_path, harness.script(Behaviour()))
    argv = harness.launcher.render_command(spec)
    assert argv == harness.launcher.render_command(spec)
    assert all(isinstance(a, str) for a in argv)
    assert spec.script in argv


def test_registry_names_the_backends() -> None:
    assert launcher_names() == (
        "aprun", "fake", "flux", "jsrun", "local", "mpich", "openmpi", "pals", "srun",
    )  # fmt: skip
    assert isinstance(get_launcher("local"), LocalLauncher)
    assert isinstance(get_launcher("fake"), FakeLauncher)
    assert isinstance(get_launcher("mpich"), MpichLauncher)
    with pytest.raises(UnknownBackend, match="known: aprun, fake, flux"):
        get_launcher("mpirun")


def test_local_task_runs_without_path_in_its_env(tmp_path: Path) -> None:
    spec = make_spec(tmp_path, "echo ok", env={})
    task = LocalLauncher().start(spec)
    assert task.wait(WAIT_S) == 0
    assert spec.stdout_path.read_text() == "ok\n"


def test_fake_follows_a_hand_driven_clock(tmp_path: Path) -> None:
    now = [100.0]

    def advance(seconds: float) -> None:
        now[0] += seconds

    launcher = FakeLauncher(
        FakeOutcome(returncode=7, duration_s=30.0), clock=lambda: now[0], sleep=advance
    )
    task = launcher.start(make_spec(tmp_path, "anything"))
    assert task.poll() is None
    now[0] += 29.0
    assert task.poll() is None
    assert task.wait() == 7
    assert now[0] == 130.0
    assert launcher.started == [task]
    assert task.pid > 2**22  # never a real process id


# --- the local launcher without bash (TaskSpec.argv) ------------------------------------------


def direct_spec(tmp_path: Path, argv: tuple[str, ...], **argv_env: str) -> TaskSpec:
    # The script says something else, so a test sees which of the two ran.
    spec = make_spec(tmp_path, "echo from-bash; exit 7", threads_per_rank=3)
    return replace(spec, argv=argv, argv_env=argv_env)


def test_local_runs_argv_directly_with_the_exported_environment(tmp_path: Path) -> None:
    spec = direct_spec(tmp_path, ("env", "-0"), OMP_NUM_THREADS="8", MODE="$(x) 'y'")
    task = LocalLauncher().start(spec)
    assert task.wait(WAIT_S) == 0
    seen = dict(i.split("=", 1) for i in spec.stdout_path.read_text().split("\0") if i)
    assert seen["MODE"] == "$(x) 'y'"
    assert seen["OMP_NUM_THREADS"] == "8"  # the app's export wins, as in the script
    assert seen["LODE_JOB_ID"] == "job-1"


def test_local_direct_task_is_the_program_itself(tmp_path: Path) -> None:
    spec = direct_spec(tmp_path, ("sleep", "30"))
    task = LocalLauncher().start(spec)
    try:
        exe = Path(f"/proc/{task.pid}/exe").resolve()
        assert exe.name == "sleep"  # no bash in between
        assert os.getpgid(task.pid) == task.pid  # still the leader of its own group
        assert Path(f"/proc/{task.pid}/cwd").resolve() == spec.workdir.resolve()
    finally:
        task.kill()
        assert task.wait(WAIT_S) == -signal.SIGKILL


def test_local_relative_program_is_the_workdirs(tmp_path: Path) -> None:
    spec = direct_spec(tmp_path, ("./tool", "a b"))
    tool = spec.workdir / "tool"
    tool.write_text("#!/bin/sh\nprintf '%s|' \"$@\"\n")
    tool.chmod(0o755)
    task = LocalLauncher().start(spec)
    assert task.wait(WAIT_S) == 0
    assert spec.stdout_path.read_text() == "a b|"


@pytest.mark.parametrize("program", ["no-such-program-here", "./missing", "./no-shebang", "./dir"])
def test_local_program_it_cannot_exec_is_left_to_bash(tmp_path: Path, program: str) -> None:
    spec = direct_spec(tmp_path, (program,))
    (spec.workdir / "no-shebang").write_text("echo not a binary\n")
    (spec.workdir / "no-shebang").chmod(0o755)  # exec fails (ENOEXEC); bash runs such files
    (spec.workdir / "dir").mkdir(mode=0o755)
    task = LocalLauncher().start(spec)
    assert task.wait(WAIT_S) == 7  # the script ran: bash reports what went wrong, as always
    assert task.spec.stdout_path.read_text() == "from-bash\n"


def test_local_argv_program_found_on_the_exported_path(tmp_path: Path) -> None:
    tools = tmp_path / "tools"
    tools.mkdir()
    (tools / "hello-tool").write_text("#!/bin/sh\necho hello\n")
    (tools / "hello-tool").chmod(0o755)
    spec = direct_spec(tmp_path, ("hello-tool",), PATH=f"{tools}:/usr/bin:/bin")
    task = LocalLauncher().start(spec)
    assert task.wait(WAIT_S) == 0
    assert spec.stdout_path.read_text() == "hello\n"
