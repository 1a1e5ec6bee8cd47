"""Node discovery from batch allocations: each scheduler's environment + a machine → NodeSpecs."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from lodestream.platform_adapters.compute import (
    NodeSpec,
    discover_nodes,
    get_node_discovery,
    load_machine,
    node_discovery_names,
)
from lodestream.platform_adapters.compute.allocation import (
    FLUX_R_COMMAND,
    AllocatedHost,
    flux_expiration,
    parse_cobalt_partname,
    parse_flux_nodelist,
    parse_flux_r,
    parse_lsf_hosts,
    parse_lsf_mcpu_hosts,
    parse_pbs_nodefile,
)
from lodestream.platform_adapters.compute.commands import CommandRunner
from lodestream.platform_adapters.compute.discovery import (
    cobalt_nodes,
    flux_nodes,
    lsf_nodes,
    node_specs,
    pbs_nodes,
    slurm_nodes,
)
from lodestream.platform_adapters.compute.machine import Machine
from lodestream.platform_adapters.errors import (
    AllocationNotFound,
    DiscoveryError,
    InvalidHostlist,
    SchedulerQueryFailed,
    UnknownBackend,
)

DATA = Path(__file__).resolve().parents[1] / "data" / "schedulers"
FLUX_R = (DATA / "flux_R.json").read_text()


def runner(outputs: dict[tuple[str, ...], str]) -> tuple[list[tuple[str, ...]], CommandRunner]:
    calls: list[tuple[str, ...]] = []

    def run(argv: Sequence[str]) -> str:
        calls.append(tuple(argv))
        return outputs[tuple(argv)]

    return calls, run


# --- Slurm ------------------------------------------------------------------------------------


def test_slurm_generic_cluster_takes_sizes_from_the_allocation() -> None:
    env = {"SLURM_JOB_NODELIST": "nid[001-003,007],login1", "SLURM_JOB_CPUS_PER_NODE": "8(x4),2"}
    specs = slurm_nodes(environ=env)
    assert [s.hostname for s in specs] == ["nid001", "nid002", "nid003", "nid007", "login1"]
    assert [len(s.cpu_ids) for s in specs] == [8, 8, 8, 8, 2]
    assert all(s.gpu_ids == () for s in specs)


def test_slurm_cpus_on_node_is_used_when_per_node_counts_are_missing() -> None:
    env = {"SLURM_JOB_NODELIST": "n[1-2]", "SLURM_CPUS_ON_NODE": "4"}
    assert [s.cpu_ids for s in slurm_nodes(environ=env)] == [(0, 1, 2, 3)] * 2


def test_slurm_on_perlmutter_gpu_uses_the_machine_description() -> None:
    env = {"SLURM_JOB_NODELIST": "nid[001000-001001]", "SLURM_JOB_CPUS_PER_NODE": "128(x2)"}
    specs = slurm_nodes(machine=load_machine("perlmutter-gpu"), environ=env)
    assert specs == [
        NodeSpec("nid001000", tuple(range(64)), ("0", "1", "2", "3")),
        NodeSpec("nid001001", tuple(range(64)), ("0", "1", "2", "3")),
    ]


def test_slurm_on_frontier_leaves_out_the_reserved_cores() -> None:
    env = {"SLURM_JOB_NODELIST": "frontier00001"}
    (node,) = slurm_nodes(machine=load_machine("frontier"), environ=env)
    assert len(node.cpu_ids) == 56
    assert 0 not in node.cpu_ids
    assert 8 not in node.cpu_ids
    assert node.gpu_ids == tuple(str(i) for i in range(8))


def test_slurm_counts_must_match_the_nodes() -> None:
    env = {"SLURM_JOB_NODELIST": "n[1-3]", "SLURM_JOB_CPUS_PER_NODE": "4(x2)"}
    with pytest.raises(InvalidHostlist, match="2 counts for 3 nodes"):
        slurm_nodes(environ=env)


def test_slurm_without_sizes_needs_cores_per_node() -> None:
    env = {"SLURM_JOB_NODELIST": "n1"}
    with pytest.raises(DiscoveryError, match="set the site's cores_per_node"):
        slurm_nodes(environ=env)
    (node,) = slurm_nodes(environ=env, cores_per_node=3)
    assert node.cpu_ids == (0, 1, 2)


def test_outside_a_job_the_allocation_is_not_found() -> None:
    with pytest.raises(AllocationNotFound, match="SLURM_JOB_NODELIST"):
        slurm_nodes(environ={})
    with pytest.raises(AllocationNotFound, match="PBS_NODEFILE"):
        pbs_nodes(environ={})
    with pytest.raises(AllocationNotFound, match="LSB_MCPU_HOSTS"):
        lsf_nodes(environ={})
    with pytest.raises(AllocationNotFound, match="COBALT_PARTNAME"):
        cobalt_nodes(environ={})


# --- PBS --------------------------------------------------------------------------------------


def test_pbs_nodefile_has_one_line_per_rank_and_is_deduplicated_in_order() -> None:
    text = "x3005c0s7b1n0\nx3005c0s7b1n0\nx3005c0s7b0n0\n\nx3005c0s7b0n0\n"
    assert parse_pbs_nodefile(text) == ["x3005c0s7b1n0", "x3005c0s7b0n0"]


def test_pbs_on_polaris(tmp_path: Path) -> None:
    nodefile = tmp_path / "nodefile"
    nodefile.write_text("x3005c0s7b0n0.hsn.cm.polaris.alcf.anl.gov\n" * 4 + "x3005c0s7b1n0\n")
    specs = pbs_nodes(machine=load_machine("polaris"), environ={"PBS_NODEFILE": str(nodefile)})
    assert [s.hostname for s in specs] == [
        "x3005c0s7b0n0.hsn.cm.polaris.alcf.anl.gov", "x3005c0s7b1n0",
    ]  # fmt: skip
    assert all(s.cpu_ids == tuple(range(32)) for s in specs)
    assert all(s.gpu_ids == ("0", "1", "2", "3") for s in specs)


def test_pbs_on_aurora_gives_one_gpu_id_per_tile(tmp_path: Path) -> None:
    nodefile = tmp_path / "nodefile"
    nodefile.write_text("x4102c5s2b0n0\n")
    (node,) = pbs_nodes(machine=load_machine("aurora"), environ={"PBS_NODEFILE": str(nodefile)})
    assert len(node.cpu_ids) == 102
    assert node.gpu_ids == tuple(str(i) for i in range(12))


def test_generic_pbs_takes_ncpus(tmp_path: Path) -> None:
    nodefile = tmp_path / "nodefile"
    nodefile.write_text("a\nb\n")
    specs = pbs_nodes(environ={"PBS_NODEFILE": str(nodefile), "NCPUS": "16"})
    assert [len(s.cpu_ids) for s in specs] == [16, 16]


def test_unreadable_pbs_nodefile(tmp_path: Path) -> None:
    with pytest.raises(SchedulerQueryFailed, match="cannot read PBS_NODEFILE"):
        pbs_nodes(environ={"PBS_NODEFILE": str(tmp_path / "gone")}, cores_per_node=1)


# --- LSF --------------------------------------------------------------------------------------


def test_lsf_mcpu_hosts() -> None:
    assert parse_lsf_mcpu_hosts("batch3 1 a01n01 42 a01n02 42") == [
        AllocatedHost("batch3", 1), AllocatedHost("a01n01", 42), AllocatedHost("a01n02", 42),
    ]  # fmt: skip
    with pytest.raises(InvalidHostlist, match="pairs"):
        parse_lsf_mcpu_hosts("hostA 4 hostB")
    with pytest.raises(InvalidHostlist, match="positive count"):
        parse_lsf_mcpu_hosts("hostA four")


def test_lsf_hosts_counts_slots() -> None:
    assert parse_lsf_hosts("hA hA hB hA") == [AllocatedHost("hA", 3), AllocatedHost("hB", 1)]


def test_lsf_on_summit_skips_the_launch_node() -> None:
    env = {"LSB_MCPU_HOSTS": "batch3 1 a01n01 42 a01n02 42"}
    specs = lsf_nodes(machine=load_machine("summit"), environ=env)
    assert [s.hostname for s in specs] == ["a01n01", "a01n02"]
    assert all(len(s.cpu_ids) == 42 and len(s.gpu_ids) == 6 for s in specs)


def test_generic_lsf_keeps_every_host_and_takes_slots() -> None:
    specs = lsf_nodes(environ={"LSB_HOSTS": "hA hA hB hB"})
    assert [(s.hostname, s.cpu_ids) for s in specs] == [("hA", (0, 1)), ("hB", (0, 1))]


def test_an_lsf_allocation_of_only_the_launch_host_has_no_compute_nodes() -> None:
    with pytest.raises(AllocationNotFound, match="no compute host"):
        lsf_nodes(machine=load_machine("summit"), environ={"LSB_MCPU_HOSTS": "batch3 1"})


# --- Cobalt -----------------------------------------------------------------------------------


def test_cobalt_partname_becomes_nid_hostnames() -> None:
    assert parse_cobalt_partname("1-3,7") == ["nid00001", "nid00002", "nid00003", "nid00007"]
    assert parse_cobalt_partname("12", "node{:d}") == ["node12"]


def test_cobalt_on_theta() -> None:
    specs = cobalt_nodes(machine=load_machine("theta"), environ={"COBALT_PARTNAME": "3830-3831"})
    assert [s.hostname for s in specs] == ["nid03830", "nid03831"]
    assert all(len(s.cpu_ids) == 64 for s in specs)


# --- Flux -------------------------------------------------------------------------------------


def test_flux_r_gives_names_cores_and_gpus_per_rank() -> None:
    hosts = parse_flux_r(FLUX_R)
    assert [h.hostname for h in hosts] == ["tioga18", "tioga19", "tioga21"]
    assert hosts[0].cpu_ids == tuple(range(64))
    assert hosts[0].gpu_ids == ("0", "1", "2", "3")
    assert hosts[2].cpu_ids == tuple(range(32))
    assert hosts[2].gpu_ids == ()
    assert flux_expiration(FLUX_R) == 1710241200.0


def test_flux_resource_list_nodelist() -> None:
    # `flux resource list -n -o {nodelist}`: one line per state that has nodes
    assert parse_flux_nodelist("tioga[18-19]\ntioga21\n\n") == ["tioga18", "tioga19", "tioga21"]


def test_flux_nodes_run_flux_resource_r() -> None:
    calls, run = runner({FLUX_R_COMMAND: FLUX_R})
    specs = flux_nodes(run=run)
    assert calls == [FLUX_R_COMMAND]
    assert [len(s.cpu_ids) for s in specs] == [64, 64, 32]
    assert [len(s.gpu_ids) for s in specs] == [4, 4, 0]


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("not json", "not JSON"),
        ('{"version": 2}', "version 1"),
        ('{"version": 1}', "no execution"),
        ('{"version": 1, "execution": {"R_lite": [], "nodelist": "n1"}}', "nodelist"),
        ('{"version": 1, "execution": {"R_lite": [{"rank": "1", "children": {}}],'
         ' "nodelist": ["n1"]}}', "rank 1 has no name"),
        ('{"version": 1, "execution": {"R_lite": [{"rank": 0}], "nodelist": ["n1"]}}', "rank"),
    ],
)  # fmt: skip
def test_malformed_flux_r_is_refused(text: str, problem: str) -> None:
    with pytest.raises(SchedulerQueryFailed, match=problem):
        parse_flux_r(text)


# --- combining -------------------------------------------------------------------------------


def test_explicit_sizes_take_the_first_cores_and_gpus() -> None:
    machine = load_machine("polaris")
    (node,) = node_specs([AllocatedHost("h")], machine, cores_per_node=8, gpus_per_node=2)
    assert node == NodeSpec("h", tuple(range(8)), ("0", "1"))
    with pytest.raises(DiscoveryError, match="has 32 usable cores"):
        node_specs([AllocatedHost("h")], machine, cores_per_node=33)
    with pytest.raises(DiscoveryError, match="has 4 GPUs"):
        node_specs([AllocatedHost("h")], machine, gpus_per_node=5)


def test_gpus_per_node_without_known_gpus_uses_indexes() -> None:
    machine = Machine(name="m", scheduler="slurm", launcher="srun")
    (node,) = node_specs([AllocatedHost("h", 4)], machine, gpus_per_node=2)
    assert node.gpu_ids == ("0", "1")


def test_hyperthreads_counted_as_slots_become_cores() -> None:
    machine = Machine(name="m", scheduler="slurm", launcher="srun", node={"threads_per_core": 2})
    (node,) = node_specs([AllocatedHost("h", 8)], machine)
    assert node.cpu_ids == (0, 1, 2, 3)


def test_an_empty_allocation_is_refused() -> None:
    with pytest.raises(DiscoveryError, match="no nodes"):
        node_specs([], load_machine("polaris"))


def test_discover_nodes_reads_the_machines_scheduler(tmp_path: Path) -> None:
    nodefile = tmp_path / "nodefile"
    nodefile.write_text("a\nb\n")
    specs = discover_nodes(load_machine("polaris"), environ={"PBS_NODEFILE": str(nodefile)})
    assert [s.hostname for s in specs] == ["a", "b"]
    _, run = runner({FLUX_R_COMMAND: FLUX_R})
    assert len(discover_nodes(load_machine("generic-flux"), run=run)) == 3
    local = discover_nodes(load_machine("local"), virtual_nodes=2, cores_per_node=2, environ={})
    assert len(local) == 2
    with pytest.raises(DiscoveryError, match="virtual_nodes=2 splits this host"):
        discover_nodes(load_machine("polaris"), virtual_nodes=2)


def test_registry_names_a_backend_per_scheduler() -> None:
    assert node_discovery_names() == ("cobalt", "flux", "local", "lsf", "pbs", "slurm")
    discover = get_node_discovery("slurm")
    assert discover is slurm_nodes
    with pytest.raises(UnknownBackend, match="known: cobalt, flux, local"):
        get_node_discovery("sge")
