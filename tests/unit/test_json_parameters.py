"""Parameters as JSON values: accepted by JobSpec when storable, checked against the type
the app declares (by the API at submission and by the site), rendered as one shell word,
and handed to a Python-function app's ``run()`` as they are."""

from __future__ import annotations

import json
import shlex
import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from lodestream.agents.site.apps import (
    ApplicationDefinition,
    JobContext,
    ParameterError,
    load_apps,
    pyrun,
    render_command,
    render_script,
    resolve_parameters,
)
from lodestream.agents.site.apps.template import word
from lodestream.schemas.params import MAX_PARAMETERS_BYTES, type_problem
from lodestream.schemas.resources import INT64_MAX, App, AppParameter, JobSpec
from lodestream.services.api import submit
from lodestream.services.api.errors import InvalidInput
from lodestream.services.api.models import JobSubmission, SubmitRequest
from lodestream.services.api.submit import AppInterface, Catalog

# JSON values Postgres keeps as they are: no NUL, 64-bit integers, finite floats.
TEXT = st.text(st.characters(exclude_categories=["Cs"], exclude_characters="\x00"), max_size=12)
SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**63), INT64_MAX),
    st.floats(allow_nan=False, allow_infinity=False), TEXT,
    st.sampled_from(["$(touch PWNED)", "'", '"; id; "', "\n", "-x", "`id`", "*", "a b"]),
)  # fmt: skip
JSON = st.recursive(
    SCALARS,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(TEXT, inner, max_size=4)),
    max_leaves=12,
)


class Echo(ApplicationDefinition):
    """Prints its one argument NUL-terminated: the test sees the word bash built."""

    command_template = "printf '%s\\0' {{ v }}"
    parameters = {"v": {"type": "any"}}


class Steps(ApplicationDefinition):
    command_template = "sim --steps {{ steps }} --label {{ label }}"
    parameters = {"steps": {"type": "int"}}


# --- the model ---------------------------------------------------------------------------


def spec(parameters: dict[str, Any]) -> JobSpec:
    return JobSpec(site="alpha", app="sim", workdir="w", parameters=parameters)


def test_a_job_spec_takes_json_values_and_old_strings() -> None:
    values = {"n": 5, "xs": [1, 2.5, "a"], "opts": {"k": [True, None]}, "label": "x"}
    assert spec(values).parameters == values
    decoded = JobSpec.model_validate_json(spec(values).model_dump_json())
    assert decoded.parameters == values
    assert JobSpec.model_validate_json(  # an event from before JSON values decodes as it was
        '{"site": "alpha", "app": "sim", "workdir": "w", "parameters": {"n": "5"}}'
    ).parameters == {"n": "5"}


@pytest.mark.parametrize(
    ("parameters", "message"),
    [
        ({"n": 2**63}, r"parameters\['n'\] is an integer outside"),
        ({"n": [1, float("nan")]}, r"parameters\['n'\]\[1\] is not a finite number"),
        ({"n": {"a\x00": 1}}, r"parameters\['n'\]\['a\\x00'\] is a key that contains NUL"),
        ({"n": "a\x00"}, r"parameters\['n'\] contains NUL"),
        ({"n": "x" * MAX_PARAMETERS_BYTES}, "the limit is 65536"),
        ({"n": {1, 2}}, "valid JSON value"),
    ],
)
def test_unstorable_or_oversized_parameters_are_refused(
    parameters: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValidationError, match=message):
        spec(parameters)


def test_an_app_parameter_states_its_type_and_a_json_default() -> None:
    param = AppParameter(required=False, default=[1, 2], type="list")
    assert AppParameter.model_validate_json(param.model_dump_json()) == param
    old = App.model_validate_json('{"site": "a", "name": "x", "parameters": {"n": {}}}')
    assert old.parameters["n"].type is None  # registered before types: the kind's default


@pytest.mark.parametrize(
    ("declared", "value", "problem"),
    [
        ("str", "5", None), ("str", 5, "must be a string, not an int"),
        ("int", 5, None), ("int", True, "must be an int, not a bool"),
        ("int", 5.0, "must be an int, not a float"), ("float", 5, None), ("float", 0.5, None),
        ("bool", False, None), ("bool", 0, "must be a bool, not an int"),
        ("list", [1], None), ("list", {}, "must be a list, not a dict"),
        ("dict", {"a": 1}, None), ("dict", None, "must be a dict, not null"),
        ("any", {"a": [None]}, None),
    ],
)  # fmt: skip
def test_type_problems(declared: str, value: object, problem: str | None) -> None:
    assert type_problem(declared, value) == problem


# --- the API's check ---------------------------------------------------------------------


def catalog(python: bool) -> Catalog:
    interface = AppInterface.from_row(
        {"steps": {"type": "int"}, "label": {"required": False, "default": "x"}}, {}, (), python
    )
    return Catalog(
        sites=frozenset({"alpha"}), apps={"alpha": {"sim": interface}}, own_jobs=frozenset()
    )


def check(parameters: dict[str, Any], python: bool) -> None:
    job = JobSubmission(site="alpha", app="sim", workdir="w", parameters=parameters)
    req = SubmitRequest(jobs=[job])
    submit.check(req, submit.job_ids(req, "ada", b"secret"), catalog(python))


def test_the_api_checks_declared_types_and_names_the_parameter() -> None:
    check({"steps": 5, "label": "run"}, python=False)
    with pytest.raises(InvalidInput) as exc:
        check({"steps": "5", "label": 7}, python=False)
    assert [(d["loc"], d["msg"], d["type"]) for d in exc.value.details] == [
        (["body", "jobs", 0, "parameters", "steps"],
         "app 'sim' at 'alpha': parameter 'steps' must be an int, not a string", "invalid_type"),
        (["body", "jobs", 0, "parameters", "label"],
         "app 'sim' at 'alpha': parameter 'label' must be a string, not an int", "invalid_type"),
    ]  # fmt: skip


def test_a_python_apps_undeclared_types_take_any_json_value() -> None:
    check({"steps": 5, "label": {"any": ["thing"]}}, python=True)
    with pytest.raises(InvalidInput, match="parameter 'steps' must be an int"):
        check({"steps": [5]}, python=True)


# --- the site: types, rendering, run() ---------------------------------------------------


def test_the_site_checks_types_again_and_applies_json_defaults() -> None:
    assert resolve_parameters(Steps, {"steps": 3, "label": "a"}) == {"steps": 3, "label": "a"}
    with pytest.raises(ParameterError, match="parameter 'steps' must be an int, not a string"):
        resolve_parameters(Steps, {"steps": "3", "label": "a"})
    with pytest.raises(ParameterError, match="parameter 'label' must be a string, not a list"):
        resolve_parameters(Steps, {"steps": 3, "label": ["a"]})


@pytest.mark.parametrize(
    ("value", "text"),
    [("a b", "a b"), (5, "5"), (2.5, "2.5"), (True, "true"), (None, "null"),
     ([1, "a"], '[1, "a"]'), ({"k": "é"}, '{"k": "é"}')],
)  # fmt: skip
def test_a_value_renders_as_its_json_text_unless_a_string(value: object, text: str) -> None:
    assert word(value) == text
    assert shlex.split(render_command(Echo, {"v": value})) == ["printf", "%s\\0", text]


@settings(max_examples=300, deadline=None)
@given(value=JSON)
def test_any_json_value_is_one_shell_word(value: object) -> None:
    assert shlex.split(render_command(Echo, {"v": value})) == ["printf", "%s\\0", word(value)]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(value=JSON)
def test_bash_reads_any_json_value_as_exactly_one_word(value: object) -> None:
    out = subprocess.run(
        ["bash", "-c", render_command(Echo, {"v": value})], capture_output=True, check=True
    ).stdout
    assert out == word(value).encode() + b"\0"


PYTHON_APP = """
from lodestream.agents.site.apps import ApplicationDefinition

class Typed(ApplicationDefinition):
    parameters = {"steps": {"type": "int"}}

    def run(self, steps, xs, opts, scale=0.5):
        return {"steps": [type(steps).__name__, steps], "xs": [type(xs).__name__, xs],
                "opts": [type(opts).__name__, opts], "scale": scale,
                "seen": dict(self.job.parameters)}
"""


def test_a_python_app_gets_its_values_typed_through_the_params_file(tmp_path: Path) -> None:
    apps_dir = tmp_path / "apps"
    apps_dir.mkdir()
    (apps_dir / "typed.py").write_text(PYTHON_APP)
    typed = load_apps(apps_dir)["Typed"]
    assert typed.spec.parameters["scale"].default == 0.5
    workdir = tmp_path / "work"
    workdir.mkdir()
    given_values = {"steps": 5, "xs": [1, 2], "opts": {"a": {"b": None}}}
    job = JobContext(job_id=uuid.uuid4(), workdir=workdir, parameters=given_values)
    subprocess.run(["bash", "-c", render_script(typed, job)], check=True, cwd=workdir)
    result = json.loads((workdir / ".lode" / "pyrun-result.json").read_text())
    assert result == {"ok": True, "result": {
        "steps": ["int", 5], "xs": ["list", [1, 2]], "opts": ["dict", {"a": {"b": None}}],
        "scale": 0.5, "seen": {**given_values, "scale": 0.5},
    }}  # fmt: skip
    params_file = workdir / ".lode" / "pyrun-params.json"
    params_file.write_text(json.dumps({"steps": "5", "xs": [], "opts": {}}))
    result_file = workdir / "again.json"
    code = pyrun.main(["--apps-dir", str(apps_dir), "--app", "Typed", "--params-json",
                       str(params_file), "--result", str(result_file)])  # fmt: skip
    assert code == pyrun.EXIT_SETUP
    assert "parameter 'steps' must be an int, not a string" in result_file.read_text()
