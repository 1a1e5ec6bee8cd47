"""Whether the pilot's MPI launcher starts the ranks of a job as one world: a probe at start.

A launcher that starts ranks without a process manager (``srun`` on a cluster whose
``MpiDefault`` is none, without ``--mpi``) starts each rank as an MPI program of its own: a
4-rank job runs as 4 one-rank jobs and ends JOB_FINISHED, a wrong result without a word. An
mpi-mode pilot with room for two ranks starts a 2-rank probe on its allocation, through its
app launcher as it starts jobs, before it leases anything. Each rank prints what a process
manager gives it (``PMI_SIZE`` from Hydra, Slurm's pmi2, PALS and Flux; ``PMIX_RANK`` from a
PMIx server; ``OMPI_COMM_WORLD_SIZE`` from Open MPI's and Spectrum's launchers; ...). A rank
that sees none, or a world of another size, is a broken world: the pilot then refuses every
MPI job, with the reason on the job's history (``decide.refusal``), and still runs serial
ones. :func:`world_verdict` is the pure decision; :func:`probe_world` runs the probe.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Final

from lodestream.platform_adapters.compute.base import NodePlacement, NodeSpec
from lodestream.platform_adapters.errors import PlatformError, WaitTimedOut
from lodestream.platform_adapters.launchers.base import TaskSpec
from lodestream.platform_adapters.launchers.mpi import MpiLauncher
from lodestream.platform_adapters.packing import Allocation

log = logging.getLogger(__name__)

PROBE_RANKS: Final = 2
PROBE_TIMEOUT_S: Final = 60.0
MARK: Final = "lode-mpi-probe"
# Each rank's size of its world, as its process manager tells it, first found first.
SIZE_VARIABLES: Final = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "JSM_NAMESPACE_SIZE")
# A process manager that tells the rank but not the size in the environment (PMIx, ALPS).
RANK_ONLY_VARIABLES: Final = ("PMIX_RANK", "ALPS_APP_PE")
REPORTED: Final = (*SIZE_VARIABLES, *RANK_ONLY_VARIABLES, "PMI_RANK", "SLURM_PROCID")


def probe_script() -> str:
    """What each rank runs: one line naming the variables its process manager set."""
    fields = " ".join(f"{name}=${{{name}:-}}" for name in REPORTED)
    return f'echo "{MARK} {fields}"'


def probe_allocation(nodes: Sequence[NodeSpec]) -> Allocation | None:
    """Two ranks: one on each of the first two nodes, else two on the first node's CPUs;
    None when the pilot has room for one rank only (no MPI job could run here anyway)."""
    if len(nodes) >= PROBE_RANKS:
        placements = tuple(NodePlacement(n.hostname, n.cpu_ids[:1]) for n in nodes[:PROBE_RANKS])
        return Allocation("mpi-probe", placements)
    if nodes and len(nodes[0].cpu_ids) >= PROBE_RANKS:
        node = nodes[0]
        return Allocation("mpi-probe", (NodePlacement(node.hostname, node.cpu_ids[:PROBE_RANKS]),))
    return None


def world_verdict(output: str, ranks: int) -> str | None:
    """Why the ranks of the probe did not form one world of ``ranks``, or None if they did.

    ``output`` is what the probe's ranks printed (each one :func:`probe_script`'s line).
    """
    seen = [_fields(line) for line in output.splitlines() if line.startswith(MARK + " ")]
    if len(seen) != ranks:
        return f"{len(seen)} of the probe's {ranks} ranks reported"
    for fields in seen:
        size = next((fields[name] for name in SIZE_VARIABLES if fields.get(name)), None)
        if size is not None:
            if size != str(ranks):
                return f"a rank of {ranks} sees a world of {size} ({_named(fields)})"
        elif not any(fields.get(name) for name in RANK_ONLY_VARIABLES):
            return (f"the ranks found no process manager (none of "
                    f"{', '.join((*SIZE_VARIABLES, *RANK_ONLY_VARIABLES))} is set): each would "
                    f"run as an MPI world of one")  # fmt: skip
    return None


def _fields(line: str) -> dict[str, str]:
    pairs = (word.partition("=") for word in line.split()[1:])
    return {name: value for name, _, value in pairs}


def _named(fields: dict[str, str]) -> str:
    return " ".join(f"{k}={v}" for k, v in fields.items() if v) or "nothing set"


def probe_world(
    launcher: MpiLauncher, nodes: Sequence[NodeSpec], workdir: Path, env: Mapping[str, str]
) -> str | None:
    """Run the probe through ``launcher`` on ``nodes`` with the environment jobs get
    (``env``); why MPI jobs must be refused, or None (None too when the pilot has room for
    one rank only). Blocks: call it in a thread."""
    allocation = probe_allocation(nodes)
    if allocation is None:
        return None
    ranks_per_node = PROBE_RANKS // allocation.num_nodes
    workdir.mkdir(parents=True, exist_ok=True)
    spec = TaskSpec(
        job_id="mpi-probe", script=probe_script(), workdir=workdir, env=env,
        allocation=allocation, stdout_path=workdir / "probe.out",
        stderr_path=workdir / "probe.err", ranks_per_node=ranks_per_node,
    )  # fmt: skip
    try:
        task = launcher.start(spec)
        try:
            code = task.wait(timeout=PROBE_TIMEOUT_S)
        except WaitTimedOut:
            task.kill()
            return f"the probe did not end within {PROBE_TIMEOUT_S:g} s"
        output = spec.stdout_path.read_text(errors="replace")
        errors = spec.stderr_path.read_text(errors="replace")[-500:].strip()
    except (PlatformError, OSError) as exc:
        return f"the probe could not start: {exc}"
    finally:
        with contextlib.suppress(OSError):
            shutil.rmtree(workdir)
    if code != 0:
        return f"the probe exited {code}" + (f": {errors}" if errors else "")
    return world_verdict(output, PROBE_RANKS)


def refusal_reason(launcher: MpiLauncher, why: str) -> str:
    """What an MPI job refused on this pilot says, with the remedy for the launcher."""
    remedy = (" (srun: set launcher.srun_mpi to a plugin `srun --mpi=list` names, e.g. pmi2)"
              if launcher.name == "srun" else "")  # fmt: skip
    return (f"this pilot's MPI launcher ({launcher.name}) does not start the ranks of a job as "
            f"one MPI world: {why}; MPI jobs are refused rather than run as separate "
            f"programs{remedy}")  # fmt: skip
