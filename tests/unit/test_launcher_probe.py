"""The pilot's probe of its MPI world (``agents/launcher/probe.py``): what the ranks print,
as the real launchers' environments give it, and the refusal that follows."""

from __future__ import annotations

import pytest

from lodestream.agents.launcher import decide
from lodestream.agents.launcher.probe import (
    MARK,
    probe_allocation,
    probe_script,
    world_verdict,
)
from lodestream.platform_adapters.compute.base import NodeSpec
from lodestream.platform_adapters.packing import JobRequest


def rank(**env: str) -> str:
    return f"{MARK} " + " ".join(f"{k}={v}" for k, v in env.items())


# What `srun -N 2 -n 2` set on the test cluster (Slurm 22.05, MpiDefault=none), and Hydra's
# mpiexec, Open MPI's mpirun and a PMIx server.
NONE = [rank(PMI_SIZE="", SLURM_PROCID=str(r)) for r in range(2)]
PMI2 = [rank(PMI_RANK=str(r), PMI_SIZE="2", SLURM_PROCID=str(r)) for r in range(2)]
OMPI = [rank(OMPI_COMM_WORLD_SIZE="2", PMIX_RANK=str(r)) for r in range(2)]
PMIX = [rank(PMIX_RANK=str(r)) for r in range(2)]


@pytest.mark.parametrize("lines", [PMI2, OMPI, PMIX], ids=["pmi", "openmpi", "pmix"])
def test_ranks_that_share_a_world_pass(lines: list[str]) -> None:
    assert world_verdict("\n".join(["noise from a module", *lines]), 2) is None


@pytest.mark.parametrize(
    ("lines", "why"),
    [
        (NONE, "found no process manager"),  # srun --mpi=none: each rank a world of one
        ([rank(PMI_RANK="0", PMI_SIZE="1")] * 2, "sees a world of 1"),
        (PMI2[:1], "1 of the probe's 2 ranks reported"),
        ([], "0 of the probe's 2 ranks reported"),
    ],
)
def test_ranks_in_no_one_world_are_a_broken_world(lines: list[str], why: str) -> None:
    verdict = world_verdict("\n".join(lines), 2)
    assert verdict is not None
    assert why in verdict


def test_the_probe_prints_every_variable_it_reads_on_one_line() -> None:
    assert probe_script().startswith(f'echo "{MARK} PMI_SIZE=${{PMI_SIZE:-}} ')


def test_two_ranks_go_on_two_nodes_or_on_two_cpus_of_one_or_nowhere() -> None:
    two = probe_allocation([NodeSpec("a", (0, 1)), NodeSpec("b", (0, 1))])
    assert two is not None
    assert [(p.hostname, p.cpu_ids) for p in two.placements] == [("a", (0,)), ("b", (0,))]
    one = probe_allocation([NodeSpec("a", (4, 5, 6))])
    assert one is not None
    assert [(p.hostname, p.cpu_ids) for p in one.placements] == [("a", (4, 5))]
    assert probe_allocation([NodeSpec("a", (0,))]) is None


@pytest.mark.parametrize(("nodes", "ranks", "refused"), [(1, 1, False), (1, 2, True), (2, 1, True)])
def test_a_pilot_whose_world_is_broken_fails_mpi_jobs_with_the_reason_and_runs_serial_ones(
    nodes: int, ranks: int, refused: bool
) -> None:
    request = JobRequest("j", num_nodes=nodes, ranks_per_node=ranks)
    verdict = decide.refusal(request, mode="mpi", never_fits=None, pilot_nodes=3,
                             site=decide.SiteShape(), mpi_broken="no one world")  # fmt: skip
    if not refused:
        assert verdict is None
        return
    assert verdict == decide.Refusal(
        f"an MPI job ({nodes} nodes x {ranks} ranks): no one world", nowhere=True
    )
