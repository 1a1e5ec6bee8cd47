"""Pure rendering of a job into shell: parameters resolved, every value one quoted word.

Values only ever pass through ``shlex.quote`` into places the template
checker has proven to be word positions (see ``template.py``); nothing a
user sends is ever evaluated as shell syntax.
"""

from __future__ import annotations

import inspect
import json
import shlex
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from lodestream.agents.site.apps.definition import ApplicationDefinition, JobContext
from lodestream.agents.site.apps.errors import AppDefinitionError, ParameterError
from lodestream.agents.site.apps.simple import simple_argv
from lodestream.agents.site.apps.template import substitute
from lodestream.schemas.params import type_problem
from lodestream.schemas.storable import check_storable

PYRUN_DIR: Final = ".lode"
PYRUN_PARAMS: Final = f"{PYRUN_DIR}/pyrun-params.json"
# Relative to the workdir; the launcher reads the result with pyrun.parse_result.
PYRUN_RESULT: Final = f"{PYRUN_DIR}/pyrun-result.json"


def resolve_parameters(
    app_cls: type[ApplicationDefinition], given: Mapping[str, object]
) -> dict[str, object]:
    """The job's values with defaults applied, in declaration order, or ``ParameterError``.

    Each value must be of its parameter's declared type (``schemas.params``), as the API
    checked at submission: the app may have changed since.
    """
    spec = app_cls.spec
    unknown = sorted(set(given) - set(spec.parameters))
    if unknown:
        known = ", ".join(spec.parameters) or "none"
        raise ParameterError(
            f"app {spec.name!r} has no parameter {_names(unknown)} (its parameters: {known})"
        )
    for key, value in given.items():
        problem = type_problem(spec.parameters[key].type or "any", value)
        if problem is not None:
            raise ParameterError(f"app {spec.name!r}: parameter {key!r} {problem}")
    try:
        check_storable(dict(given), "parameters")
    except ValueError as exc:
        raise ParameterError(f"app {spec.name!r}: {exc}") from exc
    missing = [p for p, decl in spec.parameters.items() if decl.required and p not in given]
    if missing:
        raise ParameterError(f"app {spec.name!r} needs parameter {_names(missing)}")
    return {p: given.get(p, decl.default) for p, decl in spec.parameters.items()}


def render_command(app_cls: type[ApplicationDefinition], params: Mapping[str, object]) -> str:
    """The job's command line. A Python-function app's values travel in the params file instead."""
    spec = app_cls.spec
    if spec.command_template is not None:
        return substitute(spec.command_template, resolve_parameters(app_cls, params))
    return _pyrun_command(app_cls)


def _pyrun_command(app_cls: type[ApplicationDefinition]) -> str:
    """The command of a Python-function job: pyrun reads its values from the params file."""
    spec = app_cls.spec
    return shlex.join([
        spec.python_exe, "-m", "lodestream.agents.site.apps.pyrun",
        "--apps-dir", str(apps_dir_of(app_cls)), "--app", spec.name,
        "--params-json", PYRUN_PARAMS, "--result", PYRUN_RESULT,
    ])  # fmt: skip


@dataclass(frozen=True, slots=True)
class ExecForm:
    """The job's command as words to execute directly, and what its script would export."""

    argv: tuple[str, ...]
    env: dict[str, str]


@dataclass(frozen=True, slots=True)
class PyCall:
    """A Python-function job as a warm worker runs it: what pyrun reads, what the script exports."""

    app: str
    params_json: str
    env: dict[str, str]


@dataclass(frozen=True, slots=True)
class RenderedJob:
    """A job as the launcher runs it: its bash script, and the same without bash when possible.

    ``call`` is set for a Python-function app without a shell preamble: a warm worker may run
    it in place of the script.
    """

    script: str
    direct: ExecForm | None
    call: PyCall | None = None


def render_job(app_cls: type[ApplicationDefinition], job: JobContext) -> RenderedJob:
    """Script: cd, preamble, environment, (params file), command. Direct form: see ``simple.py``.

    Python-function apps and apps with a shell preamble always need their script.
    """
    spec = app_cls.spec
    values = _values(app_cls, job)
    preamble = app_cls(job).shell_preamble()
    if not isinstance(preamble, str):
        raise AppDefinitionError(f"{spec.name}.shell_preamble() must return a str")
    exports = {**spec.environment_variables, "LODE_JOB_ID": str(job.job_id),
               "LODE_JOB_ATTEMPT": f"{job.attempt:d}"}  # fmt: skip
    command = _pyrun_command(app_cls) if spec.is_python else render_command(app_cls, job.parameters)
    lines = [
        "#!/usr/bin/env bash",
        f"# lodestream job {job.job_id}, app {spec.name}, attempt {job.attempt}",
        f"cd -- {shlex.quote(str(job.workdir))} || exit 1",
    ]
    if preamble.strip():
        lines.append(preamble.strip("\n"))
    lines += [f"export {k}={shlex.quote(v)}" for k, v in exports.items()]
    if spec.is_python:
        lines.append(f"mkdir -p {PYRUN_DIR}")
        lines.append(f"printf '%s\\n' {shlex.quote(json.dumps(values))} > {PYRUN_PARAMS}")
    lines.append(command)
    argv = None if spec.is_python or preamble.strip() else simple_argv(command)
    direct = None
    if argv is not None:
        direct = ExecForm(argv=tuple(argv), env={**exports, "PWD": str(job.workdir)})
    call = None
    if spec.is_python and not preamble.strip():
        call = PyCall(app=spec.name, params_json=json.dumps(values), env=exports)
    return RenderedJob(script="\n".join(lines) + "\n", direct=direct, call=call)


def _values(
    app_cls: type[ApplicationDefinition], job: JobContext
) -> dict[str, object] | list[dict[str, object]]:
    """What the job's run gets: its parameters, or one parameter set per call (a list, which
    pyrun runs one after the other), each checked as :func:`resolve_parameters` checks."""
    if not job.calls:
        return resolve_parameters(app_cls, job.parameters)
    if not app_cls.spec.is_python:
        raise ParameterError(f"app {app_cls.spec.name!r} is a shell app: calls are for "
                             "Python-function apps")  # fmt: skip
    return [resolve_parameters(app_cls, call) for call in job.calls]


def render_script(app_cls: type[ApplicationDefinition], job: JobContext) -> str:
    """The bash script the launcher runs for ``job``."""
    return render_job(app_cls, job).script


def render_exec(app_cls: type[ApplicationDefinition], job: JobContext) -> ExecForm | None:
    """The job without bash, when that changes nothing, else None."""
    return render_job(app_cls, job).direct


# Per class, and no longer than the class lives (an app reloaded from a changed file is a
# new class; the old one goes with its module).
_APPS_DIRS: weakref.WeakKeyDictionary[type[ApplicationDefinition], Path] = (
    weakref.WeakKeyDictionary()
)


def apps_dir_of(app_cls: type[ApplicationDefinition]) -> Path:
    """The folder of the file that defined ``app_cls`` (pyrun imports the apps from there).

    Cached: resolving the path costs a system call per component, 0.2-0.4 ms of a pilot's
    time for every function job in its profile, and a class's file does not move.
    """
    known = _APPS_DIRS.get(app_cls)
    if known is not None:
        return known
    try:
        path = Path(inspect.getfile(app_cls))
    except TypeError as exc:
        raise AppDefinitionError(
            f"{app_cls.spec.name} was not loaded from a file; load it with load_apps()"
        ) from exc
    where = _APPS_DIRS[app_cls] = path.resolve().parent
    return where


def _names(names: list[str]) -> str:
    return ", ".join(repr(n) for n in names)
