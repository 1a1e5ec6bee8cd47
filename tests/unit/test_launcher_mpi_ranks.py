"""Which rank of an mpi4py pilot serves which node, and what its jobs inherit
(``agents/launcher/mpi_ranks.py``)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from lodestream.agents.launcher.mpi_ranks import Assignment, assign_nodes, job_environment


def test_one_rank_per_node_serves_its_own_node_rank_0_included() -> None:
    # mpiexec -n 3 -ppn 1 -hosts a,b,c
    got = assign_nodes(["a", "b", "c"], ["a", "b", "c"])
    assert got == Assignment(rank_of={0: 0, 1: 1, 2: 2})
    assert got.node_of(0) == 0


def test_an_extra_rank_0_beside_a_worker_only_leases() -> None:
    # mpiexec -n 4 with rank 0 and rank 1 on node a
    got = assign_nodes(["a", "b", "c"], ["a", "a", "b", "c"])
    assert got.rank_of == {0: 1, 1: 2, 2: 3}
    assert got.idle == (0,)
    assert got.node_of(0) is None


def test_virtual_nodes_of_one_host_go_to_its_workers_first() -> None:
    host = ["vm", "vm"]  # the local machine: both virtual nodes are rank 0's host
    assert assign_nodes(host, ["vm", "vm", "vm"]).rank_of == {0: 1, 1: 2}  # rank 0 leases
    assert assign_nodes(host, ["vm", "vm"]).rank_of == {0: 1, 1: 0}  # rank 0 runs jobs too


def test_names_match_without_domain_or_case() -> None:
    got = assign_nodes(["nid001", "NID002"], ["nid001.hsn.example.org", "nid002"])
    assert got.rank_of == {0: 0, 1: 1}
    assert got.renamed == ()


def test_a_node_no_rank_names_gets_a_rank_whose_host_no_node_names() -> None:
    got = assign_nodes(["x1000c0s0b0n0", "x1000c0s0b0n1"], ["nid000010", "x1000c0s0b0n1"])
    assert got.rank_of == {0: 0, 1: 1}
    assert got.renamed == (0,)


def test_nodes_without_ranks_are_unserved_and_ranks_without_nodes_idle() -> None:
    assert assign_nodes(["a", "b", "c"], ["a", "b"]) == Assignment(
        rank_of={0: 0, 1: 1}, unserved=(2,)
    )
    assert assign_nodes(["a"], ["a", "b", "a"]) == Assignment(rank_of={0: 2}, idle=(0, 1))


@given(
    st.lists(st.sampled_from(["a", "b", "c", "d"]), max_size=6),
    st.lists(st.sampled_from(["a", "b", "c", "e"]), min_size=1, max_size=6),
)
def test_every_node_has_at_most_one_rank_and_every_rank_at_most_one_node(
    nodes: list[str], ranks: list[str]
) -> None:
    got = assign_nodes(nodes, ranks)
    served = list(got.rank_of.values())
    assert len(served) == len(set(served))
    assert set(got.rank_of) | set(got.unserved) == set(range(len(nodes)))
    assert set(served) | set(got.idle) == set(range(len(ranks)))
    for node, rank in got.rank_of.items():  # a matching name whenever there was one to match
        if node not in got.renamed:
            assert nodes[node] == ranks[rank]


def test_jobs_do_not_inherit_what_makes_the_pilot_a_rank() -> None:
    environ = {
        "PATH": "/usr/bin", "HOME": "/home/ada", "OMP_NUM_THREADS": "4",
        "PMI_RANK": "1", "PMI_SIZE": "3", "PMI_FD": "7", "PMIX_RANK": "1", "HYDI_CONTROL_FD": "9",
        "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2", "OMPI_COMM_WORLD_RANK": "1",
        "PALS_RANKID": "1", "SLURM_PROCID": "1", "SLURM_STEP_ID": "3", "SLURM_JOB_ID": "77",
        "SLURM_NTASKS": "4", "PBS_NODEFILE": "/var/spool/nodes", "HYDRA_LAUNCHER": "ssh",
    }  # fmt: skip
    assert job_environment(environ) == {
        "PATH": "/usr/bin", "HOME": "/home/ada", "OMP_NUM_THREADS": "4", "SLURM_JOB_ID": "77",
        "SLURM_NTASKS": "4", "PBS_NODEFILE": "/var/spool/nodes", "HYDRA_LAUNCHER": "ssh",
    }  # fmt: skip
