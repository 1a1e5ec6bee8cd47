"""Machine descriptions: every shipped file validates and is consistent; bad files are refused."""

from __future__ import annotations

from pathlib import Path
from typing import get_args

import pytest

from lodestream.agents.site.settings import AppLauncherName, LauncherSettings
from lodestream.platform_adapters.compute import (
    GpuKind,
    load_machine,
    machine_names,
    node_discovery_names,
)
from lodestream.platform_adapters.compute.machine import GPU_VISIBILITY, parse_machine
from lodestream.platform_adapters.errors import InvalidMachine
from lodestream.platform_adapters.launchers import launcher_names

SHIPPED = machine_names()


def test_the_machines_the_platforms_need_are_shipped() -> None:
    assert set(SHIPPED) >= {
        "local", "generic-slurm", "polaris", "perlmutter-cpu", "perlmutter-gpu", "frontier",
        "aurora",
    }  # fmt: skip


@pytest.mark.parametrize("name", SHIPPED)
def test_every_shipped_machine_is_valid_and_consistent(name: str) -> None:
    machine = load_machine(name)
    node = machine.node
    assert machine.name == name
    assert machine.description
    assert machine.scheduler in node_discovery_names()
    assert machine.launcher in launcher_names()
    usable = node.usable_core_ids
    if usable is not None:
        assert node.cores is not None
        assert len(usable) == node.cores - len(node.reserved_cores) > 0
        assert not set(usable) & set(node.reserved_cores)
        # Every hardware thread of every core is a distinct logical CPU below cores * threads.
        cpus = [cpu for core in range(node.cores) for cpu in node.logical_cpus(core, 8)]
        assert sorted(cpus) == list(range(node.cores * node.threads_per_core))
    if node.gpus is not None:
        ids = machine.gpu_ids
        assert len(ids) == node.gpus.count * node.gpus.tiles_per_gpu
        assert len(set(ids)) == len(ids)
        assert machine.gpu_env == GPU_VISIBILITY[node.gpus.kind]


@pytest.mark.parametrize(
    ("name", "cores", "threads", "gpus", "gpu_env"),
    [
        ("polaris", 32, 2, 4, "CUDA_VISIBLE_DEVICES"),
        ("perlmutter-cpu", 128, 2, 0, "CUDA_VISIBLE_DEVICES"),
        ("perlmutter-gpu", 64, 2, 4, "CUDA_VISIBLE_DEVICES"),
        ("frontier", 56, 2, 8, "ROCR_VISIBLE_DEVICES"),
        ("aurora", 102, 2, 12, "ZE_AFFINITY_MASK"),
    ],
)
def test_node_facts(name: str, cores: int, threads: int, gpus: int, gpu_env: str) -> None:
    machine = load_machine(name)
    assert len(machine.node.usable_core_ids or ()) == cores
    assert machine.node.threads_per_core == threads
    assert len(machine.gpu_ids) == gpus
    if gpus:
        assert machine.gpu_env == gpu_env


def test_sibling_hardware_threads() -> None:
    polaris = load_machine("polaris").node
    assert polaris.logical_cpus(3, 2) == (3, 35)
    assert polaris.logical_cpus(3, 1) == (3,)
    assert polaris.logical_cpus(3, 4) == (3, 35)  # no more threads than the core has
    summit = load_machine("summit").node
    assert summit.logical_cpus(2, 4) == (8, 9, 10, 11)
    assert summit.logical_cpus(2, 1) == (8,)


def test_frontier_keeps_the_first_core_of_each_l3_region() -> None:
    node = load_machine("frontier").node
    assert node.reserved_cores == (0, 8, 16, 24, 32, 40, 48, 56)
    assert node.usable_core_ids is not None
    assert node.usable_core_ids[:8] == (1, 2, 3, 4, 5, 6, 7, 9)


def test_gpu_kinds_map_to_their_visibility_variables() -> None:
    assert GPU_VISIBILITY == {
        GpuKind.NVIDIA: "CUDA_VISIBLE_DEVICES",
        GpuKind.AMD: "ROCR_VISIBLE_DEVICES",
        GpuKind.INTEL: "ZE_AFFINITY_MASK",
    }


def test_a_site_may_describe_its_own_machine_by_path(tmp_path: Path) -> None:
    (tmp_path / "mine.yaml").write_text(
        "name: mine\nscheduler: slurm\nlauncher: srun\n"
        "node: {cores: 48, sockets: 2, gpus: {kind: intel, count: 2, tiles_per_gpu: 2,"
        " ids: ['0.0', '0.1', '1.0', '1.1']}}\n"
    )
    machine = load_machine("mine.yaml", base=tmp_path)
    assert machine.gpu_ids == ("0.0", "0.1", "1.0", "1.1")
    assert machine.gpu_env == "ZE_AFFINITY_MASK"
    assert load_machine(tmp_path / "mine.yaml") == machine


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("name: x\nscheduler: slurm\nlauncher: srun\nnode: {cores: 7, sockets: 2}", "sockets"),
        ("name: x\nscheduler: slurm\nlauncher: srun\nnode: {cores: 4, reserved_cores: [4]}",
         "reserved_cores"),
        ("name: x\nscheduler: slurm\nlauncher: srun\nnode: {cores: 2, reserved_cores: [0, 1]}",
         "no core"),
        ("name: x\nscheduler: slurm\nlauncher: srun\nnode: {reserved_cores: [0]}", "needs cores"),
        ("name: x\nscheduler: slurm\nlauncher: srun\nnode: {threads_per_core: 3}",
         "threads_per_core"),
        ("name: x\nscheduler: slurm\nlauncher: srun\n"
         "node: {gpus: {kind: nvidia, count: 2, ids: ['0']}}", "1 gpu ids for 2 GPUs"),
        ("name: x\nscheduler: slurm\nlauncher: srun\nnode: {gpus: {kind: tpu, count: 1}}",
         "node.gpus.kind"),
        ("name: x\nscheduler: sge\nlauncher: srun", "scheduler"),
        ("name: x\nscheduler: slurm\nlauncher: srun\nnode_name_format: '{}{}'",
         "node_name_format"),
        ("name: x\nscheduler: slurm\nlauncher: srun\ncores: 4", "cores: Extra inputs"),
        ("name: Bad Name\nscheduler: slurm\nlauncher: srun", "name"),
        ("- a list", "expected a mapping"),
        ("name: [unclosed", "not valid YAML"),
    ],
)  # fmt: skip
def test_invalid_descriptions_are_refused_with_the_field(text: str, problem: str) -> None:
    with pytest.raises(InvalidMachine, match=problem):
        parse_machine(text, source="test.yaml")


def test_unknown_machine_lists_the_known_ones(tmp_path: Path) -> None:
    with pytest.raises(InvalidMachine, match=r"known: .*polaris"):
        load_machine("no-such-machine")
    with pytest.raises(InvalidMachine, match=r"missing\.yaml"):
        load_machine(tmp_path / "missing.yaml")


def test_a_file_must_name_the_machine_it_is_loaded_as() -> None:
    with pytest.raises(InvalidMachine, match="not 'polaris'"):
        parse_machine(
            "name: other\nscheduler: pbs\nlauncher: pals", source="p.yaml", expect_name="polaris"
        )


def test_site_settings_name_every_launcher_and_choose_a_machine() -> None:
    assert set(get_args(AppLauncherName)) == set(launcher_names())
    settings = LauncherSettings.model_validate({"machine": "polaris"})
    assert settings.machine == "polaris"
    assert settings.app_launcher is None  # the machine's own: pals
    assert load_machine(settings.machine).launcher == "pals"
