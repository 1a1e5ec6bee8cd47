"""What every figure shares: the word for a figure that cannot be made."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Unavailable:
    """A figure the selection cannot give, and why (shown where the figure would be)."""

    reason: str
