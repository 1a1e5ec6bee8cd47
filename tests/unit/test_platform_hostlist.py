"""Hostlists, id sets and Slurm's count lists: pure expanders, checked against a table."""

from __future__ import annotations

import pytest

from lodestream.platform_adapters.compute.hostlist import (
    expand_counts,
    expand_hostlist,
    expand_ids,
    format_ids,
)
from lodestream.platform_adapters.errors import DiscoveryError, InvalidHostlist


@pytest.mark.parametrize(
    ("text", "hosts"),
    [
        ("", []),
        ("  ", []),
        ("login1", ["login1"]),
        ("a,b,c", ["a", "b", "c"]),
        ("nid[001-003,007],login1", ["nid001", "nid002", "nid003", "nid007", "login1"]),
        ("n[1-3]", ["n1", "n2", "n3"]),
        ("n[8-11]", ["n8", "n9", "n10", "n11"]),
        ("n[08-10]", ["n08", "n09", "n10"]),  # padding follows the lower bound as written
        ("n[098-101]", ["n098", "n099", "n100", "n101"]),
        ("n[007]", ["n007"]),
        ("x[1-2]y[3-4]", ["x1y3", "x1y4", "x2y3", "x2y4"]),  # rightmost varies fastest
        ("r[1-2]-c[01-02]-n0", ["r1-c01-n0", "r1-c02-n0", "r2-c01-n0", "r2-c02-n0"]),
        ("[1-2]x", ["1x", "2x"]),
        ("a[1-2],b[3]", ["a1", "a2", "b3"]),
        ("n1,n1", ["n1", "n1"]),  # kept as written; discovery dedupes
        ("x3005c0s7b[0-1]n0", ["x3005c0s7b0n0", "x3005c0s7b1n0"]),
        ("node-[1,3-4].cluster", ["node-1.cluster", "node-3.cluster", "node-4.cluster"]),
    ],
)
def test_expand_hostlist(text: str, hosts: list[str]) -> None:
    assert expand_hostlist(text) == hosts


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("n[1-3", "unclosed"),
        ("n1-3]", "unbalanced"),
        ("n[[1-2]]", "nested"),
        ("n[]", "bad range"),
        ("n[a-b]", "bad range"),
        ("n[3-1]", "descending"),
        ("n[1-2-3]", "bad range"),
        ("n[-1]", "bad range"),
        ("a,,b", "empty name"),
        ("a,", "empty name"),
        ("a b", "whitespace"),
        ("a\nb", "whitespace"),
    ],
)
def test_malformed_hostlists_are_refused(text: str, reason: str) -> None:
    with pytest.raises(InvalidHostlist, match=reason):
        expand_hostlist(text)


def test_a_hostlist_too_large_is_refused_before_it_is_built() -> None:
    with pytest.raises(InvalidHostlist, match="more than 1000000"):
        expand_hostlist("n[0-999999999]")
    with pytest.raises(InvalidHostlist, match="more than 100"):
        expand_hostlist("x[1-20]y[1-20]", max_hosts=100)


def test_invalid_hostlist_is_a_discovery_error() -> None:
    assert issubclass(InvalidHostlist, DiscoveryError)


@pytest.mark.parametrize(
    ("text", "ids"),
    [
        ("", []),
        ("5", [5]),
        ("1-3,7", [1, 2, 3, 7]),
        ("[0-2]", [0, 1, 2]),
        ("3830-3831,3835", [3830, 3831, 3835]),
    ],
)
def test_expand_ids(text: str, ids: list[int]) -> None:
    assert expand_ids(text) == ids


@pytest.mark.parametrize("text", ["1-", "a", "3-1", "1,,2", "1 2"])
def test_malformed_id_sets_are_refused(text: str) -> None:
    with pytest.raises(InvalidHostlist):
        expand_ids(text)


@pytest.mark.parametrize(
    ("ids", "text"),
    [([], ""), ([4], "4"), ([0, 1, 2, 5, 7, 8], "0-2,5,7-8"), ([3, 2, 1], "3,2,1")],
)
def test_format_ids(ids: list[int], text: str) -> None:
    assert format_ids(ids) == text


@pytest.mark.parametrize(
    ("text", "counts"),
    [("64", [64]), ("2(x3),1", [2, 2, 2, 1]), ("256(x2)", [256, 256]), ("4,8", [4, 8])],
)
def test_expand_counts(text: str, counts: list[int]) -> None:
    assert expand_counts(text) == counts


@pytest.mark.parametrize("text", ["", "2(3)", "2(x)", "x", "2(x0)", "2(x3", "-1"])
def test_malformed_counts_are_refused(text: str) -> None:
    with pytest.raises(InvalidHostlist):
        expand_counts(text)
