"""Machine facts, the JSON record, and the markdown table for ``bench/RESULTS.md``."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

import orjson

from bench.probe import OTHERS
from bench.stats import REPO
from lodestream.infra.nats.server import find_binary
from lodestream.infra.postgres.server import postgres_bin_dir

LIBRARIES = ("nats-py", "psycopg", "sqlalchemy", "pydantic", "fastapi", "uvicorn", "orjson")


def _run(argv: list[str]) -> str:
    try:
        result = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=10)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unknown ({exc})"
    return (result.stdout or result.stderr).strip()


def _cpuinfo_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.partition(":")[2].strip()
    return platform.processor() or "unknown"


def _ram_gib() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return round(int(line.split()[1]) / 1024 / 1024, 1)
    return 0.0


def machine_facts() -> dict[str, Any]:
    commit = _run(["git", "-C", REPO, "rev-parse", "HEAD"])
    dirty = bool(_run(["git", "-C", REPO, "status", "--porcelain", "--untracked-files=no"]))
    return {
        "cpu_model": _cpuinfo_model(),
        "cores": os.cpu_count(),
        "cores_usable": len(os.sched_getaffinity(0)),
        "ram_gib": _ram_gib(),
        "kernel": platform.release(),
        "python": sys.version.split()[0],
        "nats_server": _run([str(find_binary()), "--version"]),
        "postgres": _run([str(postgres_bin_dir() / "postgres"), "--version"]),
        "git_commit": commit + (" (with uncommitted changes)" if dirty else ""),
        "libraries": {name: _version(name) for name in LIBRARIES},
    }


def _version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "not installed"


def write_json(out_dir: Path, stamp: str, record: dict[str, Any]) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{stamp}.json"
    path.write_bytes(orjson.dumps(record, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS))
    return path


def _verdict(met: bool | None) -> str:
    return "" if met is None else ("met" if met else "**missed**")


def markdown(record: dict[str, Any]) -> str:
    facts = record["machine"]
    lines = [
        f"### {record['started_at']} — scale {record['scale']}",
        "",
        f"{facts['cpu_model']}, {facts['cores']} cores, {facts['ram_gib']} GiB RAM; "
        f"Python {facts['python']}; {facts['nats_server']}; {facts['postgres']}; "
        f"commit {facts['git_commit']}",
        "",
        _contention(record),
        "",
        "| phase | figure | value | target | |",
        "|---|---|---:|---|---|",
    ]
    for phase, result in record["phases"].items():
        if "error" in result:
            lines.append(f"| {phase} | **failed** | | | {result['error'][:200]} |")
            continue
        for item in result.get("summary", []):
            value = "n/a" if item["value"] is None else f"{item['value']:,} {item['unit']}"
            lines.append(
                f"| {phase} | {item['metric']} | {value} | {item['target'] or ''} "
                f"| {_verdict(item['met'])} |"
            )
    plan = _slowest_plan(record)
    if plan:
        lines += ["", f"Slowest query shape: `{plan[0]}`", "", "```", *plan[1], "```"]
    return "\n".join(lines)


def _cpu_readings(node: Any) -> list[dict[str, float]]:
    if isinstance(node, dict):
        found = [node] if OTHERS in node else []
        for value in node.values():
            found += _cpu_readings(value)
        return found
    if isinstance(node, list):
        return [r for value in node for r in _cpu_readings(value)]
    return []


def _contention(record: dict[str, Any]) -> str:
    """Whether anything else competed for the CPU while figures were taken."""
    others = [r[OTHERS] for r in _cpu_readings(record["phases"])]
    worst = max(others, default=0.0)
    verdict = "clean" if worst < 15 else "**contended: compare with care**"
    return (
        f"Other processes on the machine during the measured windows: up to {worst:.0f}% "
        f"of a core ({verdict})."
    )


def _slowest_plan(record: dict[str, Any]) -> tuple[str, list[str]] | None:
    query = record["phases"].get("query", {})
    name = query.get("slowest_shape")
    if not name:
        return None
    text: list[str] = []
    for statement in query["shapes"][name]["plan"]:
        text += [statement["sql"], *statement["plan"], ""]
    return name, text
