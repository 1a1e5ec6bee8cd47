"""The headline figures of a phase: what the markdown table shows and the JSON keeps."""

from __future__ import annotations

from typing import Any


def row(
    metric: str,
    value: float | None,
    unit: str,
    *,
    at_least: float | None = None,
    at_most: float | None = None,
    digits: int = 0,
) -> dict[str, Any]:
    """One figure; ``at_least``/``at_most`` is the issue's target, if it sets one."""
    target: str | None = None
    met: bool | None = None
    if at_least is not None:
        target = f"≥ {at_least:,.0f} {unit}"
        met = value is not None and value >= at_least
    elif at_most is not None:
        target = f"≤ {at_most:g} {unit}"
        met = value is not None and value <= at_most
    shown = None if value is None else round(value, digits) if digits else round(value)
    return {"metric": metric, "value": shown, "unit": unit, "target": target, "met": met}
