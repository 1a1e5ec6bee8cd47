"""docs/lifecycle.md is generated from the state-machine table and must not go stale."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


def _tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "lifecycle_diagram", ROOT / "tools/lifecycle_diagram.py"
    )
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_lifecycle_doc_is_current() -> None:
    tool = _tool()
    assert (ROOT / "docs/lifecycle.md").read_text() == tool.render(), "run `make docs` and commit"


def test_every_transition_appears_in_the_diagram() -> None:
    from lodestream.schemas.states import TRANSITIONS  # noqa: PLC0415

    text = _tool().render()
    for event in TRANSITIONS:
        assert f": {event}" in text
