"""Pure rendering of a job into shell: parameters resolved, every value one quoted word.

Values only ever pass through ``shlex.quote`` into places the template
checker has proven to be word positions (see ``template.py``); nothing a
user sends is ever evaluated as shell syntax.
"""

from __future__ import annotations

import inspect
import json
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from agents.site.apps.definition import ApplicationDefinition, JobContext
from agents.site.apps.errors import AppDefinitionError, ParameterError
from agents.site.apps.simple import simple_argv
from agents.site.apps.template import substitute

PYRUN_DIR: Final = ".lode"
PYRUN_PARAMS: Final = f"{PYRUN_DIR}/pyrun-params.json"
# Relative to the workdir; the launcher reads the result with pyrun.parse_result.
PYRUN_RESULT: Final = f"{PYRUN_DIR}/pyrun-result.json"


def resolve_parameters(
    app_cls: type[ApplicationDefinition], given: Mapping[str, object]
) -> dict[str, str]:
    """The job's values with defaults applied, in declaration order, or ``ParameterError``."""
    spec = app_cls.spec
    unknown = sorted(set(given) - set(spec.parameters))
    if unknown:
        known = ", ".join(spec.parameters) or "none"
        raise ParameterError(
            f"app {spec.name!r} has no parameter {_names(unknown)} (its parameters: {known})"
        )
    for key, value in given.items():
        if not isinstance(value, str):
            raise ParameterError(
                f"app {spec.name!r}: parameter {key!r} must be a string, not {type(value).__name__}"
            )
        if "\x00" in value:
            raise ParameterError(f"app {spec.name!r}: parameter {key!r} contains a NUL byte")
    missing = [p for p, decl in spec.parameters.items() if decl.required and p not in given]
    if missing:
        raise ParameterError(f"app {spec.name!r} needs parameter {_names(missing)}")
    resolved: dict[str, str] = {}
    for p, decl in spec.parameters.items():
        value = given.get(p, decl.default)
        assert isinstance(value, str)  # required ones are present, optional ones have a default
        resolved[p] = value
    return resolved


def render_command(app_cls: type[ApplicationDefinition], params: Mapping[str, str]) -> str:
    """The job's command line. A Python-function app's values travel in the params file instead."""
    spec = app_cls.spec
    resolved = resolve_parameters(app_cls, params)
    if spec.command_template is not None:
        return substitute(spec.command_template, resolved)
    return shlex.join([
        spec.python_exe, "-m", "agents.site.apps.pyrun",
        "--apps-dir", str(apps_dir_of(app_cls)), "--app", spec.name,
        "--params-json", PYRUN_PARAMS, "--result", PYRUN_RESULT,
    ])  # fmt: skip


def render_script(app_cls: type[ApplicationDefinition], job: JobContext) -> str:
    """The bash script the launcher runs: cd, preamble, environment, (params file), command."""
    spec = app_cls.spec
    resolved = resolve_parameters(app_cls, job.parameters)
    preamble = app_cls(job).shell_preamble()
    if not isinstance(preamble, str):
        raise AppDefinitionError(f"{spec.name}.shell_preamble() must return a str")
    lines = [
        "#!/usr/bin/env bash",
        f"# lodestream job {job.job_id}, app {spec.name}, attempt {job.attempt}",
        f"cd -- {shlex.quote(str(job.workdir))} || exit 1",
    ]
    if preamble.strip():
        lines.append(preamble.strip("\n"))
    lines += [f"export {k}={shlex.quote(v)}" for k, v in spec.environment_variables.items()]
    lines.append(f"export LODE_JOB_ID={shlex.quote(str(job.job_id))}")
    lines.append(f"export LODE_JOB_ATTEMPT={job.attempt:d}")
    if spec.is_python:
        lines.append(f"mkdir -p {PYRUN_DIR}")
        lines.append(f"printf '%s\\n' {shlex.quote(json.dumps(resolved))} > {PYRUN_PARAMS}")
    lines.append(render_command(app_cls, resolved))
    return "\n".join(lines) + "\n"


@dataclass(frozen=True, slots=True)
class ExecForm:
    """The job's command as words to execute directly, and what ``render_script`` would export."""

    argv: tuple[str, ...]
    env: dict[str, str]


def render_exec(app_cls: type[ApplicationDefinition], job: JobContext) -> ExecForm | None:
    """``render_script`` without bash, when that changes nothing (see ``simple.py``), else None.

    Python-function apps and apps with a shell preamble always need their script.
    """
    spec = app_cls.spec
    if spec.is_python or spec.command_template is None:
        return None
    preamble = app_cls(job).shell_preamble()
    if not isinstance(preamble, str):
        raise AppDefinitionError(f"{spec.name}.shell_preamble() must return a str")
    if preamble.strip():
        return None
    argv = simple_argv(render_command(app_cls, job.parameters))
    if argv is None:
        return None
    env = {**spec.environment_variables, "LODE_JOB_ID": str(job.job_id),
           "LODE_JOB_ATTEMPT": f"{job.attempt:d}", "PWD": str(job.workdir)}  # fmt: skip
    return ExecForm(argv=tuple(argv), env=env)


def apps_dir_of(app_cls: type[ApplicationDefinition]) -> Path:
    try:
        return Path(inspect.getfile(app_cls)).resolve().parent
    except (TypeError, OSError) as exc:
        raise AppDefinitionError(
            f"{app_cls.spec.name} was not loaded from a file; load it with load_apps()"
        ) from exc


def _names(names: list[str]) -> str:
    return ", ".join(repr(n) for n in names)
