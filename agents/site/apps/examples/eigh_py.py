"""Example Python-function app: the same eigh, with the summary returned to the client.

``run`` executes in the job's process at the site; its arguments are the
app's parameters, the JSON values the job gave (``n: 500`` or ``n: "500"``,
so ``int()`` them), and its return value must be JSON. An exception goes
back to the client with its traceback.
"""

from __future__ import annotations

from lodestream.agents.site.apps import ApplicationDefinition

MAX_N = 20_000


class EighSummary(ApplicationDefinition):
    """Eigenvalue summary of a random symmetric n x n matrix, returned as JSON."""

    name = "eigh_py"
    parameters = {
        "n": {"help": f"matrix size, 1..{MAX_N}"},
        "seed": {"help": "seed of numpy's default_rng"},
    }

    def run(self, n: str, seed: str = "0") -> dict[str, float]:
        # Only the job needs numpy, not the agent that loads the app.
        import numpy as np  # noqa: PLC0415

        size = int(n)
        if not 1 <= size <= MAX_N:
            raise ValueError(f"n must be in 1..{MAX_N}, got {size}")
        matrix = np.random.default_rng(int(seed)).standard_normal((size, size))
        values = np.linalg.eigvalsh((matrix + matrix.T) / 2)
        return {
            "n": size,
            "min": float(values[0]),
            "max": float(values[-1]),
            "trace": float(values.sum()),
        }
