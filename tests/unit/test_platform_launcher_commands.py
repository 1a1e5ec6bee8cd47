"""What each app launcher renders, checked against expected command lines (a table of cases),
and how a job's ``launch_params`` are merged in or refused."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

import pytest

from lodestream.platform_adapters.compute import NodePlacement, load_machine
from lodestream.platform_adapters.compute.machine import CpuBind
from lodestream.platform_adapters.errors import (
    InvalidLaunchParams,
    LauncherUnavailable,
    StartFailed,
)
from lodestream.platform_adapters.launchers import (
    AppLauncher,
    MpiLauncher,
    SrunLauncher,
    TaskSpec,
    get_launcher,
)
from lodestream.platform_adapters.launchers.layout import RankLayout, rank_cpu_sets
from lodestream.platform_adapters.launchers.mpich import hydra_launches_with_srun
from lodestream.platform_adapters.launchers.options import Arity
from lodestream.platform_adapters.packing import Allocation

BASH = "/bin/bash"
TAIL = f"{BASH} -c app"


def make_spec(
    hosts: tuple[str, ...] = ("a", "b"),
    *,
    cpu_ids: tuple[int, ...] = tuple(range(64)),
    gpu_ids: tuple[str, ...] = (),
    ranks_per_node: int = 4,
    threads_per_rank: int = 1,
    threads_per_core: int = 1,
    gpus_per_rank: int = 0,
    launch_params: Mapping[str, str] | None = None,
    workdir: Path = Path("/nonexistent"),
) -> TaskSpec:
    placements = tuple(NodePlacement(h, cpu_ids, gpu_ids) for h in hosts)
    return TaskSpec(
        job_id="job-7",
        script="app",
        workdir=workdir,
        env={"PATH": os.environ["PATH"]},
        allocation=Allocation("job-7", placements),
        stdout_path=workdir / "out",
        stderr_path=workdir / "err",
        ranks_per_node=ranks_per_node,
        threads_per_rank=threads_per_rank,
        threads_per_core=threads_per_core,
        gpus_per_rank=gpus_per_rank,
        launch_params=dict(launch_params or {}),
    )


def launcher(name: str, machine: str, cpu_bind: CpuBind | None = None) -> MpiLauncher:
    chosen = get_launcher(name, machine=load_machine(machine))
    assert isinstance(chosen, MpiLauncher)
    chosen.bash = BASH
    if cpu_bind is not None:
        chosen.cpu_bind = cpu_bind
    return chosen


def rendered(chosen: AppLauncher, spec: TaskSpec) -> str:
    return " ".join(chosen.render_command(spec))


CASES = [
    # MPICH's Hydra: counts, hosts, binding to N cores per rank
    ("mpich", "generic-pbs", None, {"threads_per_rank": 2},
     f"mpiexec -n 8 -ppn 4 -hosts a,b -bind-to core:2 {TAIL}"),
    ("mpich", "generic-pbs", "none", {},
     f"mpiexec -n 8 -ppn 4 -hosts a,b -bind-to none {TAIL}"),
    # placement: each rank on the cores the pilot gave the job (a packed job at cores 4-7)
    ("mpich", "polaris", "placement",
     {"hosts": ("x1",), "cpu_ids": (4, 5, 6, 7), "ranks_per_node": 2, "threads_per_rank": 2},
     f"mpiexec -n 2 -ppn 2 -hosts x1 -bind-to user:4+5,6+7 {TAIL}"),
    # ... with both hardware threads of each core: their siblings are 32 higher on Polaris
    ("mpich", "polaris", "placement",
     {"hosts": ("x1",), "cpu_ids": (4, 5), "ranks_per_node": 2, "threads_per_rank": 2,
      "threads_per_core": 2},
     f"mpiexec -n 2 -ppn 2 -hosts x1 -bind-to user:4+36,5+37 {TAIL}"),
    # placement that cannot hold the ranks (accounting slots) falls back to counts
    ("mpich", "polaris", "placement", {"hosts": ("x1",), "cpu_ids": (0,), "ranks_per_node": 2},
     f"mpiexec -n 2 -ppn 2 -hosts x1 -bind-to core:1 {TAIL}"),
    # PALS on Polaris: placement lists with ranges, siblings included
    ("pals", "polaris", None,
     {"hosts": ("x1",), "cpu_ids": (8, 9, 10, 11), "ranks_per_node": 2, "threads_per_rank": 4,
      "threads_per_core": 2},
     f"mpiexec -n 2 --ppn 2 --hosts x1 --cpu-bind list:8-9,40-41:10-11,42-43 {TAIL}"),
    ("pals", "polaris", "auto", {"ranks_per_node": 2, "threads_per_rank": 4},
     f"mpiexec -n 4 --ppn 2 --hosts a,b --depth 4 --cpu-bind depth {TAIL}"),
    ("pals", "polaris", "none", {"ranks_per_node": 1},
     f"mpiexec -n 2 --ppn 1 --hosts a,b --cpu-bind none {TAIL}"),
    # PALS on Aurora: the cores after the reserved core 0, siblings 104 higher
    ("pals", "aurora", None, {"hosts": ("x4",), "cpu_ids": (1, 2), "ranks_per_node": 2,
                               "threads_per_rank": 2, "threads_per_core": 2},
     f"mpiexec -n 2 --ppn 2 --hosts x4 --cpu-bind list:1,105:2,106 {TAIL}"),
    # Open MPI: ppr mapping with PE, slots per host, and the variables remote ranks need
    ("openmpi", "generic-slurm", None, {"ranks_per_node": 2, "threads_per_rank": 3},
     "mpiexec -np 4 --host a:2,b:2 --map-by ppr:2:node:PE=3 --bind-to core "
     f"-x OMP_NUM_THREADS -x LODE_JOB_ID -x LODE_NODE_HOSTNAMES {TAIL}"),
    ("openmpi", "frontier", "none", {"hosts": ("f1",), "gpu_ids": ("0", "1"), "ranks_per_node": 2,
                                     "gpus_per_rank": 1},
     "mpiexec -np 2 --host f1:2 --map-by ppr:2:node --bind-to none "
     f"-x OMP_NUM_THREADS -x LODE_JOB_ID -x LODE_NODE_HOSTNAMES -x ROCR_VISIBLE_DEVICES {TAIL}"),
    # srun: Slurm CPUs per task; --threads-per-core where cores have several threads
    ("srun", "generic-slurm", None, {"threads_per_rank": 2},
     "srun --nodes=2 --ntasks=8 --ntasks-per-node=4 --cpus-per-task=2 --nodelist=a,b "
     f"--cpu-bind=cores --exact {TAIL}"),
    ("srun", "perlmutter-gpu", None, {"gpu_ids": ("0", "1", "2", "3"), "threads_per_rank": 16,
                                      "gpus_per_rank": 1},
     "srun --nodes=2 --ntasks=8 --ntasks-per-node=4 --cpus-per-task=16 --threads-per-core=1 "
     f"--gpus-per-task=1 --nodelist=a,b --cpu-bind=cores --exact {TAIL}"),
    ("srun", "perlmutter-cpu", "none", {"hosts": ("nid1",), "ranks_per_node": 64,
                                       "threads_per_rank": 4, "threads_per_core": 2},
     "srun --nodes=1 --ntasks=64 --ntasks-per-node=64 --cpus-per-task=4 --threads-per-core=2 "
     f"--nodelist=nid1 --cpu-bind=none --exact {TAIL}"),
    # aprun: depth in CPUs, -j threads per core, nid numbers for -L
    ("aprun", "theta", None, {"hosts": ("nid03830", "nid03831"), "ranks_per_node": 16,
                              "threads_per_rank": 8, "threads_per_core": 2},
     f"aprun -n 32 -N 16 -d 8 -j 2 -cc depth -L 3830,3831 {TAIL}"),
    ("aprun", "theta", "none", {"hosts": ("login1",), "ranks_per_node": 1},
     f"aprun -n 1 -N 1 -d 1 -j 1 -cc none {TAIL}"),
    # jsrun: one resource set per rank
    ("jsrun", "summit", None, {"ranks_per_node": 6, "threads_per_rank": 7, "gpus_per_rank": 1,
                               "gpu_ids": tuple(str(i) for i in range(6))},
     f"jsrun -n 12 -r 6 -a 1 -c 7 -g 1 -b packed:7 {TAIL}"),
    ("jsrun", "summit", "none", {"ranks_per_node": 1},
     f"jsrun -n 2 -r 1 -a 1 -c 1 -g 0 -b none {TAIL}"),
    # flux run: per-task resources, the hosts as a constraint, affinity shell options
    ("flux", "generic-flux", None, {"threads_per_rank": 2},
     f"flux run -N 2 -n 8 -c 2 --requires=host:a,b -o cpu-affinity=per-task {TAIL}"),
    ("flux", "generic-flux", None, {"ranks_per_node": 2, "gpus_per_rank": 2,
                                    "gpu_ids": ("0", "1", "2", "3")},
     "flux run -N 2 -n 4 -c 1 -g 2 --requires=host:a,b -o cpu-affinity=per-task "
     f"-o gpu-affinity=per-task {TAIL}"),
    ("flux", "generic-flux", "none", {"hosts": ("t1",), "ranks_per_node": 1},
     f"flux run -N 1 -n 1 -c 1 --requires=host:t1 -o cpu-affinity=off {TAIL}"),
]  # fmt: skip


@pytest.mark.parametrize(("name", "machine", "cpu_bind", "spec", "expected"), CASES)
def test_rendered_command_lines(
    name: str, machine: str, cpu_bind: CpuBind | None, spec: dict[str, object], expected: str
) -> None:
    assert rendered(launcher(name, machine, cpu_bind), make_spec(**spec)) == expected  # type: ignore[arg-type]


def test_every_mpi_backend_has_a_case() -> None:
    assert {case[0] for case in CASES} == {
        "mpich", "pals", "openmpi", "srun", "aprun", "jsrun", "flux",
    }  # fmt: skip


def test_local_runs_the_script_once() -> None:
    local = get_launcher("local")
    assert local.render_command(make_spec())[-2:] == ["-c", "app"]


def test_srun_overlap_and_mpi_plugin() -> None:
    srun = SrunLauncher(load_machine("generic-slurm"), bash=BASH, overlap=True, mpi="pmi2")
    assert rendered(srun, make_spec(("a",), ranks_per_node=1)) == (
        "srun --nodes=1 --ntasks=1 --ntasks-per-node=1 --cpus-per-task=1 --nodelist=a "
        f"--cpu-bind=cores --overlap --mpi=pmi2 {TAIL}"
    )


def test_the_script_is_one_word_and_never_re_parsed() -> None:
    spec = make_spec()
    hostile = "echo $(touch pwned); rm -rf 'x y'"
    argv = launcher("srun", "generic-slurm").render_command(replace(spec, script=hostile))
    assert argv[-3:] == [BASH, "-c", hostile]


# --- the environment --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("machine", "variable", "gpu_ids"),
    [
        ("polaris", "CUDA_VISIBLE_DEVICES", ("0", "1")),
        ("frontier", "ROCR_VISIBLE_DEVICES", ("4", "5")),
        ("aurora", "ZE_AFFINITY_MASK", ("10", "11")),
    ],
)
def test_the_machines_gpu_visibility_variable_is_set(
    machine: str, variable: str, gpu_ids: tuple[str, ...]
) -> None:
    chosen = launcher(get_launcher_name(machine), machine)
    env = chosen.task_env(make_spec(("n1",), gpu_ids=gpu_ids, threads_per_rank=6))
    assert env[variable] == ",".join(gpu_ids)
    assert env["OMP_NUM_THREADS"] == "6"
    others = {"CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "ZE_AFFINITY_MASK"} - {variable}
    assert not others & env.keys()
    assert ("CUDA_DEVICE_ORDER" in env) == (variable == "CUDA_VISIBLE_DEVICES")


SLURM_ALLOCATION = {
    "SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n[1-3]", "SLURM_JOB_NUM_NODES": "3",
    "SLURM_TASKS_PER_NODE": "1(x3)",
}  # fmt: skip


@pytest.mark.parametrize(
    ("env", "with_srun"),
    [
        (SLURM_ALLOCATION, True),
        ({"SLURM_NODELIST": "n1", "SLURM_NNODES": "1", "SLURM_TASKS_PER_NODE": "1"}, True),
        ({"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n1"}, False),  # not all Hydra looks for
        ({}, False),
        ({"PBS_NODEFILE": "/x"}, False),
        (SLURM_ALLOCATION | {"HYDRA_LAUNCHER": "ssh"}, False),
        (SLURM_ALLOCATION | {"HYDRA_BOOTSTRAP": "fork"}, False),
        (SLURM_ALLOCATION | {"HYDRA_RMK": "pbs"}, False),
        ({"HYDRA_LAUNCHER": "slurm"}, True),
        ({"HYDRA_RMK": "slurm"}, True),
    ],
)
def test_whether_hydra_launches_with_srun(env: dict[str, str], with_srun: bool) -> None:
    assert hydra_launches_with_srun(env) is with_srun


def test_hydra_steps_in_a_slurm_allocation_overlap_the_pilots_other_jobs() -> None:
    """Two jobs on one node are two job steps: neither may wait for the other's CPUs."""
    mpich = launcher("mpich", "generic-slurm")
    spec = make_spec(("n1",))
    inside = replace(spec, env={**spec.env, **SLURM_ALLOCATION})
    assert mpich.task_env(inside)["HYDRA_LAUNCHER_EXTRA_ARGS"] == "--overlap"
    theirs = replace(inside, env={**inside.env, "HYDRA_LAUNCHER_EXTRA_ARGS": "--gres=gpu:2 -v"})
    assert mpich.task_env(theirs)["HYDRA_LAUNCHER_EXTRA_ARGS"] == "--overlap --gres=gpu:2 -v"
    said = replace(inside, env={**inside.env, "HYDRA_LAUNCHER_EXTRA_ARGS": "-v --overlap"})
    assert mpich.task_env(said)["HYDRA_LAUNCHER_EXTRA_ARGS"] == "-v --overlap"
    # ssh (or any launcher but srun) would take the words as its own options
    assert "HYDRA_LAUNCHER_EXTRA_ARGS" not in mpich.task_env(spec)
    ssh = replace(inside, env={**inside.env, "HYDRA_LAUNCHER": "ssh"})
    assert "HYDRA_LAUNCHER_EXTRA_ARGS" not in mpich.task_env(ssh)
    # the command line is the same either way
    assert mpich.render_command(inside) == mpich.render_command(spec)


def get_launcher_name(machine: str) -> str:
    return load_machine(machine).launcher


def test_local_launcher_uses_the_machines_gpu_variable_too() -> None:
    local = get_launcher("local", machine=load_machine("frontier"))
    env = local.task_env(make_spec(("n1",), gpu_ids=("3",)))  # type: ignore[attr-defined]
    assert env["ROCR_VISIBLE_DEVICES"] == "3"


# --- launch_params ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "machine", "params", "expected"),
    [
        ("srun", "generic-slurm", {"--cpu-bind": "map_cpu:0,1"},
         "srun --nodes=2 --ntasks=8 --ntasks-per-node=4 --cpus-per-task=1 --nodelist=a,b "
         f"--exact --cpu-bind=map_cpu:0,1 {TAIL}"),
        ("srun", "generic-slurm", {"-c": "16", "--mpi": "pmix", "--overlap": ""},
         "srun --nodes=2 --ntasks=8 --ntasks-per-node=4 --nodelist=a,b --cpu-bind=cores "
         f"--exact --cpus-per-task=16 --mpi=pmix --overlap {TAIL}"),
        ("pals", "polaris", {"--cpu-bind": "depth", "-d": "4"},
         f"mpiexec -n 8 --ppn 4 --hosts a,b --cpu-bind depth -d 4 {TAIL}"),
        ("mpich", "generic-pbs", {"--bind-to": "socket", "-l": ""},
         f"mpiexec -n 8 -ppn 4 -hosts a,b --bind-to socket -l {TAIL}"),
        ("openmpi", "generic-slurm", {"--map-by": "ppr:1:socket", "--report-bindings": ""},
         "mpiexec -np 8 --host a:4,b:4 --bind-to core -x OMP_NUM_THREADS -x LODE_JOB_ID "
         f"-x LODE_NODE_HOSTNAMES --map-by ppr:1:socket --report-bindings {TAIL}"),
        ("flux", "generic-flux", {"-o": "cpu-affinity=off", "--label-io": ""},
         "flux run -N 2 -n 8 -c 1 --requires=host:a,b --setopt=cpu-affinity=off "
         f"--label-io {TAIL}"),
        ("aprun", "theta", {"-cc": "none", "-ss": ""},
         f"aprun -n 8 -N 4 -d 1 -j 1 -cc none -ss {TAIL}"),
        ("jsrun", "summit", {"--launch_distribution": "packed", "-b": "rs"},
         f"jsrun -n 8 -r 4 -a 1 -c 1 -g 0 --launch_distribution=packed --bind=rs {TAIL}"),
    ],
)  # fmt: skip
def test_launch_params_add_options_or_replace_the_rendered_ones(
    name: str, machine: str, params: dict[str, str], expected: str
) -> None:
    spec = make_spec(launch_params=params)
    assert rendered(launcher(name, machine, "auto"), spec) == expected


@pytest.mark.parametrize(
    ("name", "machine", "params", "problem"),
    [
        ("srun", "generic-slurm", {"--task-prolog": "/tmp/x"}, "--task-prolog is not an option"),
        ("srun", "generic-slurm", {"--export": "LD_PRELOAD=/tmp/x.so"}, "--export is not"),
        ("srun", "generic-slurm", {"-o": "/etc/cron.d/x"}, "-o is not"),
        ("mpich", "generic-pbs", {"-launcher-exec": "/tmp/x"}, "-launcher-exec is not"),
        ("mpich", "generic-pbs", {"-genv": "LD_PRELOAD /x"}, "-genv is not"),
        ("pals", "polaris", {"--env": "LD_PRELOAD=/x"}, "--env is not"),
        ("openmpi", "generic-slurm", {"-x": "LD_PRELOAD"}, "-x is not"),
        ("openmpi", "generic-slurm", {"--mca": "plm_rsh_agent /tmp/x"}, "--mca is not"),
        ("flux", "generic-flux", {"-o": "userrc=/tmp/x.lua"}, "-o is not"),
        ("flux", "generic-flux", {"--requires": "host:other"}, "--requires is not"),
        ("srun", "generic-slurm", {"cpu_bind": "none"}, "'cpu_bind' is not a command-line option"),
        ("srun", "generic-slurm", {"--": "rm"}, "is not a command-line option"),
        ("srun", "generic-slurm", {"--cpu-bind": "cores\n--prolog=/x"}, "not one word"),
        ("srun", "generic-slurm", {"--cpu-bind": "a\0b"}, "not one word"),
        # A value given to a switch was a word of its own: a new option, or the program.
        ("srun", "generic-slurm", {"-l": "--export=ALL,BASH_ENV=$(touch${IFS}x)"}, "not one"),
        ("srun", "generic-slurm", {"-l": "/tmp/evil"}, "-l is a switch"),
        ("srun", "generic-slurm", {"--overlap": "x"}, "--overlap is a switch"),
        ("mpich", "generic-pbs", {"-l": "--launcher-exec=/tmp/x"}, "not one word"),
        ("mpich", "generic-pbs", {"-l": "/tmp/evil"}, "-l is a switch"),
        ("pals", "polaris", {"-l": "x"}, "-l is a switch"),
        ("openmpi", "generic-slurm", {"--oversubscribe": "/tmp/evil"}, "is a switch"),
        ("aprun", "theta", {"-ss": "x"}, "-ss is a switch"),
        ("flux", "generic-flux", {"--label-io": "x"}, "--label-io is a switch"),
        # Where a value is the next word, it may not read as an option, and a value is needed.
        ("mpich", "generic-pbs", {"-bind-to": "-launcher-exec"}, "does not start with '-'"),
        ("pals", "polaris", {"--cpu-bind": "a b"}, "not one word"),
        ("pals", "polaris", {"--cpu-bind": "$(id)"}, "not one word"),
        ("pals", "polaris", {"--cpu-bind": "'x'"}, "not one word"),
        ("mpich", "generic-pbs", {"-bind-to": ""}, "-bind-to needs a value"),
    ],
)  # fmt: skip
def test_launch_params_that_could_run_code_or_are_malformed_are_refused(
    name: str, machine: str, params: dict[str, str], problem: str
) -> None:
    with pytest.raises(InvalidLaunchParams, match=problem):
        launcher(name, machine).render_command(make_spec(launch_params=params))


def test_a_site_may_allow_more_options() -> None:
    srun = SrunLauncher(
        load_machine("generic-slurm"), bash=BASH, allow_options={"export": Arity.VALUE}
    )
    argv = srun.render_command(make_spec(("a",), launch_params={"--export": "ALL"}))
    assert "--export=ALL" in argv


def test_refused_launch_params_fail_the_start_before_anything_is_written(tmp_path: Path) -> None:
    spec = make_spec(("a",), launch_params={"--task-prolog": "/tmp/x"}, workdir=tmp_path)
    with pytest.raises(StartFailed, match="task-prolog"):
        launcher("srun", "generic-slurm").start(spec)
    assert list(tmp_path.iterdir()) == []


# --- the executable ---------------------------------------------------------------------------


def test_a_missing_executable_is_refused_by_name(tmp_path: Path) -> None:
    chosen = get_launcher("srun", machine=load_machine("generic-slurm"))
    assert isinstance(chosen, MpiLauncher)
    chosen.executable = "srun-that-is-not-installed"
    with pytest.raises(LauncherUnavailable, match="'srun-that-is-not-installed', which is not"):
        chosen.check_available()
    with pytest.raises(StartFailed, match="srun-that-is-not-installed"):
        chosen.start(make_spec(("a",), workdir=tmp_path))
    assert list(tmp_path.iterdir()) == []


def test_the_executable_is_found_on_the_tasks_path(tmp_path: Path) -> None:
    tools = tmp_path / "tools"
    tools.mkdir()
    fake = tools / "lode-test-srun"  # a name no host has, so the pilot's PATH lacks it
    fake.write_text('#!/bin/sh\necho "$@"\n')
    fake.chmod(0o755)
    workdir = tmp_path / "work"
    workdir.mkdir()
    spec = make_spec(("a",), ranks_per_node=1, workdir=workdir)
    spec = replace(spec, env={"PATH": f"{tools}:/usr/bin:/bin"})
    chosen = launcher("srun", "generic-slurm")
    chosen.executable = fake.name
    task = chosen.start(spec)
    assert task.wait(30) == 0
    assert (workdir / "out").read_text().startswith("--nodes=1 --ntasks=1")
    with pytest.raises(LauncherUnavailable):
        chosen.check_available()  # the pilot's own PATH does not have it


def test_local_and_fake_need_nothing() -> None:
    get_launcher("local").check_available()
    get_launcher("fake").check_available()


# --- layout -----------------------------------------------------------------------------------


def test_rank_layout_counts() -> None:
    polaris = load_machine("polaris")
    layout = RankLayout.of(make_spec(threads_per_rank=8, threads_per_core=2), polaris)
    assert (layout.num_ranks, layout.cores_per_rank, layout.cpus_per_rank) == (8, 4, 8)
    # more threads per core than the hardware has: capped
    layout = RankLayout.of(make_spec(threads_per_rank=8, threads_per_core=4), polaris)
    assert (layout.cores_per_rank, layout.threads_per_core, layout.cpus_per_rank) == (2, 2, 4)


def test_placement_needs_the_same_cores_on_every_node() -> None:
    polaris = load_machine("polaris")
    spec = make_spec(("a",), cpu_ids=(0, 1), ranks_per_node=2)
    assert rank_cpu_sets(spec, polaris) == [(0,), (1,)]
    placements = (NodePlacement("a", (0, 1)), NodePlacement("b", (2, 3)))
    uneven = replace(spec, allocation=Allocation("j", placements))
    assert rank_cpu_sets(uneven, polaris) is None
