"""No ``launch_params`` a job can carry adds an option or a program to a launcher's command.

For every MPI backend, arbitrary keys and values (hostile ones drawn often: spaces, quotes,
``$(...)``, leading dashes, newlines, another option as a value) are rendered; each rendering is
either refused with ``InvalidLaunchParams`` or parsed back the way the launcher reads its
command line, and then the job's options are exactly those it asked for and the program is
exactly ``bash -c <script>``. The getopt_long launchers (srun, flux, jsrun) are parsed with
Python's ``getopt``, an independent implementation of the same tokenisation; the others
(Hydra, PALS, Open MPI, aprun: options with one dash or two, each value the next word) with
the walk below, which knows only which options take a value.
"""

from __future__ import annotations

import getopt
import shlex
from collections.abc import Mapping
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lodestream.platform_adapters.compute import NodePlacement
from lodestream.platform_adapters.compute.machine import load_machine
from lodestream.platform_adapters.errors import InvalidLaunchParams
from lodestream.platform_adapters.launchers import TaskSpec, get_launcher
from lodestream.platform_adapters.launchers.layout import RankLayout
from lodestream.platform_adapters.launchers.mpi import MpiLauncher
from lodestream.platform_adapters.launchers.options import Arity, OptionStyle
from lodestream.platform_adapters.packing import Allocation
from lodestream.schemas.resources import JobResources

BASH = "/bin/bash"
SCRIPT = "app --in 'x y'"
BACKENDS = [
    ("srun", "generic-slurm"),
    ("flux", "generic-flux"),
    ("jsrun", "summit"),
    ("mpich", "generic-pbs"),
    ("pals", "polaris"),
    ("openmpi", "generic-slurm"),
    ("aprun", "theta"),
]
HOSTILE = [
    "", "--export=ALL,BASH_ENV=$(touch${IFS}pwned)", "$(id)", "`id`", "a b", "'q'", '"q"',
    "-x", "--", "/tmp/evil", "x;y", "x\ny", "x|y", "-launcher-exec", "ALL", "cores", "4",
    "map_cpu:0,1", "LD_PRELOAD=/x.so", "x&", "~root", "a\tb", "-", "=x",
]  # fmt: skip


def launcher(name: str, machine: str) -> MpiLauncher:
    chosen = get_launcher(name, machine=load_machine(machine))
    assert isinstance(chosen, MpiLauncher)
    chosen.bash = BASH
    return chosen


def spec(params: Mapping[str, str]) -> TaskSpec:
    placements = tuple(NodePlacement(h, tuple(range(8)), ()) for h in ("a", "b"))
    return TaskSpec(
        job_id="job-7", script=SCRIPT, workdir=Path("/nonexistent"), env={},
        allocation=Allocation("job-7", placements), stdout_path=Path("/nonexistent/out"),
        stderr_path=Path("/nonexistent/err"), ranks_per_node=2, launch_params=dict(params),
    )  # fmt: skip


def keys(style: OptionStyle) -> st.SearchStrategy[str]:
    """Keys as a job writes them: allowed names and aliases with one dash or two, others."""
    return st.one_of(known_keys(style), st.text(min_size=1, max_size=12))


def known_keys(style: OptionStyle) -> st.SearchStrategy[str]:
    names = sorted({n.split(":", 1)[0] for n in style.allowed} | set(style.aliases))
    return st.sampled_from(names).flatmap(lambda n: st.sampled_from([f"-{n}", f"--{n}"]))


def params_for(style: OptionStyle) -> st.SearchStrategy[dict[str, str]]:
    """Half plausible (known options, values a launcher reads as one), half anything."""
    plausible = st.dictionaries(
        known_keys(style),
        st.one_of(st.sampled_from(BENIGN), st.sampled_from(HOSTILE)),
        max_size=3,
    )
    return st.one_of(plausible, st.dictionaries(keys(style), values(), max_size=4))


# Values a launcher reads as one: drawn as often as hostile ones, so that renderings are
# parsed back, not only refused.
BENIGN = ["", "", "cores", "4", "socket", "packed", "cpu-affinity=off", "mpi=pmi2", "rs", "none"]


def values() -> st.SearchStrategy[str]:
    return st.one_of(st.sampled_from(BENIGN), st.sampled_from(HOSTILE), st.text(max_size=16))


def own_options(chosen: MpiLauncher) -> list[tuple[str, str | None]]:
    """The backend's own options for the test's spec: (flag as written, value)."""
    layout = RankLayout.of(spec({}), chosen.machine)
    return [(o.flag, o.value) for o in chosen.render_options(spec({}), layout)]


def _command_words(chosen: MpiLauncher) -> int:
    """How many words name the launcher before its options (``flux run``: two)."""
    layout = RankLayout.of(spec({}), chosen.machine)
    options = [w for o in chosen.render_options(spec({}), layout) for w in o.argv()]
    return len(chosen.render_command(spec({}))) - len(options) - 3


def parse(
    chosen: MpiLauncher, argv: list[str], params: Mapping[str, str]
) -> tuple[set[tuple[str, str]], list[str]]:
    """(canonical option name, value) pairs and the words left, as the launcher reads argv.

    Which options take a value: the backend's own that it renders with one, the table's
    value-taking ones, and those the job gave a value (an optional one joined).
    """
    style = chosen.style
    own = own_options(chosen)
    takes = {style.canonical(f) for f, v in own if v is not None}
    takes |= {n.split(":", 1)[0] for n, a in style.allowed.items() if a is Arity.VALUE}
    takes |= {style.canonical(k) for k, v in params.items() if v}
    words = argv[_command_words(chosen) :]
    if style.joins_long:
        names = (
            {style.canonical(f) for f, _ in own}
            | set(style.allowed)
            | {style.canonical(k) for k in params}
        )
        longs = [f"{n}=" if n in takes else n for n in {n.split(":", 1)[0] for n in names}]
        singles = {f.lstrip("-") for f, _ in own if len(f) == 2} | {
            a for a in style.aliases if len(a) == 1
        }
        shorts = "".join(f"{s}:" if style.canonical(s) in takes else s for s in singles)
        pairs, rest = getopt.getopt(words, shorts, longs)
        return {(style.canonical(f), v) for f, v in pairs}, rest
    found: set[tuple[str, str]] = set()
    i = 0
    while i < len(words) and words[i].startswith("-"):
        name = style.canonical(words[i])
        if name in takes:
            found.add((name, words[i + 1]))
            i += 2
        else:
            found.add((name, ""))
            i += 1
    return found, words[i:]


@pytest.mark.parametrize(("name", "machine"), BACKENDS)
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_no_launch_param_adds_an_option_or_a_program(
    name: str, machine: str, data: st.DataObject
) -> None:
    chosen = launcher(name, machine)
    params = data.draw(params_for(chosen.style))
    try:
        argv = chosen.render_command(spec(params))
    except InvalidLaunchParams:
        return
    got, rest = parse(chosen, argv, params)
    assert rest == [BASH, "-c", SCRIPT]
    asked = {(chosen.style.canonical(k), v) for k, v in params.items()}
    assert asked <= got  # each asked option, with its value, as asked
    own = {(chosen.style.canonical(f), v or "") for f, v in own_options(chosen)}
    assert got - asked <= own  # and nothing beyond the backend's own options


@settings(max_examples=200, deadline=None)
@given(params=st.dictionaries(st.text(max_size=12), values(), max_size=4))
def test_what_the_schema_accepts_no_launcher_reads_as_syntax(params: dict[str, str]) -> None:
    """The shared rule refuses at submission every value a launcher could read as two words."""
    try:
        JobResources(launch_params=params)
    except ValueError:
        return
    for key, value in params.items():
        assert key.startswith("-")
        assert shlex.split(value) in ([value], [])
        assert not value.startswith("-")
