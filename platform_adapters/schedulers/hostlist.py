"""Slurm/Flux compressed host lists (``nid[0001-0003,0007],login1``) expanded into hostnames."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Final

MAX_HOSTS: Final = 1_000_000  # a garbled range must not expand into all of memory


def expand_hostlist(text: str) -> tuple[str, ...]:
    """The hostnames of a host list, in order; ``ValueError`` if it is malformed.

    Ranges keep the zero padding of their first number (``n[08-10]`` is n08, n09, n10), and
    several bracket groups in one name multiply (``r[1-2]n[1-2]``). ``(null)`` and '' are empty.
    """
    text = text.strip()
    if text in {"", "(null)", "None"}:
        return ()
    hosts: list[str] = []
    for item in _top_level_items(text):
        for host in _expand_item(item):
            hosts.append(host)
            if len(hosts) > MAX_HOSTS:
                raise ValueError(f"host list {text[:80]!r} expands to more than {MAX_HOSTS}")
    return tuple(hosts)


def _top_level_items(text: str) -> list[str]:
    items, depth, start = [], 0, 0
    for i, char in enumerate(text):
        if char == "[":
            depth += 1
            if depth > 1:
                raise ValueError(f"nested brackets in host list {text!r}")
        elif char == "]":
            depth -= 1
            if depth < 0:
                raise ValueError(f"unbalanced brackets in host list {text!r}")
        elif char == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    if depth:
        raise ValueError(f"unbalanced brackets in host list {text!r}")
    items.append(text[start:])
    if any(not item for item in items):
        raise ValueError(f"empty name in host list {text!r}")
    return items


def _expand_item(item: str) -> Iterator[str]:
    open_at = item.find("[")
    if open_at < 0:
        yield item
        return
    close_at = item.index("]", open_at)
    prefix, inner, rest = item[:open_at], item[open_at + 1 : close_at], item[close_at + 1 :]
    tails = list(_expand_item(rest))
    for number in _numbers(inner):
        for tail in tails:
            yield prefix + number + tail


def _numbers(ranges: str) -> Iterator[str]:
    for part in ranges.split(","):
        low, _, high = part.partition("-")
        if not low.isdigit() or (high and not high.isdigit()):
            raise ValueError(f"malformed range {part!r} in host list")
        if not high:
            yield low
            continue
        if int(high) < int(low) or int(high) - int(low) > MAX_HOSTS:
            raise ValueError(f"malformed range {part!r} in host list")
        width = len(low)
        for n in range(int(low), int(high) + 1):
            yield str(n).zfill(width)
