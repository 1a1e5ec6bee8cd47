"""Rendering: parameters resolved, every value one literal argument, whatever it contains."""

from __future__ import annotations

import json
import os
import random
import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest

from lodestream.agents.site.apps import (
    AppDefinitionError,
    ApplicationDefinition,
    JobContext,
    ParameterError,
    render_command,
    render_script,
    resolve_parameters,
)
from lodestream.agents.site.apps.render import PYRUN_PARAMS, PYRUN_RESULT


class Args(ApplicationDefinition):
    """Prints each argument NUL-terminated, so the test sees exactly the argv bash built."""

    command_template = "printf '%s\\0' {{ a }} --b={{ b }} {{ c }}"
    parameters = {"c": {"default": "c-default"}}


class Greeter(ApplicationDefinition):
    command_template = "printf '%s|%s\\0' \"$GREETING\" {{ who }}"
    environment_variables = {"GREETING": "hi $(touch PWNED) `touch PWNED` 'q'"}

    def shell_preamble(self) -> str:
        return "export PREAMBLE_RAN=yes\nset -u"


class Adder(ApplicationDefinition):
    def run(self, x: str, y: str = "1") -> int:
        return int(x) + int(y)


HOSTILE = [
    "$(touch PWNED)",
    "`touch PWNED`",
    "; touch PWNED",
    "&& touch PWNED",
    "| touch PWNED",
    "> PWNED",
    "' ; touch PWNED ; '",
    '" ; touch PWNED ; "',
    "it's",
    "a\nb",
    "\ntouch PWNED\n",
    "line\r\nfeed",
    "$HOME",
    "${IFS}",
    "~",
    "~root",
    "*",
    "?",
    "[a-z]*",
    "{a,b}",
    "\\",
    "\\'",
    "-n",
    "--help",
    "",
    " ",
    "\t",
    "#",
    "!!",
    "ünïcødé ✓",
    "$'\\x41'",
    "{{ a }}",
]


def bash(command: str, cwd: Path, env: dict[str, str] | None = None) -> list[str]:
    out = subprocess.run(
        ["bash", "-c", command], cwd=cwd, capture_output=True, check=True, env=env
    ).stdout.decode()
    assert out.endswith("\0")
    return out[:-1].split("\0")


@pytest.mark.parametrize("value", HOSTILE)
def test_each_value_arrives_as_one_literal_argument(value: str, tmp_path: Path) -> None:
    command = render_command(Args, {"a": value, "b": value, "c": value})
    assert bash(command, tmp_path) == [value, f"--b={value}", value]
    assert list(tmp_path.iterdir()) == []  # nothing ran, nothing globbed, nothing redirected


def test_random_hostile_strings_stay_literal(tmp_path: Path) -> None:
    rng = random.Random(20240611)
    alphabet = "ab $`'\"\\;&|<>(){}[]*?~#!\n\t=,.-_%^+:@/\x01\x7fé"
    for _ in range(40):
        values = ["".join(rng.choices(alphabet, k=rng.randint(0, 24))) for _ in range(3)]
        command = render_command(Args, dict(zip("abc", values, strict=True)))
        assert bash(command, tmp_path) == [values[0], f"--b={values[1]}", values[2]]
    assert list(tmp_path.iterdir()) == []


def test_resolve_applies_defaults_in_declaration_order() -> None:
    assert resolve_parameters(Args, {"b": "2", "a": "1"}) == {"c": "c-default", "a": "1", "b": "2"}
    assert list(resolve_parameters(Args, {"b": "2", "a": "1"})) == ["c", "a", "b"]
    assert resolve_parameters(Args, {"a": "1", "b": "2", "c": ""})["c"] == ""
    assert render_command(Args, {"a": "1", "b": "2"}) == "printf '%s\\0' 1 --b=2 c-default"


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"a": "1", "b": "2", "d": "x"}, r"app 'Args' has no parameter 'd' \(its parameters: c, a, b\)"),  # noqa: E501
        ({"a": "1", "b": "2", "z": "", "y": ""}, "no parameter 'y', 'z'"),
        ({"b": "2"}, "app 'Args' needs parameter 'a'"),
        ({}, "needs parameter 'a', 'b'"),
        ({"a": 1, "b": "2"}, "parameter 'a' must be a string, not an int"),
        ({"a": None, "b": "2"}, "parameter 'a' must be a string, not null"),
        ({"a": "x\x00y", "b": "2"}, r"parameters\['a'\] contains NUL"),
    ],
)  # fmt: skip
def test_bad_parameters_are_named(given: dict[str, Any], message: str) -> None:
    with pytest.raises(ParameterError, match=message):
        resolve_parameters(Args, given)
    with pytest.raises(ParameterError, match=message):
        render_command(Args, given)


def test_script_has_preamble_then_quoted_environment_then_command(tmp_path: Path) -> None:
    workdir = tmp_path / "job dir; touch PWNED"
    workdir.mkdir()
    job = JobContext(job_id=uuid.uuid4(), workdir=workdir, parameters={"who": "$(id) 'x'"})
    script = render_script(Greeter, job)
    lines = script.splitlines()
    assert lines[0] == "#!/usr/bin/env bash"
    assert lines.index("export PREAMBLE_RAN=yes") < lines.index("set -u")
    assert lines.index("set -u") < next(i for i, s in enumerate(lines) if "GREETING=" in s)
    assert lines[-1] == render_command(Greeter, job.parameters)
    (tmp_path / "job.sh").write_text(script)
    env = {"PATH": os.environ["PATH"]}
    assert bash(f"bash {tmp_path / 'job.sh'}", tmp_path, env) == [
        f"{Greeter.environment_variables['GREETING']}|$(id) 'x'"
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["job dir; touch PWNED", "job.sh"]
    assert list(workdir.iterdir()) == []


def test_script_exports_job_identity(tmp_path: Path) -> None:
    class Env(ApplicationDefinition):
        command_template = 'printf \'%s\\0\' "$LODE_JOB_ID" "$LODE_JOB_ATTEMPT" "$PWD"'

    job = JobContext(job_id=uuid.uuid4(), workdir=tmp_path, attempt=3)
    assert bash(render_script(Env, job), Path("/")) == [str(job.job_id), "3", str(tmp_path)]


def test_script_refuses_a_preamble_that_is_not_text(tmp_path: Path) -> None:
    class Odd(ApplicationDefinition):
        command_template = "true"

        def shell_preamble(self) -> str:
            return ["module load x"]  # type: ignore[return-value]

    with pytest.raises(AppDefinitionError, match=r"Odd.shell_preamble\(\) must return a str"):
        render_script(Odd, JobContext(job_id=uuid.uuid4(), workdir=tmp_path))


def test_python_app_renders_pyrun_with_values_in_the_params_file(tmp_path: Path) -> None:
    command = render_command(Adder, {"x": "$(touch PWNED)"})
    assert " -m lodestream.agents.site.apps.pyrun " in command
    assert f"--app Adder --params-json {PYRUN_PARAMS} --result {PYRUN_RESULT}" in command
    assert "PWNED" not in command
    assert f"--apps-dir {Path(__file__).resolve().parent}" in command
    script = render_script(
        Adder, JobContext(job_id=uuid.uuid4(), workdir=tmp_path, parameters={"x": "'2'"})
    )
    # Run everything but the pyrun line: the params file must hold the exact values.
    setup = "\n".join(
        line for line in script.splitlines() if "lodestream.agents.site.apps.pyrun" not in line
    )
    subprocess.run(["bash", "-c", setup], check=True)
    assert (tmp_path / PYRUN_PARAMS).read_text() == '{"x": "\'2\'", "y": "1"}\n'


def test_calls_go_to_the_params_file_as_a_list_each_checked(tmp_path: Path) -> None:
    """A job of many calls: hostile values stay data, in the params file's list."""
    calls = ({"x": value} for value in HOSTILE[:8])
    job = JobContext(job_id=uuid.uuid4(), workdir=tmp_path / "w", calls=tuple(calls))
    tmp_path.joinpath("w").mkdir()
    script = render_script(Adder, job)
    done = subprocess.run(["bash", "-c", script.replace(script.splitlines()[-1], "")],
                          capture_output=True, text=True, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    written = json.loads((tmp_path / "w" / PYRUN_PARAMS).read_text())
    assert written == [{"x": value, "y": "1"} for value in HOSTILE[:8]]
    assert not (tmp_path / "w" / "PWNED").exists()
    with pytest.raises(ParameterError, match="no parameter 'z'"):
        render_script(Adder, JobContext(job_id=uuid.uuid4(), workdir=tmp_path,
                                        calls=({"x": "1"}, {"z": "2"})))  # fmt: skip
    with pytest.raises(ParameterError, match="calls are for Python-function apps"):
        render_script(Args, JobContext(job_id=uuid.uuid4(), workdir=tmp_path,
                                       calls=({"a": "1", "b": "2"},)))  # fmt: skip
