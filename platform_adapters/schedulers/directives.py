"""The one place a batch request's values become scheduler syntax: flags, argv, directive lines.

A backend spells each thing it asks for as a :class:`Flag`: the words of one option as the
scheduler must read them (``--comment=x``; ``-l walltime=01:00:00``), and the request's name for
it, for errors. Its command line (:func:`argv_words`) and its script's directive block
(:func:`directive_block`) are both rendered from the same flags, and every rendered word is
checked first against its family's :class:`Syntax`:

* the first word is an option: ``-`` or ``--``, a name, and with ``=`` a value;
* every value (after ``=``, or a word of its own) holds only letters, digits and the
  family's few punctuation characters, and a value word never starts with ``-``.

Schedulers split a directive line into words on whitespace, honouring quotes and backslashes,
and end it at a ``#`` (sbatch's ``_get_argument``; qsub, bsub, Cobalt's qsub and ``flux batch``
alike), and the script is a bash script in which a line break would end the comment a
directive is. None of those characters can pass, so a line's words are its words, however the
scheduler reads it, and no value can add an option, a directive or a command. Slurm also reads
``hetjob`` and ``packjob`` anywhere on an ``#SBATCH`` line as the start of another component,
and PBS splits a ``-l`` value at commas into further resources; those are refused too.

What cannot be rendered is :class:`InvalidSubmission` naming the field; nothing is run then.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Final

from lodestream.platform_adapters.errors import InvalidSubmission
from lodestream.schemas.events.batch import SCHEDULER_VALUE_CHARS, scheduler_value_problem

_OPTION: Final = re.compile(r"-{1,2}[A-Za-z][A-Za-z0-9_-]*")


@dataclass(frozen=True, slots=True)
class Syntax:
    """How one scheduler family reads its directives: the line's prefix, what a value may hold
    beyond the common characters, and words it gives a meaning of their own."""

    family: str
    prefix: str  # "#SBATCH"
    extra_chars: str = ""  # characters the adapter itself writes: LSF's span[ptile=N]
    forbidden_chars: str = ""  # PBS: ',' splits a resource list
    forbidden_words: tuple[str, ...] = ()  # Slurm: hetjob, packjob (any case, anywhere)

    def value_problem(self, value: str) -> str | None:
        """Why ``value`` cannot be one value of this family's directives; None if it can."""
        if not value:
            return "is empty"
        if value.startswith("-"):
            return "starts with '-', so it could be read as an option"
        allowed = SCHEDULER_VALUE_CHARS + re.escape(self.extra_chars) + "-"
        bad = next((c for c in value if not re.fullmatch(f"[{allowed}]", c)), None)
        bad = bad or next((c for c in value if c in self.forbidden_chars), None)
        if bad is not None:
            return f"{bad!r} is not allowed on a {self.prefix} line"
        lowered = value.lower()
        word = next((w for w in self.forbidden_words if w in lowered), None)
        if word is not None:
            return f"{self.family} reads {word!r} on a {self.prefix} line as a directive"
        return None


@dataclass(frozen=True, slots=True)
class Flag:
    """One option as the words the scheduler reads: ``("--comment=x",)``, ``("-q", "debug")``."""

    field: str  # what the request calls it: "queue", "option comment"
    words: tuple[str, ...]


def attached(field: str, option: str, value: str | None = None) -> Flag:
    """``--name=value`` as one word; ``--name`` alone when ``value`` is None or ''."""
    return Flag(field, (f"{option}={value}" if value else option,))


def separate(field: str, option: str, value: str | None = None) -> Flag:
    """``-name value`` as two words; ``-name`` alone when ``value`` is None or ''."""
    return Flag(field, (option, value) if value else (option,))


def check(flags: Iterable[Flag], syntax: Syntax) -> list[Flag]:
    """``flags`` if every word reads as meant on ``syntax``'s lines; else InvalidSubmission."""
    flags = list(flags)
    for flag in flags:
        option, *values = flag.words
        name, sep, attached_value = option.partition("=")
        if not _OPTION.fullmatch(name):
            raise InvalidSubmission(f"{flag.field}: {name!r} is not an option")
        for value in ([attached_value] if sep else []) + values:
            problem = syntax.value_problem(value)
            if problem is not None:
                raise InvalidSubmission(
                    f"{flag.field}: value {value!r} cannot be passed to {syntax.family} as "
                    f"data: {problem}"
                )
    return flags


def argv_words(flags: Iterable[Flag], syntax: Syntax) -> list[str]:
    """The flags' words for the submit command's argv, checked."""
    return [word for flag in check(flags, syntax) for word in flag.words]


def directive_block(flags: Iterable[Flag], syntax: Syntax) -> str:
    """One ``<prefix> <words>`` line per flag, checked; each line ends in a newline."""
    return "".join(f"{syntax.prefix} {' '.join(flag.words)}\n" for flag in check(flags, syntax))


def request_problem(fields: Sequence[tuple[str, str]]) -> str | None:
    """The first ``(field, value)`` that cannot reach any scheduler as data, explained."""
    for field, value in fields:
        problem = scheduler_value_problem(value)
        if problem is not None:
            return f"{field} {value!r} cannot be passed to a scheduler as data: {problem}"
    return None
