"""Example shell-command app: eigenvalues of a random symmetric n x n matrix (the demo workload).

Copy this file into the site's ``apps/`` directory. It is also the script its
command runs, so the site needs only numpy; the loader imports it without
running ``main`` and without importing numpy.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

from lodestream.agents.site.apps import ApplicationDefinition, Decision, Parameter

MAX_N = 20_000
USAGE_ERROR = 2  # argparse's exit code: running the same arguments again cannot help


class Eigh(ApplicationDefinition):
    """Eigen-decomposition of a random symmetric n x n matrix (numpy.linalg.eigh)."""

    name = "eigh"
    command_template = (
        shlex.join([sys.executable, str(Path(__file__).resolve())])
        + " --n {{ n }} --seed {{ seed }}"
    )
    parameters = {
        "n": Parameter(help=f"matrix size, 1..{MAX_N}"),
        "seed": Parameter(default="0", help="seed of numpy's default_rng"),
    }
    environment_variables = {"OMP_NUM_THREADS": "1"}
    cleanup_files = ["eigenvectors.npy"]

    def preprocess(self) -> None:
        n = self.job.parameters.get("n", "")
        if not n.isdigit() or not 1 <= int(n) <= MAX_N:
            raise ValueError(f"n must be an integer in 1..{MAX_N}, got {n!r}")

    def postprocess(self) -> None:
        summary = json.loads((self.job.workdir / "eigh.json").read_text(encoding="utf-8"))
        if summary["n"] != int(self.job.parameters["n"]):
            raise ValueError(f"eigh.json is for n={summary['n']}")

    def handle_error(self) -> Decision:
        if self.job.return_code == USAGE_ERROR:
            return Decision.FAIL
        return super().handle_error()


def main(argv: list[str] | None = None) -> int:
    # Only the job needs numpy, not the agent that loads the app.
    import numpy as np  # noqa: PLC0415

    parser = argparse.ArgumentParser(description=Eigh.description)
    parser.add_argument("--n", type=int, required=True)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if not 1 <= args.n <= MAX_N:
        parser.error(f"--n must be in 1..{MAX_N}")
    rng = np.random.default_rng(args.seed)
    matrix = rng.standard_normal((args.n, args.n))
    values, vectors = np.linalg.eigh((matrix + matrix.T) / 2)
    np.save("eigenvectors.npy", vectors)
    summary = {"n": args.n, "seed": args.seed, "min": float(values[0]), "max": float(values[-1])}
    Path("eigh.json").write_text(json.dumps(summary) + "\n", encoding="utf-8")
    sys.stdout.write(json.dumps(summary) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
