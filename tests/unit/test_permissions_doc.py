"""docs/permissions.md is generated from the writers table and must not go stale."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


def _tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "permissions_doc", ROOT / "tools/permissions_doc.py"
    )
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_permissions_doc_is_current() -> None:
    text = (ROOT / "docs/permissions.md").read_text()
    assert text == _tool().render(), "run `make docs` and commit"


def test_every_event_type_has_a_row() -> None:
    from lodestream.schemas.codec import EVENT_CLASSES  # noqa: PLC0415

    text = _tool().render()
    for event_type in EVENT_CLASSES:
        assert f"| `{event_type}` |" in text
