"""Recognising a command line that means the same with or without a shell.

Starting ``bash -c`` costs about a millisecond of CPU per task before the app
runs; for short tasks that is most of the pilot's work. A command line made
only of plain words and single-quoted strings (what ``shlex.quote`` writes
for parameter values) has no expansion, redirection, globbing or operator in
it, so executing its words directly does what bash would do. Anything else,
including a backslash or a double quote, is left to bash: being conservative
costs a millisecond, being wrong would run a different command.
"""

from __future__ import annotations

import string
from typing import Final

# Characters bash takes literally outside quotes (no expansion, globbing, operator or comment).
_PLAIN: Final = frozenset(string.ascii_letters + string.digits + "_@%+=:,./-")
_BLANKS: Final = frozenset(" \t")
# A bare first word that bash resolves before PATH: its keywords and builtins. Several of these
# also exist as files (echo, test, time, kill) and behave differently there.
_BASH_OWN: Final = frozenset(
    (  # noqa: SIM905 - a word list reads better as words
        "! [[ ]] { } case coproc do done elif else esac fi for function if in select then time "
        "until while . : [ alias bg bind break builtin caller cd command compgen complete compopt "
        "continue declare dirs disown echo enable eval exec exit export false fc fg getopts hash "
        "help history jobs kill let local logout mapfile popd printf pushd pwd read readarray "
        "readonly return set shift shopt source suspend test times trap true type typeset ulimit "
        "umask unalias unset wait"
    ).split()
)


def simple_argv(command: str) -> list[str] | None:
    """The words of ``command`` if it is one simple command of literal words, else None.

    Refused as well: a first word containing ``=`` (an assignment to bash, ``A=1 prog``), a bare
    first word that is a bash keyword or builtin, and an empty command line.
    """
    words: list[str] = []
    word: list[str] = []
    in_word = False  # a word may be empty: '' is one argument
    quoted = False
    for char in command:
        if quoted:
            if char == "'":
                quoted = False
            else:
                word.append(char)
        elif char == "'":
            quoted, in_word = True, True
        elif char in _BLANKS:
            if in_word:
                words.append("".join(word))
                word, in_word = [], False
        elif char in _PLAIN:
            word.append(char)
            in_word = True
        else:
            return None
    if quoted:
        return None  # unterminated quote: bash reports it, we do not guess
    if in_word:
        words.append("".join(word))
    if not words or not words[0] or "=" in words[0] or words[0] in _BASH_OWN:
        return None
    return words
