"""``python -m bench.run`` (``make bench``): start a stack, run the benchmarks, stop everything.

    python -m bench.run [--only submit,projector,rebuild,query] [--scale 1.0] [--out bench/out]

``--scale`` multiplies the dataset sizes (0.05 for a smoke run). Writes
``<out>/<UTC timestamp>.json`` and prints a markdown table for
``bench/RESULTS.md``. Benchmarks measure and report, they never assert; a
phase that cannot finish in its time budget is reported as failed and the
next one still runs.

The stack's controller is stopped after start-up: the phases append the
lifecycle events themselves (the issue's event accounting), and a
controller reacting to them would race those appends. The submit phase
measures one extra burst with the controller running.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import shutil
import signal
import sys
import tempfile
import time
import traceback
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final, NoReturn

from bench import projector, query, rebuild, submit
from bench.context import Bench, open_bench
from bench.report import machine_facts, markdown, write_json
from bench.stack import BenchError, BenchStack

log = logging.getLogger("bench")

Phase = Callable[[Bench, Path, float], Awaitable[dict[str, Any]]]
PHASES: Final[dict[str, Phase]] = {
    "submit": submit.run,
    "projector": projector.run,
    "rebuild": rebuild.run,
    "query": query.run,
}
# Seconds at scale 1 on the 2-core machine, with room to spare; scaled, with a floor.
TIMEOUT_S: Final = {"submit": 900.0, "projector": 900.0, "rebuild": 3600.0, "query": 1800.0}
MIN_TIMEOUT_S: Final = 180.0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__.split("\n")[0])
    parser.add_argument(
        "--only",
        default=",".join(PHASES),
        help=f"comma-separated phases, run in this order: {','.join(PHASES)} (default: all)",
    )
    parser.add_argument("--scale", type=float, default=1.0, help="dataset size factor (1.0)")
    parser.add_argument("--out", type=Path, default=Path("bench/out"), help="JSON output dir")
    parser.add_argument("--keep", action="store_true", help="keep the stack's temp state dir")
    args = parser.parse_args(argv)
    phases = [p.strip() for p in args.only.split(",") if p.strip()]
    unknown = set(phases) - set(PHASES)
    if unknown or not phases:
        parser.error(f"unknown phases {sorted(unknown)}; choose from {','.join(PHASES)}")
    if not 0 < args.scale <= 10:
        parser.error("--scale must be in (0, 10]")
    args.phases = [p for p in PHASES if p in phases]
    return args


def _interrupt(signum: int, _frame: object) -> NoReturn:
    raise KeyboardInterrupt(f"signal {signum}")


async def run_phases(
    stack: BenchStack, phases: list[str], scale: float, workdir: Path, results: dict[str, Any]
) -> None:
    main = asyncio.current_task()
    assert main is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, main.cancel)
    async with open_bench(stack, scale) as bench:
        for name in phases:
            budget = max(TIMEOUT_S[name] * scale, MIN_TIMEOUT_S)
            log.info("phase %s (time budget %.0fs)", name, budget)
            started = time.perf_counter()
            try:
                async with asyncio.timeout(budget):
                    results[name] = await PHASES[name](bench, workdir, budget)
            except TimeoutError:
                results[name] = {"error": f"did not finish within its {budget:.0f}s budget"}
            except BenchError as exc:
                results[name] = {"error": str(exc)}
            except Exception as exc:
                log.exception("phase %s failed", name)
                results[name] = {"error": repr(exc), "traceback": traceback.format_exc()}
            results[name]["phase_s"] = round(time.perf_counter() - started, 1)
            log.info("phase %s done in %.0fs", name, results[name]["phase_s"])


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    signal.signal(signal.SIGTERM, _interrupt)
    started_at = datetime.now(UTC)
    root = Path(tempfile.mkdtemp(prefix="lode-bench-"))
    root.chmod(0o711)  # Postgres runs as its own account when we are root: it must traverse
    workdir = root / "profiles"
    workdir.mkdir()
    stack = BenchStack(root)
    phases: dict[str, Any] = {}
    record: dict[str, Any] = {
        "started_at": started_at.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "scale": args.scale,
        "phases_requested": args.phases,
        "machine": machine_facts(),
        "phases": phases,
    }
    status = 0
    try:
        stack.start()
        asyncio.run(run_phases(stack, args.phases, args.scale, workdir, phases))
    except (KeyboardInterrupt, asyncio.CancelledError):
        record["interrupted"] = True
        status = 130
    except Exception as exc:  # the stack itself failed: still stop it and write what we have
        log.exception("benchmark run failed")
        record["error"] = repr(exc)
        status = 1
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # stopping must not be cut short
        stack.stop()
        record["finished_at"] = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        if args.keep:
            log.info("state kept in %s", root)
        else:
            shutil.rmtree(root, ignore_errors=True)
    path = write_json(args.out, started_at.strftime("%Y%m%dT%H%M%SZ"), record)
    print(markdown(record))
    print(f"\n(full record: {path})", file=sys.stderr)
    return status


if __name__ == "__main__":
    sys.exit(main())
