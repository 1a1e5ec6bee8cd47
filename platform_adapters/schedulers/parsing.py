"""Helpers every ``parse_*`` function uses: state tables, skipped lines, JSON that must parse."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any

from lodestream.platform_adapters.errors import UnparseableOutput
from lodestream.platform_adapters.schedulers.runner import CommandResult
from lodestream.schemas.resources import SchedulerState

logger = logging.getLogger("lodestream.platform_adapters.schedulers")

_QUOTE_MAX = 200


def map_state(table: Mapping[str, SchedulerState], native: str, scheduler: str) -> SchedulerState:
    """``table[native]``; ``UNKNOWN`` with a warning for a state the table has never seen."""
    try:
        return table[native]
    except KeyError:
        logger.warning("%s: unknown native job state %r, reported as unknown", scheduler, native)
        return SchedulerState.UNKNOWN


def skip(scheduler: str, what: str, line: object, reason: object) -> None:
    """Log a line (or record) of output that could not be read; the rest is still used."""
    logger.warning(
        "%s: skipping unparseable %s %s: %s", scheduler, what, repr(line)[:_QUOTE_MAX], reason
    )


def load_json(result: CommandResult, scheduler: str) -> Any:
    """The command's stdout as JSON; ``UnparseableOutput`` quoting its start if it is not."""
    try:
        return json.loads(result.stdout)
    except ValueError as exc:
        raise UnparseableOutput(
            f"{scheduler}: {result.argv[0]} printed something that is not JSON ({exc}): "
            f"{result.stdout[:_QUOTE_MAX]!r}"
        ) from exc


def expect_object(value: Any, what: str, scheduler: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise UnparseableOutput(
            f"{scheduler}: expected a JSON object for {what}, got {value!r:.80}"
        )
    return value
