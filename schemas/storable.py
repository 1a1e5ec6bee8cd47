"""What Postgres and the codec keep as they were given: the check on free-form JSON trees.

A job's ``data`` and ``parameters``, a run's result: no NUL in a key or string (text and
jsonb refuse it), integers within signed 64 bits, finite floats (the codec would read anything
else back as a different value). Free of pydantic: pyrun imports it in every Python job.
"""

from __future__ import annotations

import math
from typing import Any, Final

INT64_MIN: Final = -(2**63)  # Postgres bigint, and what the codec reads back as an int
INT64_MAX: Final = 2**63 - 1

_Problem = tuple[list[str | int], str]
_NUL: Final = "contains NUL (\\u0000), which Postgres cannot store"
_NUL_KEY: Final = "is a key that " + _NUL
_BIG_INT: Final = f"is an integer outside [{INT64_MIN}, {INT64_MAX}] (signed 64-bit)"
_NON_FINITE: Final = "is not a finite number (NaN and infinities have no JSON form)"


def check_storable(tree: dict[Any, Any] | list[Any] | tuple[Any, ...], name: str) -> None:
    """Raise ValueError naming where in ``tree`` (called ``name``) is a value the read models
    cannot keep: NUL in a key or string, an integer beyond signed 64 bits, NaN or infinity.

    For any free-form JSON a model carries (``JobSpec.data``, a run's result, ...).
    """
    problem = _unstorable(tree)
    if problem is not None:
        path, reason = problem
        raise ValueError(name + "".join(f"[{step!r}]" for step in reversed(path)) + f" {reason}")


def _unstorable(tree: dict[Any, Any] | list[Any] | tuple[Any, ...]) -> _Problem | None:
    """Where in a JSON tree is a value the read models cannot keep, and why; None if nowhere.

    Leaves are judged in their parent's loop (a call per leaf would double the cost), and
    the path is only built on the way out of a failure, innermost step first.
    """
    items = tree.items() if isinstance(tree, dict) else enumerate(tree)
    for step, value in items:
        if type(step) is str and "\x00" in step:
            return [step], _NUL_KEY
        kind = type(value)
        if kind is str:
            reason = _NUL if "\x00" in value else None
        elif kind is int:
            reason = None if INT64_MIN <= value <= INT64_MAX else _BIG_INT
        elif kind is float:
            reason = None if math.isfinite(value) else _NON_FINITE
        elif isinstance(value, dict | list | tuple):
            problem = _unstorable(value)
            if problem is not None:
                problem[0].append(step)
                return problem
            reason = None
        else:  # bool, None; anything else is for the serialiser to judge
            reason = None
        if reason is not None:
            return [step], reason
    return None
