"""Python-function apps and the example apps, run for real as the launcher would run them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

from lodestream.agents.site.apps import JobContext, load_apps, render_script
from lodestream.agents.site.apps.pyrun import (
    EXIT_OK,
    EXIT_RAISED,
    EXIT_SETUP,
    PyRunResult,
    parse_result,
)
from lodestream.agents.site.apps.render import PYRUN_RESULT

APPS = """
import math

from lodestream.agents.site.apps import ApplicationDefinition


def check(n: int) -> None:
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")


class Stats(ApplicationDefinition):
    def run(self, n: str, label: str = "stats") -> dict[str, object]:
        check(int(n))
        squares = [i * i for i in range(int(n))]
        job = self.job
        return {"label": label, "squares": squares, "job": str(job.job_id),
                "cwd": str(job.workdir), "attempt": job.attempt}


class Unjsonable(ApplicationDefinition):
    def run(self, kind: str) -> object:
        return {1, 2} if kind == "set" else math.nan


class Quits(ApplicationDefinition):
    def run(self) -> None:
        raise SystemExit(3)


class Shell(ApplicationDefinition):
    command_template = "true {{ x }}"


class Typed(ApplicationDefinition):
    parameters = {"steps": {"type": "int"}}

    def run(self, steps: int) -> int:
        return steps + 1
"""

EXAMPLES = Path(__file__).resolve().parents[2] / "agents" / "site" / "apps" / "examples"


@pytest.fixture
def apps(tmp_path: Path) -> Path:
    apps = tmp_path / "apps"
    apps.mkdir()
    (apps / "stats.py").write_text(textwrap.dedent(APPS))
    return apps


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    workdir = tmp_path / "data" / "job 1"
    workdir.mkdir(parents=True)
    return workdir


def pyrun(
    apps: Path, workdir: Path, app: str, params: object, env: dict[str, str] | None = None
) -> tuple[int, PyRunResult]:
    (workdir / "params.json").write_text(json.dumps(params))
    proc = subprocess.run(
        [sys.executable, "-m", "lodestream.agents.site.apps.pyrun",
         "--apps-dir", str(apps), "--app", app,
         "--params-json", "params.json", "--result", "out/result.json"],
        cwd=workdir, env={**os.environ, **(env or {})}, capture_output=True, text=True, check=False,
    )  # fmt: skip
    return proc.returncode, parse_result((workdir / "out" / "result.json").read_text())


def test_return_value_round_trip(apps: Path, workdir: Path) -> None:
    job_id = uuid.uuid4()
    code, result = pyrun(apps, workdir, "Stats", {"n": "4"}, {"LODE_JOB_ID": str(job_id)})
    assert code == EXIT_OK
    assert result == PyRunResult(
        ok=True,
        result={"label": "stats", "squares": [0, 1, 4, 9], "job": str(job_id),
                "cwd": str(workdir), "attempt": 1},
    )  # fmt: skip


def test_exception_comes_back_with_its_traceback(apps: Path, workdir: Path) -> None:
    code, result = pyrun(apps, workdir, "Stats", {"n": "-2", "label": "x"})
    assert code == EXIT_RAISED
    assert not result.ok
    assert result.error == "ValueError: n must be >= 0, got -2"
    lines = result.traceback.splitlines()
    assert lines[0] == "Traceback (most recent call last):"
    assert lines[-1] == "ValueError: n must be >= 0, got -2"
    source = (apps / "stats.py").read_text().splitlines()
    for line, func in (("check(int(n))", "run"), ('raise ValueError(f"n must', "check")):
        number = next(i for i, text in enumerate(source, 1) if text.strip().startswith(line))
        assert f'File "{apps / "stats.py"}", line {number}, in {func}' in result.traceback
    assert "pyrun.py" not in result.traceback


@pytest.mark.parametrize(
    ("kind", "detail"), [("set", "Object of type set is not JSON serializable"),
                         ("nan", "Out of range float values are not JSON compliant")],
)  # fmt: skip
def test_non_json_return_value_is_a_clear_error(
    apps: Path, workdir: Path, kind: str, detail: str
) -> None:
    code, result = pyrun(apps, workdir, "Unjsonable", {"kind": kind})
    assert code == EXIT_RAISED
    assert result.error == (
        f"ResultError: run() returned a value that is not JSON-serialisable: {detail}"
    )


def test_system_exit_in_run_is_reported(apps: Path, workdir: Path) -> None:
    code, result = pyrun(apps, workdir, "Quits", {})
    assert (code, result.ok, result.error) == (EXIT_RAISED, False, "SystemExit: 3")


@pytest.mark.parametrize(
    ("app", "params", "error"),
    [
        ("Nope", {}, "UnknownApp: no app named 'Nope' in "),
        ("Shell", {"x": "1"}, "UnknownApp: app 'Shell' is a shell command app"),
        ("Stats", {}, "ParameterError: app 'Stats' needs parameter 'n'"),
        ("Stats", {"n": "1", "m": "2"}, "ParameterError: app 'Stats' has no parameter 'm'"),
        # Parameters are JSON values; a declared type is checked again at the site.
        ("Typed", {"steps": "5"}, "ParameterError: app 'Typed': parameter 'steps' must be an int"),
        ("Stats", ["n"], "ParameterError: params.json must hold a JSON object"),
    ],
)
def test_setup_failures_exit_2_with_the_reason(
    apps: Path, workdir: Path, app: str, params: object, error: str
) -> None:
    code, result = pyrun(apps, workdir, app, params)
    assert code == EXIT_SETUP
    assert not result.ok
    assert result.error.startswith(error)


def test_broken_apps_dir_is_a_setup_failure(apps: Path, workdir: Path) -> None:
    (apps / "broken.py").write_text("def f(:\n")
    code, result = pyrun(apps, workdir, "Stats", {"n": "1"})
    assert code == EXIT_SETUP
    assert result.error.startswith(f"AppLoadError: {apps / 'broken.py'}:1: SyntaxError")


def test_parse_result_refuses_foreign_documents() -> None:
    with pytest.raises(ValueError, match="not a pyrun result"):
        parse_result('{"result": 1}')
    with pytest.raises(ValueError, match="Expecting value"):
        parse_result("")


def run_script(app_cls: type, job: JobContext, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    script = tmp_path / f"{job.job_id}.sh"
    script.write_text(render_script(app_cls, job))
    return subprocess.run(["bash", str(script)], capture_output=True, text=True, check=False)


def test_python_app_script_end_to_end(apps: Path, workdir: Path, tmp_path: Path) -> None:
    job = JobContext(job_id=uuid.uuid4(), workdir=workdir, parameters={"n": "3"}, attempt=2)
    proc = run_script(load_apps(apps)["Stats"], job, tmp_path)
    assert proc.returncode == 0, proc.stderr
    result = parse_result((workdir / PYRUN_RESULT).read_text())
    assert result.ok
    assert result.result["squares"] == [0, 1, 4]
    assert (result.result["job"], result.result["attempt"]) == (str(job.job_id), 2)


def test_example_eigh_runs_and_its_hooks_accept_the_output(tmp_path: Path) -> None:
    eigh = load_apps(EXAMPLES)["eigh"]
    workdir = tmp_path / "eigh"
    workdir.mkdir()
    job = JobContext(job_id=uuid.uuid4(), workdir=workdir, parameters={"n": "30", "seed": "7"})
    app = eigh(job)
    app.preprocess()
    proc = run_script(eigh, job, tmp_path)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((workdir / "eigh.json").read_text())
    assert (summary["n"], summary["seed"]) == (30, 7)
    assert summary["min"] <= summary["max"]
    app.postprocess()
    assert [p.name for p in workdir.glob(eigh.spec.cleanup_files[0])] == ["eigenvectors.npy"]


def test_example_eigh_usage_error_is_not_retried(tmp_path: Path) -> None:
    eigh = load_apps(EXAMPLES)["eigh"]
    workdir = tmp_path / "eigh"
    workdir.mkdir()
    job = JobContext(job_id=uuid.uuid4(), workdir=workdir, parameters={"n": "many"})
    with pytest.raises(ValueError, match="n must be an integer"):
        eigh(job).preprocess()
    proc = run_script(eigh, job, tmp_path)
    assert proc.returncode == 2
    assert "argument --n: invalid int value: 'many'" in proc.stderr
    failed = JobContext(job_id=job.job_id, workdir=workdir, return_code=proc.returncode)
    assert eigh(failed).handle_error() == "fail"
    assert (
        eigh(JobContext(job_id=job.job_id, workdir=workdir, return_code=1)).handle_error()
        == "retry"
    )


def test_example_eigh_py_returns_its_summary(tmp_path: Path) -> None:
    workdir = tmp_path / "eigh_py"
    workdir.mkdir()
    job = JobContext(job_id=uuid.uuid4(), workdir=workdir, parameters={"n": "12"})
    proc = run_script(load_apps(EXAMPLES)["eigh_py"], job, tmp_path)
    assert proc.returncode == 0, proc.stderr
    result = parse_result((workdir / PYRUN_RESULT).read_text())
    assert result.ok
    assert result.result["n"] == 12
    assert result.result["min"] <= result.result["max"]


def test_pyrun_starts_without_pydantic() -> None:
    # pyrun runs once per Python-function job; the API models are the agent's business.
    probe = "import sys, agents.site.apps.pyrun; print('pydantic' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_calls_each_get_their_outcome_and_one_raising_fails_only_itself(
    apps: Path, workdir: Path
) -> None:
    calls = [{"n": "2"}, {"n": "-1"}, {"n": "1", "label": "third"}]
    code, result = pyrun(apps, workdir, "Stats", calls)
    assert code == EXIT_OK  # every call was made
    assert result.ok
    first, second, third = result.result
    assert (first["ok"], first["result"]["squares"]) == (True, [0, 1])
    assert (second["ok"], second["error"]) == (False, "ValueError: n must be >= 0, got -1")
    assert second["traceback"].splitlines()[-1] == "ValueError: n must be >= 0, got -1"
    assert "pyrun.py" not in second["traceback"]
    assert (third["result"]["label"], third["result"]["squares"]) == ("third", [0])


def test_calls_are_checked_like_parameters_before_any_runs(apps: Path, workdir: Path) -> None:
    code, result = pyrun(apps, workdir, "Typed", [{"steps": 1}, {"steps": "two"}])
    assert code == EXIT_SETUP
    assert "parameter 'steps'" in result.error
    code, result = pyrun(apps, workdir, "Typed", [{"steps": 1}, 7])
    assert code == EXIT_SETUP
    assert "a list of them" in result.error


def test_a_job_of_calls_through_its_script(apps: Path, workdir: Path, tmp_path: Path) -> None:
    job = JobContext(job_id=uuid.uuid4(), workdir=workdir, calls=({"steps": 1}, {"steps": 41}))
    proc = run_script(load_apps(apps)["Typed"], job, tmp_path)
    assert proc.returncode == 0, proc.stderr
    result = parse_result((workdir / PYRUN_RESULT).read_text())
    assert result.result == [{"ok": True, "result": 2}, {"ok": True, "result": 42}]
