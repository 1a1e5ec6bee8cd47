"""What `lode job submit`'s flags become in a job: typed parameters, transfers, launch options.

A parameter is given as text (``-p steps=5``); it reaches the job as the type the app declares
(``GET /apps``): text for ``str``, JSON for the others (``int``, ``float``, ``bool``, ``list``,
``dict``), and for ``any`` (a Python app's default) JSON where the text is JSON, text where it
is not, so ``-p name=007`` stays the string ``"007"``. The API checks the result as it checks
a job file's.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any, Final

import typer

from lodestream.schemas.params import default_type

_LOCATION: Final = re.compile(r"([A-Za-z_][A-Za-z0-9_.-]{0,63}):(.+)")


def typed_parameters(
    raw: Mapping[str, str], app: Mapping[str, Any] | None, app_name: str
) -> dict[str, Any]:
    """``raw`` text values as the types ``app`` (its ``GET /apps`` entry) declares."""
    declared: Mapping[str, Any] = (app or {}).get("parameters") or {}
    fallback = default_type(bool((app or {}).get("python")))
    values: dict[str, Any] = {}
    for name, text in raw.items():
        kind = (declared.get(name) or {}).get("type") or fallback
        if kind == "str":
            values[name] = text
            continue
        try:
            values[name] = json.loads(text)
        except json.JSONDecodeError:
            if kind != "any":
                raise typer.BadParameter(
                    f"--param {name}={text}: app {app_name!r} declares {name} as {kind}, "
                    f'written as JSON (5, 2.5, true, [1, 2], {{"k": 1}})'
                ) from None
            values[name] = text
    return values


def transfers(items: Sequence[str]) -> dict[str, dict[str, str]]:
    """``SLOT=LOCATION:PATH`` items as the job's ``transfers``."""
    specs: dict[str, dict[str, str]] = {}
    for item in items:
        slot, sep, rest = item.partition("=")
        match = _LOCATION.fullmatch(rest)
        if not sep or not slot or match is None:
            raise typer.BadParameter(
                f"--transfer must look like SLOT=LOCATION:PATH (raw=aps:/data/scan1.h5), "
                f"got {item!r}"
            )
        if slot in specs:
            raise typer.BadParameter(f"--transfer: slot {slot!r} is given twice")
        specs[slot] = {"location": match.group(1), "path": match.group(2)}
    return specs


def launch_params(items: Sequence[str]) -> dict[str, str]:
    """``--cpu-bind=cores`` or ``--overlap`` (a switch) items as the job's ``launch_params``."""
    params: dict[str, str] = {}
    for item in items:
        key, _, value = item.partition("=")
        if not key.startswith("-"):
            raise typer.BadParameter(
                f"--launch-param is the launcher's option as written (--cpu-bind=cores, "
                f"--overlap), got {item!r}"
            )
        params[key] = value
    return params
