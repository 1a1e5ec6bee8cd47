"""Write JSON Schema for every event type and resource model into ``schemas/json/``.

The files are generated, never edited by hand: change the pydantic models and
run ``make schemas``. ``--check`` writes nothing; it lists stale, missing and
extra files and exits 1 if there are any (``tests/unit/test_json_schema_export.py``
does the same comparison).

Layout::

    schemas/json/index.json                      what is below, by event type and model name
    schemas/json/events/<type>.v<version>.json   one file per event type, current version
    schemas/json/resources/<Model>.json          the resource models
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Final

from pydantic import BaseModel

from lodestream.schemas.codec import CURRENT_VERSION, EVENT_CLASSES
from lodestream.schemas.events.session import Heartbeat
from lodestream.schemas.resources import App, BatchJob, JobSpec, Session, Site, TransferItem

ROOT: Final = Path(__file__).resolve().parent.parent
OUTPUT_DIR: Final = ROOT / "schemas" / "json"
JSON_SCHEMA_DIALECT: Final = "https://json-schema.org/draft/2020-12/schema"

RESOURCE_MODELS: Final[tuple[type[BaseModel], ...]] = (
    JobSpec,
    Site,
    App,
    BatchJob,
    Session,
    TransferItem,
    Heartbeat,
)


def event_path(event_type: str, version: int) -> str:
    return f"events/{event_type}.v{version}.json"


def resource_path(model: type[BaseModel]) -> str:
    return f"resources/{model.__name__}.json"


def dump(document: Any) -> str:
    """Deterministic JSON text: sorted keys, 2-space indent, trailing newline."""
    return json.dumps(document, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def _schema(model: type[BaseModel], relative_path: str) -> dict[str, Any]:
    schema = model.model_json_schema()
    schema["$schema"] = JSON_SCHEMA_DIALECT
    schema["$id"] = relative_path
    return schema


def _event_schema(model: type[BaseModel], relative_path: str) -> dict[str, Any]:
    schema = _schema(model, relative_path)
    # ``type`` and ``v`` have defaults in Python, but every document on the wire carries
    # them and the codec refuses one without them.
    required: list[str] = schema.setdefault("required", [])
    schema["required"] = ["type", "v", *(name for name in required if name not in ("type", "v"))]
    return schema


def render_all() -> dict[str, str]:
    """Every generated file: path relative to ``schemas/json/`` → file content."""
    files: dict[str, str] = {}
    events: dict[str, dict[str, Any]] = {}
    for event_type in sorted(EVENT_CLASSES):
        version = CURRENT_VERSION[event_type]
        path = event_path(event_type, version)
        files[path] = dump(_event_schema(EVENT_CLASSES[event_type], path))
        events[event_type] = {"v": version, "schema": path}
    resources: dict[str, str] = {}
    for model in RESOURCE_MODELS:
        path = resource_path(model)
        files[path] = dump(_schema(model, path))
        resources[model.__name__] = path
    files["index.json"] = dump({"events": events, "resources": resources})
    return files


def on_disk(out_dir: Path) -> dict[str, str]:
    """The generated-looking files currently under ``out_dir``."""
    if not out_dir.is_dir():
        return {}
    return {
        path.relative_to(out_dir).as_posix(): path.read_text(encoding="utf-8")
        for path in sorted(out_dir.rglob("*.json"))
    }


def drift(rendered: dict[str, str], existing: dict[str, str]) -> list[str]:
    """Human-readable differences between what the models say and what is on disk."""
    problems = [f"missing: {p}" for p in sorted(rendered.keys() - existing.keys())]
    problems += [
        f"stale:   {p}"
        for p in sorted(rendered.keys() & existing.keys())
        if rendered[p] != existing[p]
    ]
    problems += [f"extra:   {p}" for p in sorted(existing.keys() - rendered.keys())]
    return problems


def write(rendered: dict[str, str], out_dir: Path) -> list[str]:
    """Bring ``out_dir`` in line with ``rendered``; return what changed."""
    existing = on_disk(out_dir)
    changes = drift(rendered, existing)
    for relative, content in rendered.items():
        if existing.get(relative) != content:
            target = out_dir / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(content, encoding="utf-8")
    for relative in existing.keys() - rendered.keys():
        # A schema for an event type or model that no longer exists would mislead readers.
        (out_dir / relative).unlink()
    return changes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--check", action="store_true", help="write nothing; exit 1 if the files are out of date"
    )
    parser.add_argument("--out", type=Path, default=OUTPUT_DIR, help="output directory")
    args = parser.parse_args(argv)
    out_dir: Path = args.out
    rendered = render_all()

    if args.check:
        problems = drift(rendered, on_disk(out_dir))
        for problem in problems:
            print(problem)
        if problems:
            print(f"{out_dir} is out of date: run `make schemas`", file=sys.stderr)
            return 1
        print(f"{out_dir}: {len(rendered)} files up to date")
        return 0

    changes = write(rendered, out_dir)
    for change in changes:
        print(change)
    print(f"{out_dir}: {len(rendered)} files, {len(changes)} changed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
