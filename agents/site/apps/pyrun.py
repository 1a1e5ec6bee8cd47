"""Run a Python-function app inside the job: ``python -m lodestream.agents.site.apps.pyrun``.

    python -m lodestream.agents.site.apps.pyrun --apps-dir D --app NAME \\
        --params-json FILE --result FILE

Writes ``{"ok": true, "result": ...}`` or ``{"ok": false, "error": "Type: msg",
"traceback": "..."}`` to the result file and exits 0 when ``run()`` returned,
1 when it raised or returned something that is not JSON, and 2 when the app
could not be started at all (bad apps dir, unknown app, bad parameters); the
result file then says why. The launcher reads it with ``parse_result``.

A job of many calls (``JobSpec.calls``) has a JSON *list* of parameter sets in its params
file: ``run()`` is called once for each, in order, each on an instance of its own, and the
result is ``{"ok": true, "result": [outcome, ...]}``, one outcome per call in the form
above, so that one call that raises fails that call alone. The exit is 0 once every call
has been made.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from lodestream.agents.site.apps.definition import ApplicationDefinition, JobContext
from lodestream.agents.site.apps.errors import AppError, ParameterError, ResultError, UnknownApp
from lodestream.agents.site.apps.loader import load_apps
from lodestream.agents.site.apps.render import apps_dir_of, resolve_parameters

EXIT_OK = 0
EXIT_RAISED = 1
EXIT_SETUP = 2


@dataclass(frozen=True, slots=True)
class PyRunResult:
    ok: bool
    result: Any = None
    error: str = ""
    traceback: str = ""


def parse_result(text: str) -> PyRunResult:
    """Read a result file's content; ``ValueError`` if it is not one pyrun writes."""
    doc = json.loads(text)
    if not isinstance(doc, dict) or not isinstance(doc.get("ok"), bool):
        raise ValueError("not a pyrun result: expected an object with a boolean 'ok'")  # noqa: TRY004
    if doc["ok"]:
        return PyRunResult(ok=True, result=doc.get("result"))
    return PyRunResult(
        ok=False, error=str(doc.get("error", "")), traceback=str(doc.get("traceback", ""))
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        apps = load_apps(Path(args.apps_dir))
    except (AppError, OSError, ValueError) as exc:
        _write(Path(args.result), _failure(exc, None))
        return EXIT_SETUP
    return run_loaded(apps, args.app, Path(args.params_json), Path(args.result))


def run_loaded(
    apps: Mapping[str, type[ApplicationDefinition]], name: str, params_file: Path, result_path: Path
) -> int:
    """What ``main`` does with the apps already imported (a warm worker's); its exit status."""
    try:
        app_cls, given = _prepare(apps, name, params_file)
        calls = [resolve_parameters(app_cls, call) for call in given] if isinstance(
            given, list) else None  # fmt: skip
        params = resolve_parameters(app_cls, given) if isinstance(given, dict) else {}
    except (AppError, OSError, ValueError) as exc:
        _write(result_path, _failure(exc, None))
        return EXIT_SETUP
    if calls is not None:
        outcomes = [_call(app_cls, values)[1] for values in calls]
        _write_text(result_path, json.dumps({"ok": True, "result": outcomes}))
        return EXIT_OK
    code, outcome = _call(app_cls, params)
    _write(result_path, outcome)
    return code


def _call(
    app_cls: type[ApplicationDefinition], params: dict[str, object]
) -> tuple[int, dict[str, Any]]:
    """Call ``run()`` once on an instance of its own; its exit status and outcome document."""
    job = JobContext(
        job_id=uuid.UUID(os.environ.get("LODE_JOB_ID", str(uuid.UUID(int=0)))),
        workdir=Path.cwd(),
        parameters=params,
        attempt=int(os.environ.get("LODE_JOB_ATTEMPT", "1")),
    )
    run = getattr(app_cls(job), "run", None)
    assert callable(run)  # guaranteed by the ApplicationDefinition checks
    try:
        value = run(**params)
    except (Exception, SystemExit) as exc:
        # Drop pyrun's own frames: the traceback starts in the site author's code.
        tb = exc.__traceback__.tb_next if exc.__traceback__ else None
        return EXIT_RAISED, _failure(exc, tb)
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as exc:
        error = ResultError(f"run() returned a value that is not JSON-serialisable: {exc}")
        return EXIT_RAISED, _failure(error, None)
    return EXIT_OK, {"ok": True, "result": value}


def _prepare(
    apps: Mapping[str, type[ApplicationDefinition]], name: str, params_file: Path
) -> tuple[type[ApplicationDefinition], dict[str, Any] | list[dict[str, Any]]]:
    """The app and what its params file holds: one parameter set, or one per call."""
    if name not in apps:
        where = f" in {apps_dir_of(next(iter(apps.values())))}" if apps else ""
        raise UnknownApp(f"no app named {name!r}{where} (apps: {', '.join(sorted(apps))})")
    app_cls = apps[name]
    if not app_cls.spec.is_python:
        raise UnknownApp(f"app {name!r} is a shell command app, not a Python-function app")
    given = json.loads(params_file.read_text(encoding="utf-8"))
    if isinstance(given, list) and all(isinstance(call, dict) for call in given):
        return app_cls, given
    if not isinstance(given, dict):
        raise ParameterError(
            f"{params_file} must hold a JSON object of parameter values, or a list of them"
        )
    return app_cls, given


def _failure(exc: BaseException, tb: TracebackType | None) -> dict[str, Any]:
    return {
        "ok": False,
        "error": f"{type(exc).__name__}: {exc}",
        "traceback": "".join(traceback.format_exception(type(exc), exc, tb)) if tb else "",
    }


def _write(path: Path, doc: dict[str, Any]) -> None:
    _write_text(path, json.dumps(doc))


def _write_text(path: Path, text: str) -> None:
    # Written whole or not at all: the launcher must never read half a result.
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text + "\n", encoding="utf-8")
    tmp.replace(path)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m lodestream.agents.site.apps.pyrun", description=__doc__
    )
    parser.add_argument("--apps-dir", required=True, help="the site's apps/ directory")
    parser.add_argument("--app", required=True, help="name of the Python-function app")
    parser.add_argument("--params-json", required=True, help="JSON object of parameter values")
    parser.add_argument("--result", required=True, help="where to write the result JSON")
    return parser


if __name__ == "__main__":
    sys.exit(main())
