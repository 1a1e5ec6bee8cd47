"""A pilot's tag filter as given on its command line (``agents/launcher/tags.py``)."""

from __future__ import annotations

import shlex

import pytest

from lodestream.agents.launcher.errors import TagFilterError
from lodestream.agents.launcher.tags import describe, parse_tag_filter
from lodestream.schemas.resources import JobSpec
from lodestream.schemas.tagfilter import tag_options


def test_pairs_become_the_filter() -> None:
    assert parse_tag_filter([]) == {}
    assert parse_tag_filter(["beam:A", "campaign:a:run=7", "empty:"]) == {
        "beam": "A",
        "campaign": "a:run=7",  # the value is everything after the first ':'
        "empty": "",
    }


@pytest.mark.parametrize(
    ("pairs", "message"),
    [
        (["beam"], "--tag must look like key:value, got 'beam'"),
        (["beam=A"], "--tag must look like key:value, got 'beam=A'; write --tag beam:A"),
        ([":A"], "--tag must look like key:value, got ':A'"),
        (["be am:A"], "--tag 'be am:A': a tag key is 1 to 64 letters"),
        ([f"{'k' * 65}:A"], "a tag key is 1 to 64 letters"),
        (["beam:" + "x" * 257], "--tag beam:...: a tag value is at most 256 characters"),
        (["beam:a\x00b"], "a tag value is at most 256 characters, none of them NUL"),
        (["beam:A", "beam:B"], "--tag beam is given twice (beam:A, beam:B)"),
    ],
)  # fmt: skip
def test_a_pair_no_job_tag_could_match_is_refused(pairs: list[str], message: str) -> None:
    with pytest.raises(TagFilterError) as error:
        parse_tag_filter(pairs)
    assert message in str(error.value)


# A key with ':' cannot be filtered on, by a pilot as by the API: ':' ends the key.
@pytest.mark.parametrize("key", ["beam", "a.b-c_d", "k" * 64])
def test_every_key_a_job_may_carry_may_be_filtered_on(key: str) -> None:
    JobSpec(site="alpha", app="a", workdir="w", tags={key: "v"})  # a job may carry it
    assert parse_tag_filter([f"{key}:v"]) == {key: "v"}


def test_the_filter_goes_back_on_a_command_line_as_it_came() -> None:
    wanted = {"beam": "A", "run": "7 b; rm -rf ~", "x": ":"}
    words = tag_options(wanted)
    assert words == ["--tag", "beam:A", "--tag", "run:7 b; rm -rf ~", "--tag", "x::"]
    assert parse_tag_filter(shlex.split(shlex.join(words))[1::2]) == wanted
    assert tag_options({}) == []


def test_the_filter_in_a_log_line() -> None:
    assert describe({"beam": "A", "run": "7"}) == "beam=A, run=7"
    assert describe({}) == "none"
