"""A pilot's tag filter: ``lode launcher --tag key:value`` (repeatable), as Balsam's ``--tag``.

A pilot with a filter runs only jobs whose tags include every one of its pairs; the others it
hands back for another pilot to take (:func:`lodestream.agents.launcher.decide.outside_filter`).
A pilot without one takes every job, as before. A batch job's ``filter_tags``
(``lode queue submit --tag``) reach its pilot as these options, through the site's job
template (``{{ tag_options }}``, :mod:`lodestream.schemas.tagfilter`).

A pair must be one a job could carry: its key and value are checked against the rules of job
tags (:data:`~lodestream.schemas.resources.TagKey`, ``TagValue``), so a typo is refused before
the pilot connects instead of filtering out every job.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Final

from pydantic import TypeAdapter, ValidationError

from lodestream.agents.launcher.errors import TagFilterError
from lodestream.schemas.resources import TAG_KEY_PATTERN, TAG_VALUE_MAX_LENGTH, TagKey, TagValue
from lodestream.schemas.tagfilter import TAG_OPTION

_KEY: Final[TypeAdapter[str]] = TypeAdapter(TagKey)
_VALUE: Final[TypeAdapter[str]] = TypeAdapter(TagValue)


def parse_tag_filter(pairs: Iterable[str]) -> dict[str, str]:
    """``["key:value", ...]`` as the filter; :class:`TagFilterError` naming a bad pair.

    ``key:value`` is the one tag syntax of every surface; the value is everything after the
    first ``:`` (it may hold ``:`` itself). ``key=value`` is refused with its right spelling.
    A key given twice is refused: no job carries two values of one tag, so the filter would
    match none.
    """
    wanted: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition(":")
        if not sep or not key or "=" in key:
            eq_key, eq, eq_value = pair.partition("=")
            hint = f"; write {TAG_OPTION} {eq_key}:{eq_value}" if eq and eq_key else ""
            raise TagFilterError(f"{TAG_OPTION} must look like key:value, got {pair!r}{hint}")
        try:
            _KEY.validate_python(key)
        except ValidationError:
            raise TagFilterError(
                f"{TAG_OPTION} {pair!r}: a tag key is 1 to 64 letters, digits or _.:- "
                f"({TAG_KEY_PATTERN})"
            ) from None
        try:
            _VALUE.validate_python(value)
        except ValidationError:
            raise TagFilterError(
                f"{TAG_OPTION} {key}:...: a tag value is at most {TAG_VALUE_MAX_LENGTH} "
                "characters, none of them NUL"
            ) from None
        if key in wanted:
            raise TagFilterError(
                f"{TAG_OPTION} {key} is given twice ({key}:{wanted[key]}, {pair}): "
                "no job carries two values of one tag"
            )
        wanted[key] = value
    return wanted


def describe(filter_tags: Mapping[str, str]) -> str:
    """The filter for a log line: ``beam=A, run=7``, or ``none`` (every job)."""
    return ", ".join(f"{k}={v}" for k, v in filter_tags.items()) or "none"
