"""Direct execution: a command line is run without bash only when bash would run the same words."""

from __future__ import annotations

import random
import shlex
import subprocess
import uuid
from pathlib import Path

import pytest

from lodestream.agents.site.apps import ApplicationDefinition, JobContext, render_command
from lodestream.agents.site.apps.render import render_exec
from lodestream.agents.site.apps.simple import simple_argv
from tests.unit.test_site_apps_render import HOSTILE, Args

PRINTER = "printargs"  # a file on the test's PATH that prints its arguments NUL-terminated


@pytest.fixture
def printer_path(tmp_path: Path) -> str:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    printer = bin_dir / PRINTER
    printer.write_text("#!/bin/sh\n[ $# -eq 0 ] || printf '%s\\0' \"$@\"\nprintf '.'\n")
    printer.chmod(0o755)
    return f"{bin_dir}:/usr/bin:/bin"


def bash_words(command: str, cwd: Path, path: str) -> list[str]:
    out = subprocess.run(
        ["bash", "-c", command], cwd=cwd, capture_output=True, check=True, env={"PATH": path}
    ).stdout.decode()
    assert out.endswith(".")
    return [PRINTER, *out[:-1].split("\0")[:-1]]


@pytest.mark.parametrize(
    ("command", "words"),
    [
        ("/bin/true", ["/bin/true"]),
        ("prog a b", ["prog", "a", "b"]),
        ("  prog\ta   b  ", ["prog", "a", "b"]),
        ("prog ''", ["prog", ""]),
        ("prog 'a b' c'd'e", ["prog", "a b", "cde"]),
        ("prog --x=1 -n @host:22 50% a+b ./f,g", ["prog", "--x=1", "-n", "@host:22", "50%", "a+b", "./f,g"]),  # noqa: E501
        ("prog ''\"'\"''", None),  # the double quote shlex.quote writes for a quote: left to bash
        ("prog '$(id) `id` ; | > * ? ~ {a,b}'", ["prog", "$(id) `id` ; | > * ? ~ {a,b}"]),
    ],
)  # fmt: skip
def test_plain_words_and_single_quotes(command: str, words: list[str] | None) -> None:
    assert simple_argv(command) == words


@pytest.mark.parametrize(
    "command",
    [
        "", "   ", "prog $HOME", "prog ${X}", "prog `id`", "prog $(id)", "prog *", "prog a?",
        "prog [ab]", "prog {a,b}", "prog ~", "prog ~root", "prog a;b", "prog a | b", "prog a & b",
        "prog > out", "prog < in", "prog # comment", "prog \\x", 'prog "a"', "prog (a)",
        "prog 'unterminated", "prog\nother", "!prog", "A=1 prog", "A=1", "'' prog",
        "echo hi", "true", "cd /", "exec prog", "time prog", "test -f x", "[ -f x ]", "kill 1",
        "source f", ". f", "export A=1", "exit 3", "set -e", "if", "{", "[[",
    ],
)  # fmt: skip
def test_anything_bash_would_interpret_is_left_to_bash(command: str) -> None:
    assert simple_argv(command) is None


@pytest.mark.parametrize("value", HOSTILE)
def test_rendered_values_give_the_words_bash_gives(
    value: str, tmp_path: Path, printer_path: str
) -> None:
    command = f"{PRINTER} {shlex.quote(value)} --b={shlex.quote(value)}"
    words = simple_argv(command)
    if words is not None:
        assert words == bash_words(command, tmp_path, printer_path)
    assert list(tmp_path.iterdir()) == [tmp_path / "bin"]


def test_random_command_lines_agree_with_bash(tmp_path: Path, printer_path: str) -> None:
    """Fuzz: whenever simple_argv accepts a line, bash builds exactly the same argv."""
    rng = random.Random(20261122)
    alphabet = "ab '\t=,.-_%+:@/é$`\"\\;&|<>(){}[]*?~#!"
    accepted = 0
    for _ in range(400):
        tail = "".join(rng.choices(alphabet, k=rng.randint(0, 16)))
        command = f"{PRINTER} {tail}"
        words = simple_argv(command)
        if words is None:
            continue
        accepted += 1
        assert words == bash_words(command, tmp_path, printer_path), command
    assert accepted > 20  # the fuzz exercised the accepting side too


class Plain(ApplicationDefinition):
    command_template = "printargs {{ a }} --b={{ b }}"
    environment_variables = {"MODE": "$(not expanded)"}


class WithPreamble(Plain):
    def shell_preamble(self) -> str:
        return "module load x"


class Piped(ApplicationDefinition):
    command_template = "printargs {{ a }} {{ b }} | cat"


class PyApp(ApplicationDefinition):
    def run(self, a: str, b: str) -> str:
        return a + b


def test_render_exec_gives_the_words_and_what_the_script_exports(tmp_path: Path) -> None:
    job = JobContext(job_id=uuid.uuid4(), workdir=tmp_path, parameters={"a": "x; y", "b": ""},
                     attempt=2)  # fmt: skip
    direct = render_exec(Plain, job)
    assert direct is not None
    assert direct.argv == ("printargs", "x; y", "--b=")
    assert simple_argv(render_command(Plain, job.parameters)) == list(direct.argv)
    assert direct.env == {"MODE": "$(not expanded)", "LODE_JOB_ID": str(job.job_id),
                          "LODE_JOB_ATTEMPT": "2", "PWD": str(tmp_path)}  # fmt: skip


@pytest.mark.parametrize("app", [WithPreamble, Piped, PyApp])
def test_render_exec_refuses_what_needs_the_script(app: type[ApplicationDefinition]) -> None:
    job = JobContext(job_id=uuid.uuid4(), workdir=Path("/tmp"), parameters={"a": "1", "b": "2"})
    assert render_exec(app, job) is None


def test_render_exec_applies_parameter_validation() -> None:
    job = JobContext(job_id=uuid.uuid4(), workdir=Path("/tmp"), parameters={"b": "2"})
    with pytest.raises(ValueError, match="needs parameter 'a'"):
        render_exec(Plain, job)
    assert render_exec(Args, JobContext(job_id=uuid.uuid4(), workdir=Path("/tmp"),
                                        parameters={"a": "1", "b": "2"})) is None  # fmt: skip
