"""The committed JSON Schema under ``schemas/json/`` matches the pydantic models."""

from __future__ import annotations

import importlib.util
import json
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

from lodestream.schemas.codec import CURRENT_VERSION

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tools" / "export_json_schema.py"
OUTPUT_DIR = ROOT / "schemas" / "json"


@pytest.fixture(scope="module")
def exporter() -> ModuleType:
    # tools/ is a folder of scripts, not a package: load the script by path.
    spec = importlib.util.spec_from_file_location("export_json_schema", SCRIPT)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(spec.name, module)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def rendered(exporter: ModuleType) -> dict[str, str]:
    render_all: Callable[[], dict[str, str]] = exporter.render_all
    return render_all()


def _on_disk() -> dict[str, str]:
    return {
        path.relative_to(OUTPUT_DIR).as_posix(): path.read_text(encoding="utf-8")
        for path in OUTPUT_DIR.rglob("*.json")
    }


def test_committed_schemas_are_up_to_date(rendered: dict[str, str]) -> None:
    existing = _on_disk()
    problems = [f"missing {p}" for p in sorted(rendered.keys() - existing.keys())]
    shared = sorted(rendered.keys() & existing.keys())
    problems += [f"stale {p}" for p in shared if rendered[p] != existing[p]]
    problems += [f"extra {p}" for p in sorted(existing.keys() - rendered.keys())]
    assert not problems, (
        "schemas/json does not match the pydantic models; run `make schemas` and commit "
        "the result: " + ", ".join(problems)
    )


def test_every_event_type_and_resource_is_exported(rendered: dict[str, str]) -> None:
    index = json.loads(rendered["index.json"])
    assert {name: entry["v"] for name, entry in index["events"].items()} == CURRENT_VERSION
    assert set(index["resources"]) == {
        "JobSpec",
        "Site",
        "App",
        "BatchJob",
        "Session",
        "TransferItem",
        "Heartbeat",
    }
    listed = {entry["schema"] for entry in index["events"].values()}
    listed |= set(index["resources"].values())
    assert listed | {"index.json"} == set(rendered)


def test_output_is_deterministic_json(rendered: dict[str, str], exporter: ModuleType) -> None:
    render_all: Callable[[], dict[str, str]] = exporter.render_all
    assert render_all() == rendered
    for path, content in rendered.items():
        assert content.endswith("}\n"), path
        assert (
            content
            == json.dumps(json.loads(content), indent=2, sort_keys=True, ensure_ascii=False) + "\n"
        ), path


def test_event_schema_requires_type_and_version(rendered: dict[str, str]) -> None:
    schema = json.loads(rendered["events/job.created.v2.json"])
    assert schema["properties"]["type"]["const"] == "job.created"
    assert schema["properties"]["v"]["const"] == 2
    assert {"type", "v", "id", "site", "aggregate_id", "data"} <= set(schema["required"])
    assert schema["additionalProperties"] is False


def test_check_mode_reports_drift_without_writing(
    exporter: ModuleType,
    rendered: dict[str, str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    main: Callable[[list[str]], int] = exporter.main
    assert main(["--out", str(tmp_path)]) == 0
    assert main(["--check", "--out", str(tmp_path)]) == 0

    (tmp_path / "index.json").write_text("{}\n", encoding="utf-8")
    (tmp_path / "resources" / "Site.json").unlink()
    (tmp_path / "events" / "job.gone.v1.json").write_text("{}\n", encoding="utf-8")
    capsys.readouterr()
    assert main(["--check", "--out", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "stale:   index.json" in out
    assert "missing: resources/Site.json" in out
    assert "extra:   events/job.gone.v1.json" in out
    assert (tmp_path / "index.json").read_text(encoding="utf-8") == "{}\n"  # nothing written

    assert main(["--out", str(tmp_path)]) == 0  # a write brings it back, removing the extra file
    assert not (tmp_path / "events" / "job.gone.v1.json").exists()
    assert main(["--check", "--out", str(tmp_path)]) == 0
