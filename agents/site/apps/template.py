"""The ``{{ param }}`` syntax of command templates, and where a placeholder may stand.

A value is rendered as one shell word by ``shlex.quote``. That is only safe
where the shell reads a word: inside '…' or "…" the quotes of the rendered
value would close the author's quotes, after ``#`` a newline in the value
would end the comment, and a here-document body is not read as words at
all. So a placeholder in any of those places is refused when the class is
defined, not discovered when a hostile value arrives.
"""

from __future__ import annotations

import json
import keyword
import re
import shlex
from collections.abc import Mapping
from typing import Final

PLACEHOLDER: Final = re.compile(r"\{\{(.*?)\}\}", re.DOTALL)
NAME: Final = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
_HEREDOC: Final = re.compile(r"<<(?!<)")


def is_parameter_name(name: str) -> bool:
    return bool(NAME.match(name)) and not keyword.iskeyword(name)


def placeholders(template: str) -> tuple[str, ...]:
    """Names used in ``template`` in order of first use; ``ValueError`` says what is wrong."""
    names: list[str] = []
    for match in PLACEHOLDER.finditer(template):
        name = match.group(1).strip()
        if not is_parameter_name(name):
            raise ValueError(f"placeholder {match.group(0)!r} must be a Python identifier")
        if name not in names:
            names.append(name)
    leftover = PLACEHOLDER.sub("", template)
    if "{{" in leftover:
        raise ValueError("'{{' without a closing '}}'")
    _check_contexts(template)
    return tuple(names)


def _check_contexts(template: str) -> None:
    spans = {m.start(): m for m in PLACEHOLDER.finditer(template)}
    state, heredoc, i = "", False, 0
    while i < len(template):
        match = spans.get(i)
        if match is None:
            if state == "" and _HEREDOC.match(template, i) and template[i - 1 : i] != "<":
                heredoc = True
            state, i = _advance(template, i, state)
            continue
        where = _refused_context(state, heredoc, template[i - 1 : i])
        if where:
            raise ValueError(
                f"placeholder {match.group(0)!r} is {where}; values are shell-quoted "
                "for you, so a placeholder must stand where the shell reads a word"
            )
        i = match.end()


def _advance(template: str, i: int, state: str) -> tuple[str, int]:
    """The quoting state after the character at ``i``, and the index of the next character.

    States: "" (reading words), "'" and '"' and "$'" (inside quotes), "#" (a comment).
    """
    char = template[i]
    if char == "\\" and state in ("", '"', "$'"):
        # The escaped character is skipped, unless it opens a placeholder: that is refused.
        return state, i + 1 if template.startswith("{{", i + 1) else i + 2
    if state == "":
        if template.startswith("$'", i):
            return "$'", i + 2
        if char in "'\"" or (char == "#" and (i == 0 or template[i - 1].isspace())):
            return char, i + 1
        return "", i + 1
    closing = {"'": "'", '"': '"', "$'": "'", "#": "\n"}[state]
    return ("" if char == closing else state), i + 1


def _refused_context(state: str, heredoc: bool, before: str) -> str:
    if heredoc:
        return "after a here-document operator (<<)"
    if before in ("\\", "$"):
        return f"right after {before!r}, which would change how its quotes are read"
    return {
        "'": "inside a '...' quoted string",
        '"': 'inside a "..." quoted string',
        "$'": "inside a $'...' quoted string",
        "#": "inside a comment",
    }.get(state, "")


def substitute(template: str, values: Mapping[str, object]) -> str:
    """Replace each placeholder by its value as one shell word (``shlex.quote``)."""
    return PLACEHOLDER.sub(lambda m: shlex.quote(word(values[m.group(1).strip()])), template)


def word(value: object) -> str:
    """A parameter's value as the text of its word: a string as itself, any other JSON value
    (number, bool, null, list, object) as its JSON text."""
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, allow_nan=False)
