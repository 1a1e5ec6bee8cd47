"""Small statistics: percentiles of latencies and the top of a cProfile."""

from __future__ import annotations

import pstats
import site
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = str(Path(__file__).resolve().parents[1]) + "/"
PROJECT_PACKAGES = ("services/", "schemas/", "lodestream/", "infra/")
_PREFIXES = sorted(
    {*site.getsitepackages(), sys.prefix, sys.base_prefix, REPO}, key=len, reverse=True
)

FuncKey = tuple[str, int, str]


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of ``values``; 0 for none."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(1, min(len(ordered), round(q / 100 * len(ordered) + 0.5)))
    return ordered[rank - 1]


def latency_ms(seconds: Sequence[float]) -> dict[str, float]:
    return {
        "p50_ms": round(percentile(seconds, 50) * 1000, 2),
        "p95_ms": round(percentile(seconds, 95) * 1000, 2),
        "p99_ms": round(percentile(seconds, 99) * 1000, 2),
        "max_ms": round(max(seconds, default=0.0) * 1000, 2),
        "n": len(seconds),
    }


def _short(file: str) -> str:
    for prefix in _PREFIXES:
        if file.startswith(prefix):
            return file[len(prefix) :].lstrip("/").split("site-packages/", 1)[-1]
    return file


def _where(func: FuncKey) -> str:
    file, line, name = func
    return f"{_short(file)}:{line}({name})" if line else name


def top_functions(
    stats: pstats.Stats, key: str, limit: int = 15, *, project_only: bool = False
) -> list[dict[str, Any]]:
    """The ``limit`` functions with the most ``key`` time (``cumulative`` or ``tottime``)."""
    raw: dict[FuncKey, tuple[int, int, float, float, Any]] = stats.stats  # type: ignore[attr-defined]
    total: float = stats.total_tt  # type: ignore[attr-defined]
    index = 3 if key == "cumulative" else 2
    items = [
        (func, timing)
        for func, timing in raw.items()
        if not project_only or _short(func[0]).startswith(PROJECT_PACKAGES)
    ]
    items.sort(key=lambda item: item[1][index], reverse=True)
    return [
        {
            "function": _where(func),
            "ncalls": calls,
            "tottime_s": round(tottime, 3),
            "cumtime_s": round(cumtime, 3),
            "cum_pct": round(cumtime / total * 100, 1) if total else 0.0,
        }
        for func, (_, calls, tottime, cumtime, _) in items[:limit]
    ]


def profile_summary(stats: pstats.Stats, limit: int = 15) -> dict[str, Any]:
    """Top functions by cumulative time (all, and lodestream's own), and by own time."""
    return {
        "total_s": round(stats.total_tt, 3),  # type: ignore[attr-defined]
        "top_cumulative": top_functions(stats, "cumulative", limit),
        "top_cumulative_project": top_functions(stats, "cumulative", limit, project_only=True),
        "top_tottime": top_functions(stats, "tottime", limit),
    }
