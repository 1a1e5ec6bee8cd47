"""How each scheduler reads its directive lines, modelled for tests: the words of a line.

sbatch's ``_get_argument`` (src/sbatch/opt.c) reads the rest of an ``#SBATCH`` line word by
word: whitespace separates words, ``'`` and ``"`` quote (an unmatched quote is fatal), a
backslash escapes the next character, and an unquoted ``#`` ends the line. qsub (PBS), bsub
(LSF) and Cobalt's qsub document the same command-line syntax for their directives, so they
share this reader; ``flux batch`` splits ``#flux:`` lines with Python's ``shlex`` (comments on).
Family quirks are read on top: Slurm gives ``hetjob``/``packjob`` on a line a meaning of its
own, and PBS splits an ``-l`` value into resources at commas.
"""

from __future__ import annotations

import shlex


class UnreadableLine(ValueError):
    """The scheduler would refuse the line outright (an unmatched quote)."""


def quoted_words(text: str) -> list[str]:
    """The words of ``text`` as sbatch's ``_get_argument`` reads them."""
    words: list[str] = []
    i, n = 0, len(text)
    while True:
        while i < n and text[i].isspace():
            i += 1
        if i >= n:
            return words
        word: list[str] = []
        quote = ""
        escaped = False
        while i < n and (quote or not text[i].isspace()) and text[i] != "\n":
            char = text[i]
            i += 1
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
                continue
            elif quote:
                if char == quote:
                    quote = ""
                    continue
            elif char in "'\"":
                quote = char
                continue
            elif char == "#":  # what was read of the word so far still counts (sbatch)
                if word:
                    words.append("".join(word))
                return words
            word.append(char)
        if quote:
            raise UnreadableLine(f"unmatched {quote} in {text!r}")
        words.append("".join(word))


def flux_words(text: str) -> list[str]:
    """The words of a ``#flux:`` line's rest, as ``shlex`` with comments splits them."""
    try:
        return shlex.split(text, comments=True)
    except ValueError as exc:
        raise UnreadableLine(str(exc)) from exc


def directive_lines(script: str, prefix: str) -> list[str]:
    """The rest of each line of ``script`` that starts with ``prefix`` (the directive block)."""
    return [line[len(prefix) :] for line in script.split("\n") if line.startswith(prefix)]


def slurm_separators(words: list[str]) -> list[str]:
    """The words sbatch would take for a heterogeneous job's separator."""
    return [w for w in words if "hetjob" in w.lower() or "packjob" in w.lower()]


def pbs_resources(words: list[str]) -> list[str]:
    """The resources a ``#PBS -l`` line asks for: its value split at commas."""
    return words[1].split(",") if len(words) == 2 and words[0] == "-l" else []
