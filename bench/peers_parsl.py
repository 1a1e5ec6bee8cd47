"""Parsl HTEX no-ops for ``bench.peers``, run in the bench virtualenv (Parsl on the path).

    python -m bench.peers_parsl --jobs N --workers W

Prints one JSON line: ``python_app_per_s`` and ``bash_app_per_s``, each from the first
submission to the last result, after a warm-up of both.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from typing import Any


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    # Only in the bench virtualenv: neither installed nor typed where mypy runs.
    import parsl  # type: ignore[import-not-found]  # noqa: PLC0415
    from parsl.config import Config  # type: ignore[import-not-found]  # noqa: PLC0415
    from parsl.executors import HighThroughputExecutor  # type: ignore[import-not-found]  # noqa: PLC0415
    from parsl.providers import LocalProvider  # type: ignore[import-not-found]  # noqa: PLC0415

    run_dir = tempfile.mkdtemp(prefix="parsl-peers-")
    config = Config(
        executors=[HighThroughputExecutor(
            label="htex", max_workers_per_node=args.workers,
            provider=LocalProvider(init_blocks=1, max_blocks=1),
        )],
        run_dir=run_dir, usage_tracking=0,
    )  # fmt: skip
    dfk = parsl.load(config)

    @parsl.python_app  # type: ignore[untyped-decorator]
    def noop() -> None:
        return None

    @parsl.bash_app  # type: ignore[untyped-decorator]
    def true() -> str:
        return "/bin/true"

    def rate(app: Any, n: int) -> float:
        t0 = time.perf_counter()
        futures = [app() for _ in range(n)]
        for f in futures:
            f.result()
        return n / (time.perf_counter() - t0)

    try:
        rate(noop, 200)
        rate(true, 200)
        out = {"python_app_per_s": rate(noop, args.jobs), "bash_app_per_s": rate(true, args.jobs),
               "parsl": parsl.__version__}  # fmt: skip
    finally:
        dfk.cleanup()
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
