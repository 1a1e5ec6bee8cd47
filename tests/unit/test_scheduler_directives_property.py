"""Property: no value of a batch request reaches a scheduler as syntax (issue 29, finding 2).

Arbitrary strings in every field a user or a site controls (project, queue, job name, option
values, beside option names of the allowed shape) are rendered by each backend. Either the
backend refuses with ``InvalidSubmission``, and then some value really is one that scheduler
would read as syntax, or the script is read back as its consumers read it: the directive block
line by line with the scheduler's own tokenisation (tests/support/directive_words.py), which
must give exactly the words asked for, flag by flag; ``bash -n`` on the whole script; and the
command line's words, which must hold the same flags in the same order before the script.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from lodestream.platform_adapters.errors import InvalidSubmission
from lodestream.platform_adapters.schedulers.base import OPTION_NAME, BatchRequest
from lodestream.platform_adapters.schedulers.cobalt import (
    render_cobalt_header,
)
from lodestream.platform_adapters.schedulers.cobalt import (
    render_qsub_argv as render_cobalt_argv,
)
from lodestream.platform_adapters.schedulers.flux import render_batch_argv, render_flux_header
from lodestream.platform_adapters.schedulers.lsf import render_bsub_argv, render_bsub_header
from lodestream.platform_adapters.schedulers.pbs import render_pbs_header, render_qsub_argv
from lodestream.platform_adapters.schedulers.slurm.render import (
    render_sbatch_argv,
    render_sbatch_header,
)
from lodestream.schemas.events.batch import SCHEDULER_VALUE_PATTERN, scheduler_value_problem
from tests.support.directive_words import (
    UnreadableLine,
    directive_lines,
    flux_words,
    pbs_resources,
    quoted_words,
    slurm_separators,
)

SCRIPT = Path("/home/alice/site/batch/pilot-01.sh")
BODY = "set -eu\nexec true\n"
# What an attacker tries: the audit's payload, and each character a scheduler or shell reads.
NASTY = (
    " --export=ALL,BASH_ENV=$(touch${IFS}pwned)", "\n#SBATCH --export=ALL", "\nid\n", "'", '"',
    "\\", "#", "$(id)", "`id`", ";id", "|id", "&", "\t-v BASH_ENV=x", "-", "--x", "\r", "\x00",
    "hetjob", "PackJob", ",place=excl", "a b", "\u00a0", "\u2028", "[x]", "~", "*",
)  # fmt: skip
SAFE = st.from_regex(SCHEDULER_VALUE_PATTERN, fullmatch=True).map(lambda s: s[:40])
VALUES = st.one_of(
    SAFE,
    st.text(max_size=30),
    st.sampled_from(NASTY),
    st.tuples(SAFE, st.sampled_from(NASTY), SAFE).map("".join),
)
OPTIONS = st.dictionaries(
    st.from_regex(OPTION_NAME, fullmatch=True).map(lambda s: s[:20]), VALUES, max_size=4
)


@dataclass(frozen=True)
class Family:
    """A backend's renderers and what its directives must say for a request, flag by flag."""

    name: str
    prefix: str
    header: Callable[[BatchRequest], str]
    argv: Callable[[Path, BatchRequest], list[str]]
    expected: Callable[[BatchRequest], list[list[str]]]
    words: Callable[[str], list[str]] = quoted_words


def _named(request: BatchRequest, flags: tuple[str, str, str]) -> list[list[str]]:
    values = (request.project, request.queue, request.job_name)
    return [[flag, value] for flag, value in zip(flags, values, strict=True) if value]


def _options(request: BatchRequest, dashes: str, *, joined: bool) -> list[list[str]]:
    out = []
    for name, value in request.options.items():
        option = f"{dashes}{name}"
        if not value:
            out.append([option])
        else:
            out.append([f"{option}={value}"] if joined else [option, value])
    return out


def _slurm(r: BatchRequest) -> list[list[str]]:
    named = [("--account", r.project), ("--partition", r.queue), ("--job-name", r.job_name)]
    return [
        [f"--nodes={r.nodes}"], [f"--time={r.wall_time_min}"],
        *([f"{flag}={value}"] for flag, value in named if value),
        *_options(r, "--", joined=True),
    ]  # fmt: skip


def _pbs(r: BatchRequest) -> list[list[str]]:
    select = f"select={r.nodes}" + (f":{r.options['select']}" if r.options.get("select") else "")
    rest = [["-l", f"{k}={v}"] for k, v in r.options.items() if k != "select"]
    hours, minutes = divmod(r.wall_time_min, 60)
    walltime = ["-l", f"walltime={hours:02d}:{minutes:02d}:00"]
    return [*_named(r, ("-A", "-q", "-N")), ["-l", select], walltime, *rest]


def _lsf(r: BatchRequest) -> list[list[str]]:
    named = _named(r, ("-P", "-q", "-J"))
    job_name = [flag for flag in named if flag[0] == "-J"]
    head = [flag for flag in named if flag[0] != "-J"]
    sizes = [["-nnodes", str(r.nodes)], ["-W", str(r.wall_time_min)]]
    return [*head, *sizes, *job_name, *_options(r, "-", joined=False)]


def _cobalt(r: BatchRequest) -> list[list[str]]:
    named = _named(r, ("-A", "-q", "--jobname"))
    job_name = [flag for flag in named if flag[0] == "--jobname"]
    head = [flag for flag in named if flag[0] != "--jobname"]
    sizes = [["-n", str(r.nodes)], ["-t", str(r.wall_time_min)]]
    return [*head, *sizes, *job_name, *_options(r, "--", joined=False)]


def _flux(r: BatchRequest) -> list[list[str]]:
    named = [("--queue", r.queue), ("--bank", r.project), ("--job-name", r.job_name)]
    return [
        [f"--nodes={r.nodes}"], [f"--time-limit={r.wall_time_min}m"],
        *([f"{flag}={value}"] for flag, value in named if value),
        *_options(r, "--", joined=True),
    ]  # fmt: skip


FAMILIES = (
    Family("slurm", "#SBATCH", render_sbatch_header, render_sbatch_argv, _slurm),
    Family("pbs", "#PBS", render_pbs_header, render_qsub_argv, _pbs),
    Family("lsf", "#BSUB", render_bsub_header, render_bsub_argv, _lsf),
    Family("cobalt", "#COBALT", render_cobalt_header, render_cobalt_argv, _cobalt),
    Family("flux", "#flux:", render_flux_header, render_batch_argv, _flux, flux_words),
)


def _refusal_is_due(family: str, fields: dict[str, Any]) -> bool:
    """Whether some value is one ``family`` would read as syntax (or cannot take at all)."""
    values = [fields["project"], fields["queue"], fields["job_name"], *fields["options"].values()]
    if any(scheduler_value_problem(v) for v in values):
        return True
    if family == "slurm":
        return bool(slurm_separators(values))
    if family == "pbs":
        options = fields["options"]
        return any("," in v for v in values) or any(
            not v for k, v in options.items() if k != "select"
        )
    return False


def bash_syntax_ok(script: str) -> bool:
    done = subprocess.run(["bash", "-n"], input=script.encode(), capture_output=True, check=False)
    return done.returncode == 0


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.name)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(project=VALUES, queue=VALUES, job_name=VALUES, options=OPTIONS,
       nodes=st.integers(1, 64), wall_time_min=st.integers(1, 60 * 48))  # fmt: skip
@example(project="", queue="debug", job_name="lode-x", nodes=1, wall_time_min=5,
         options={"comment": "x --export=ALL,BASH_ENV=$(touch${IFS}pwned)"})  # fmt: skip
@example(project="", queue="", job_name="", nodes=1, wall_time_min=5,
         options={"mail-user": "a@b.c -v BASH_ENV=$(id)", "m": "abe"})  # fmt: skip
@example(project="", queue="", job_name="", nodes=1, wall_time_min=5,
         options={"comment": "HetJob,x"})  # fmt: skip
def test_no_value_adds_an_option_a_directive_or_a_command(
    family: Family, project: str, queue: str, job_name: str, options: dict[str, str],
    nodes: int, wall_time_min: int,
) -> None:  # fmt: skip
    fields: dict[str, Any] = {
        "project": project, "queue": queue, "job_name": job_name, "options": options,
    }  # fmt: skip
    try:
        request = BatchRequest(nodes=nodes, wall_time_min=wall_time_min, **fields)
        script = "#!/bin/bash\n" + family.header(request) + BODY
        argv = family.argv(SCRIPT, request)
    except InvalidSubmission:
        assert _refusal_is_due(family.name, fields), f"{family.name} refused {fields!r}"
        return
    expected = family.expected(request)

    # The directive block: one line per flag, right below the shebang, then the body.
    assert script.split("\n")[1 : 1 + len(expected)] == [
        f"{family.prefix} {' '.join(words)}" for words in expected
    ]
    assert script.endswith("\n" + BODY)
    # ... read as the scheduler reads it, word for word.
    try:
        read = [family.words(line) for line in directive_lines(script, family.prefix)]
    except UnreadableLine as exc:
        pytest.fail(f"{family.name} would refuse its own directive: {exc}")
    assert read == expected
    if family.name == "slurm":
        assert not slurm_separators([w for words in read for w in words])
    if family.name == "pbs":
        assert all(len(pbs_resources(words)) == 1 for words in read if words[0] == "-l")
    # The command line: the same flags in the same order, the script last.
    flat = [word for words in expected for word in words]
    assert argv[-1] == str(SCRIPT)
    assert [w for w in argv if w in flat] == flat
    assert bash_syntax_ok(script)


def test_the_audits_payload_is_refused_naming_the_option() -> None:
    payload = "x --export=ALL,BASH_ENV=$(touch${IFS}pwned)"
    with pytest.raises(InvalidSubmission, match=r"^option comment 'x --export.*' ' is not one"):
        BatchRequest(wall_time_min=5, options={"comment": payload})


@pytest.mark.parametrize(
    ("family", "options", "message"),
    [
        (FAMILIES[0], {"comment": "hetjob"}, "slurm reads 'hetjob' on a #SBATCH line"),
        (FAMILIES[1], {"m": "abe,place=excl"}, "',' is not allowed on a #PBS line"),
    ],
    ids=["slurm-hetjob", "pbs-comma"],
)
def test_a_familys_own_syntax_is_refused_where_it_renders(
    family: Family, options: dict[str, str], message: str
) -> None:
    request = BatchRequest(wall_time_min=5, options=options)
    with pytest.raises(InvalidSubmission, match=message):
        family.header(request)
    with pytest.raises(InvalidSubmission, match=message):
        family.argv(SCRIPT, request)
