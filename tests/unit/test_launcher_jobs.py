"""What a pilot observes when a task ends: a result file only for Python-function apps."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from lodestream.agents.launcher.jobs import run_end
from lodestream.agents.launcher.tasks import Tracked
from lodestream.agents.launcher.work import WorkItem
from lodestream.agents.site.apps.render import PYRUN_RESULT
from lodestream.platform_adapters.launchers.base import TaskSpec
from lodestream.platform_adapters.launchers.fake import FakeLauncher, FakeOutcome
from lodestream.platform_adapters.packing import Allocation
from lodestream.schemas.resources import JobSpec

SPEC = JobSpec(site="alpha", app="demo", workdir="demo/1")
ITEM = WorkItem(site="alpha", job_id=uuid.uuid4(), seq=5, spec=SPEC, attempt=1, msg=None)
RESULT = '{"ok": true, "result": 42}'


async def _ended(data_dir: Path) -> Tracked:
    workdir = data_dir / SPEC.workdir
    workdir.mkdir(parents=True, exist_ok=True)  # what the launcher does before the start
    spec = TaskSpec(job_id=str(ITEM.job_id), script="true", workdir=workdir, env={},
                    allocation=Allocation("j", ()), stdout_path=workdir / "out",
                    stderr_path=workdir / "err")  # fmt: skip
    return Tracked(FakeLauncher(FakeOutcome()).start(spec), 0.0)


def _write_result(data_dir: Path) -> None:
    path = data_dir / SPEC.workdir / PYRUN_RESULT
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(RESULT)


async def test_a_python_apps_result_file_is_read(tmp_path: Path) -> None:
    _write_result(tmp_path)
    end = run_end(ITEM, await _ended(tmp_path), 0, tmp_path, python_app=True)
    assert end.pyrun_result == RESULT


async def test_a_shell_apps_file_of_that_name_is_its_own_output_not_a_result(
    tmp_path: Path,
) -> None:
    _write_result(tmp_path)
    end = run_end(ITEM, await _ended(tmp_path), 0, tmp_path, python_app=False)
    assert end.pyrun_result is None


@pytest.mark.parametrize("python_app", [True, False])
async def test_no_result_file_is_no_result(tmp_path: Path, python_app: bool) -> None:
    end = run_end(ITEM, await _ended(tmp_path), 0, tmp_path, python_app=python_app)
    assert end.pyrun_result is None
