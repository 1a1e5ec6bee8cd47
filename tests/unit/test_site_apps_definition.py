"""ApplicationDefinition: what a site author may declare, and the message for each mistake."""

from __future__ import annotations

import re
import uuid
from pathlib import Path
from typing import Any

import pytest

from lodestream.agents.site.apps import (
    AppDefinitionError,
    ApplicationDefinition,
    Decision,
    JobContext,
    Parameter,
    TransferSlot,
)
from lodestream.agents.site.apps.definition import defined_hooks
from lodestream.schemas.resources import JobSpec


def make(attrs: dict[str, Any], name: str = "Probe") -> type[ApplicationDefinition]:
    return type(name, (ApplicationDefinition,), attrs)


def job(**overrides: Any) -> JobContext:
    fields: dict[str, Any] = {"job_id": uuid.uuid4(), "workdir": Path("/tmp/w")} | overrides
    return JobContext(**fields)


def _run(self: object, n: str, seed: str = "0") -> str:
    return n + seed


def _takes_arg(self: object, extra: str) -> None:
    del extra


async def _async_hook(self: object) -> None:
    return None


def _run_varargs(self: object, *args: str) -> None:
    del args


def _run_kwargs(self: object, **kwargs: str) -> None:
    del kwargs


def _run_int_default(self: object, n: str = 8) -> None:  # type: ignore[assignment]
    del n


def _run_none_default(self: object, n: str | None = None) -> None:
    del n


def _run_set_default(self: object, n: object = {1}) -> None:
    del n


def _run_generator(self: object, n: str) -> Any:
    yield n


async def _run_async(self: object, n: str) -> None:
    del n


CMD = "echo {{ x }}"
BAD: list[tuple[dict[str, Any], str]] = [
    ({}, "define exactly one of command_template .* or run()"),
    ({"command_template": CMD, "run": _run}, "define exactly one of command_template"),
    ({"command_template": "   "}, "command_template must be a non-empty string"),
    ({"command_template": 42}, "command_template must be a non-empty string"),
    (
        {"command_template": "echo {{ a.b }}"},
        r"placeholder '\{\{ a.b \}\}' must be a Python identifier",
    ),
    ({"command_template": "echo {{ 1x }}"}, "must be a Python identifier"),
    ({"command_template": "echo {{ class }}"}, "must be a Python identifier"),
    ({"command_template": "echo {{ }}"}, "must be a Python identifier"),
    ({"command_template": "echo {{ x }} {{ y"}, r"'\{\{' without a closing '\}\}'"),
    ({"command_template": 'echo "{{ x }}"'}, r'inside a "\.\.\." quoted string'),
    ({"command_template": "echo '{{ x }}'"}, r"inside a '\.\.\.' quoted string"),
    ({"command_template": "echo $'a{{ x }}'"}, r"inside a \$'\.\.\.' quoted string"),
    ({"command_template": "echo hi # {{ x }}"}, "inside a comment"),
    ({"command_template": "cat <<EOF\n{{ x }}\nEOF"}, "after a here-document operator"),
    ({"command_template": "echo ${{ x }}"}, r"right after '\$'"),
    ({"command_template": "echo \\{{ x }}"}, r"right after '\\\\'"),
    (
        {"command_template": CMD, "parameters": {"x": {}, "y": {}}},
        r"parameters \['y'\] are declared but not used",
    ),
    ({"command_template": CMD, "parameters": {"x": 3}}, "must be a Parameter or a dict, not int"),
    (
        {"command_template": CMD, "parameters": {"x": {"default": 8}}},
        r"parameter 'x': default 8 must be a string, not an int",
    ),
    (
        {"command_template": CMD, "parameters": {"x": {"type": "int", "default": "8"}}},
        r"parameter 'x': default '8' must be an int, not a string",
    ),
    (
        {"command_template": CMD, "parameters": {"x": {"type": "integer"}}},
        r"parameter 'x': type 'integer' is not one of str, int, float, bool, list, dict, any",
    ),
    (
        {"command_template": CMD, "parameters": {"x": {"required": True, "default": "a"}}},
        "is required but has a default",
    ),
    (
        {"command_template": CMD, "parameters": {"x": {"required": False}}},
        "is optional, so it needs a default",
    ),
    ({"command_template": CMD, "parameters": {"x": {"hlep": "typo"}}}, r"unknown keys \['hlep'\]"),
    (
        {"command_template": CMD, "parameters": {"x": {"required": "yes"}}},
        "required must be a bool",
    ),
    ({"command_template": CMD, "parameters": []}, "parameters must be a dict"),
    (
        {"run": _run, "parameters": {"bad-name": {}}},
        "parameter name 'bad-name' must be a Python identifier",
    ),
    (
        {"run": _run, "parameters": {"other": {}}},
        "'other' is declared but run.. has no such argument",
    ),
    (
        {"run": _run, "parameters": {"seed": {"required": False, "default": "1"}}},
        "its default comes from run",
    ),
    ({"run": _run_varargs}, r"must be a named argument \(no \*args"),
    ({"run": _run_kwargs}, "must be a named argument"),
    ({"run": _run_none_default}, "run: default of 'n' is None, which means no default here"),
    (
        {"run": _run_int_default, "parameters": {"n": {"type": "str"}}},
        "parameter 'n': default 8 must be a string, not an int",
    ),
    ({"run": _run_set_default}, r"parameter 'n': default \{1\} is not a JSON value"),
    ({"run": _run_generator}, "run must return its result, not yield it"),
    ({"run": _run_async}, "run must be a plain method"),
    ({"run": staticmethod(_run)}, "run must be a plain method"),
    ({"run": 5}, "run must be a plain method"),
    (
        {"command_template": CMD, "preprocess": _takes_arg},
        r"preprocess must take only self .*def preprocess\(self\)",
    ),
    ({"command_template": CMD, "postprocess": _async_hook}, "postprocess must be a plain method"),
    (
        {"command_template": CMD, "handle_error": staticmethod(_async_hook)},
        "handle_error must be a plain method",
    ),
    ({"command_template": CMD, "handle_timeout": "retry"}, "handle_timeout must be a plain method"),
    (
        {"command_template": CMD, "shell_preamble": "module load x"},
        "shell_preamble must be a plain method",
    ),
    ({"command_template": CMD, "name": "has space"}, "name 'has space' must match"),
    ({"command_template": CMD, "name": 7}, "name 7 must match"),
    ({"command_template": CMD, "description": None}, "description must be a string"),
    (
        {"command_template": CMD, "environment_variables": {"A-B": "1"}},
        "'A-B' is not a valid shell name",
    ),
    (
        {"command_template": CMD, "environment_variables": {"A": 1}},
        "environment variable A: value must be a string",
    ),
    (
        {"command_template": CMD, "environment_variables": ["A"]},
        "environment_variables must be a dict",
    ),
    (
        {"command_template": CMD, "cleanup_files": "*.tmp"},
        "cleanup_files must be a list of glob patterns",
    ),
    (
        {"command_template": CMD, "cleanup_files": ["/tmp/*"]},
        r"'/tmp/\*' must be a glob inside the workdir",
    ),
    ({"command_template": CMD, "cleanup_files": ["../*"]}, "must be a glob inside the workdir"),
    (
        {
            "command_template": CMD,
            "transfers": {"in put": TransferSlot(direction="in", local_path="a")},
        },
        "transfer slot name 'in put' must match",
    ),
    (
        {"command_template": CMD, "transfers": {"inp": {"direction": "up", "local_path": "a"}}},
        "direction must be 'in' or 'out'",
    ),
    (
        {"command_template": CMD, "transfers": {"inp": {"direction": "in", "local_path": "/etc"}}},
        "local_path must be relative",
    ),
    (
        {"command_template": CMD, "transfers": {"inp": {"direction": "in"}}},
        "transfer slot 'inp': .*local_path",
    ),
    (
        {
            "command_template": CMD,
            "transfers": {"inp": {"direction": "in", "local_path": "a", "size": 1}},
        },
        r"unknown keys \['size'\]",
    ),
    ({"command_template": CMD, "transfers": {"inp": "a"}}, "must be a TransferSlot or a dict"),
    (
        {
            "command_template": CMD,
            "transfers": {"res": {"direction": "out", "local_path": "a", "cache": True}},
        },
        r"transfer slot 'res': only an input \(direction 'in'\) can be cached",
    ),
    ({"command_template": CMD, "python_exe": ""}, "python_exe must be a non-empty string"),
]


@pytest.mark.parametrize(("attrs", "message"), BAD)
def test_invalid_definition_is_refused_with_a_clear_message(
    attrs: dict[str, Any], message: str
) -> None:
    with pytest.raises(AppDefinitionError, match=message) as info:
        make(attrs)
    assert str(info.value).startswith("ApplicationDefinition Probe: ")


def test_shell_app_defaults_and_auto_declared_placeholders() -> None:
    class Sim(ApplicationDefinition):
        """Runs the simulation.

        More words that are not the description.
        """

        command_template = "  sim --steps {{ steps }} --in {{ inp }} --out={{ out }}  "
        parameters = {"out": {"default": "out.h5", "help": "output file"}}

    assert Sim.name == "Sim"
    assert Sim.description == "Runs the simulation."
    assert Sim.spec.command_template == "sim --steps {{ steps }} --in {{ inp }} --out={{ out }}"
    assert Sim.spec.placeholders == ("steps", "inp", "out")
    assert Sim.parameters == {
        "out": Parameter(required=False, default="out.h5", help="output file", type="str"),
        "steps": Parameter(type="str"),
        "inp": Parameter(type="str"),
    }
    assert not Sim.spec.is_python


def test_python_app_takes_parameters_from_run_signature() -> None:
    class Fit(ApplicationDefinition):
        name = "fit.v2"
        description = "explicit"
        parameters = {"seed": {"help": "rng seed"}}

        def run(self, n: str, *, seed: str = "0") -> int:
            return int(n) + int(seed)

    assert Fit.spec.is_python
    assert (Fit.name, Fit.description) == ("fit.v2", "explicit")
    assert Fit.parameters == {
        "n": Parameter(required=True, type="any"),
        "seed": Parameter(required=False, default="0", help="rng seed", type="any"),
    }


def test_parameter_infers_required_from_default() -> None:
    assert Parameter().required
    assert not Parameter(default="").required
    assert Parameter(default="1") == Parameter(required=False, default="1")
    assert "default='1'" in repr(Parameter(default="1"))
    assert len({Parameter(), Parameter()}) == 1


def test_allowed_shell_constructs_around_placeholders() -> None:
    template = (
        "cd \"$HOME\" && printf '%s\\n' {{ a }} 'quoted #' --x={{ b }}{{ c }} \\\n"
        "  $(basename {{ d }}) <<< {{ e }}  # a comment with an apostrophe: don't\n"
        "echo {{ f }}"
    )
    app = make({"command_template": template})
    assert app.spec.placeholders == ("a", "b", "c", "d", "e", "f")


def test_abstract_base_shares_hooks_and_is_not_an_app() -> None:
    class Mpi(ApplicationDefinition, abstract=True):
        def shell_preamble(self) -> str:
            return "module load mpich"

    class Solver(Mpi):
        command_template = "solve {{ n }}"

    assert Mpi.abstract
    assert not Solver.abstract
    assert Solver(job()).shell_preamble() == "module load mpich"
    with pytest.raises(AppDefinitionError, match="Mpi is abstract"):
        Mpi(job())
    with pytest.raises(AppDefinitionError, match="ApplicationDefinition is abstract"):
        ApplicationDefinition(job())


def test_abstract_base_hooks_are_checked_too() -> None:
    with pytest.raises(AppDefinitionError, match="preprocess must take only self"):
        type("Base", (ApplicationDefinition,), {"preprocess": _takes_arg}, abstract=True)


def test_subclass_gets_its_own_name_and_rechecks_inherited_parameters() -> None:
    class Base(ApplicationDefinition):
        command_template = "run {{ a }}"
        parameters = {"a": {"default": "1"}}

    class Child(Base):
        pass

    assert (Base.name, Child.name) == ("Base", "Child")
    assert Child.parameters == Base.parameters
    with pytest.raises(AppDefinitionError, match=r"\['a'\] are declared but not used"):
        type("Other", (Base,), {"command_template": "run {{ b }}"})
    with pytest.raises(AppDefinitionError, match="define exactly one"):
        type("Both", (Base,), {"run": _run})


def test_instances_hold_the_job_and_default_decisions_follow_the_budget() -> None:
    app_cls = make({"command_template": CMD})
    first = app_cls(job(attempt=1, max_attempts=2))
    last = app_cls(job(attempt=2, max_attempts=2))
    assert first.job.workdir == Path("/tmp/w")
    assert first.handle_error() is Decision.RETRY
    assert last.handle_error() is Decision.FAIL
    assert last.handle_timeout() is Decision.RETRY
    assert first.shell_preamble() == ""
    first.preprocess()
    first.postprocess()


def test_defined_hooks_lists_overrides_only() -> None:
    class Base(ApplicationDefinition, abstract=True):
        def postprocess(self) -> None:
            return None

    class App(Base):
        command_template = CMD

        def handle_timeout(self) -> Decision:
            return Decision.FAIL

        def shell_preamble(self) -> str:
            return "set -u"

    assert defined_hooks(App) == ("postprocess", "handle_timeout")
    assert defined_hooks(make({"command_template": CMD})) == ()


def test_job_context_from_a_work_item_spec() -> None:
    spec = JobSpec(
        site="local",
        app="eigh",
        workdir="demo/a",
        parameters={"n": "3"},
        tags={"k": "v"},
        data={"x": 1},
    )
    job_id = uuid.uuid4()
    ctx = JobContext.from_spec(job_id, spec, Path("/site/data"), attempt=2, return_code=1)
    assert ctx.job_id == job_id
    assert ctx.workdir == Path("/site/data/demo/a")
    assert (dict(ctx.parameters), dict(ctx.tags), dict(ctx.data)) == (
        {"n": "3"},
        {"k": "v"},
        {"x": 1},
    )
    assert (ctx.attempt, ctx.return_code, ctx.stderr_tail) == (2, 1, "")


def test_messages_name_the_class_not_its_locals_path() -> None:
    with pytest.raises(AppDefinitionError) as info:

        class Typo(ApplicationDefinition):
            command_template = "echo '{{ x }}'"

    assert re.match(r"ApplicationDefinition Typo: command_template: placeholder", str(info.value))
