"""Hostlists and id ranges as schedulers write them. Pure functions, no I/O.

* ``expand_hostlist("nid[001-003,007],login1")`` — Slurm's (and Flux's, RFC 29) syntax: a
  comma-separated list whose items may hold bracketed ranges. A range keeps the zero padding of
  its lower bound (``[08-10]`` → ``08 09 10``); several brackets in one item expand as a
  cartesian product, the rightmost varying fastest (``x[1-2]y[3-4]`` → ``x1y3 x1y4 x2y3
  x2y4``), which is the order ``scontrol show hostnames`` prints.
* ``expand_ids("1-3,7")`` — an id set (Cobalt's partition names, Flux's RFC 22 idsets).
* ``format_ids([0, 1, 2, 5])`` → ``"0-2,5"`` — the inverse, for launcher cpu lists.
* ``expand_counts("2(x3),1")`` — Slurm's ``SLURM_JOB_CPUS_PER_NODE`` run-length encoding.

A hostlist that would expand past ``MAX_HOSTS`` names is refused before anything is built: one
typo (``n[0-999999999]``) must not exhaust the pilot's memory.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Iterable

from lodestream.platform_adapters.errors import InvalidHostlist

MAX_HOSTS = 1_000_000

_RANGE = re.compile(r"(\d+)(?:-(\d+))?")
_COUNT = re.compile(r"(\d+)(?:\(x(\d+)\))?")


def expand_hostlist(text: str, *, max_hosts: int = MAX_HOSTS) -> list[str]:
    """Every hostname in ``text``, in order; duplicates are kept, as Slurm keeps them.

    ``(null)`` (what squeue prints for a pending job's nodes) and ``None`` are empty lists.
    """
    text = text.strip()
    if text in {"", "(null)", "None"}:
        return []
    items = _split_top_level(text)
    hosts: list[str] = []
    for item in items:
        choices = _item_choices(item, text)
        count = math.prod(len(c) for c in choices)
        if len(hosts) + count > max_hosts:
            raise InvalidHostlist(f"hostlist {_short(text)} names more than {max_hosts} hosts")
        hosts.extend("".join(parts) for parts in itertools.product(*choices))
    return hosts


def expand_ids(text: str, *, max_ids: int = MAX_HOSTS) -> list[int]:
    """The ids of ``"1-3,7"`` (optionally bracketed, ``"[1-3,7]"``) in order."""
    body = text.strip()
    if body.startswith("[") and body.endswith("]"):
        body = body[1:-1]
    if not body:
        return []
    ids: list[int] = []
    for part in body.split(","):
        lo, hi = _bounds(part.strip(), text)
        if len(ids) + hi - lo + 1 > max_ids:
            raise InvalidHostlist(f"id set {_short(text)} holds more than {max_ids} ids")
        ids.extend(range(lo, hi + 1))
    return ids


def format_ids(ids: Iterable[int]) -> str:
    """``[0, 1, 2, 5, 7, 8]`` → ``"0-2,5,7-8"``: runs of consecutive ids, in the given order."""
    parts: list[str] = []
    run: list[int] = []
    for value in ids:
        if run and value == run[-1] + 1:
            run.append(value)
            continue
        if run:
            parts.append(_run(run))
        run = [value]
    if run:
        parts.append(_run(run))
    return ",".join(parts)


def expand_counts(text: str) -> list[int]:
    """Slurm's ``"2(x3),1"`` → ``[2, 2, 2, 1]`` (one count per node, in node order)."""
    counts: list[int] = []
    for part in text.strip().split(","):
        match = _COUNT.fullmatch(part.strip())
        if match is None:
            raise InvalidHostlist(f"cannot read counts {_short(text)}: bad item {part!r}")
        repeat = int(match[2]) if match[2] is not None else 1
        if repeat < 1 or len(counts) + repeat > MAX_HOSTS:
            raise InvalidHostlist(f"cannot read counts {_short(text)}: bad repeat in {part!r}")
        counts.extend([int(match[1])] * repeat)
    return counts


def _split_top_level(text: str) -> list[str]:
    """Split on the commas outside brackets; refuse nested or unbalanced brackets."""
    items: list[str] = []
    depth = 0
    start = 0
    for i, char in enumerate(text):
        if char == "[":
            depth += 1
            if depth > 1:
                raise InvalidHostlist(f"nested '[' in hostlist {_short(text)}")
        elif char == "]":
            depth -= 1
            if depth < 0:
                raise InvalidHostlist(f"unbalanced ']' in hostlist {_short(text)}")
        elif char == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
        elif char.isspace() or not char.isprintable():
            raise InvalidHostlist(f"whitespace or control character in hostlist {_short(text)}")
    if depth:
        raise InvalidHostlist(f"unclosed '[' in hostlist {_short(text)}")
    items.append(text[start:])
    for item in items:
        if not item:
            raise InvalidHostlist(f"empty name in hostlist {_short(text)}")
    return items


def _item_choices(item: str, text: str) -> list[list[str]]:
    """One list of alternatives per literal piece (a single one) and per bracket."""
    choices: list[list[str]] = []
    for piece in re.split(r"(\[[^\]]*\])", item):
        if not piece:
            continue
        if piece.startswith("["):
            choices.append(_bracket(piece[1:-1], text))
        else:
            choices.append([piece])
    return choices


def _bracket(inner: str, text: str) -> list[str]:
    values: list[str] = []
    for part in inner.split(","):
        lo, hi = _bounds(part, text)
        width = len(part.split("-", 1)[0])  # Slurm pads to the lower bound as written
        if len(values) + hi - lo + 1 > MAX_HOSTS:
            raise InvalidHostlist(f"hostlist {_short(text)} names more than {MAX_HOSTS} hosts")
        values.extend(str(n).zfill(width) for n in range(lo, hi + 1))
    return values


def _bounds(part: str, text: str) -> tuple[int, int]:
    match = _RANGE.fullmatch(part)
    if match is None:
        raise InvalidHostlist(f"bad range {part!r} in {_short(text)}")
    lo = int(match[1])
    hi = int(match[2]) if match[2] is not None else lo
    if hi < lo:
        raise InvalidHostlist(f"descending range {part!r} in {_short(text)}")
    return lo, hi


def _run(run: list[int]) -> str:
    return str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}"


def _short(text: str, limit: int = 80) -> str:
    return repr(text if len(text) <= limit else text[:limit] + "…")
