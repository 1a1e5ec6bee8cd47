"""The installed distribution claims one top-level name, ``lodestream``.

The repository keeps its fixed top-level directories (``schemas/``,
``services/``, ...); they are installed as subpackages of ``lodestream``. This
builds the wheel from a copy of the tree (no network, no build isolation),
installs it into a fresh virtual environment and uses it from there, away from
the repository, so nothing can be found through the working tree by accident.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
# What a copy of the tree leaves out: build outputs, caches, state, the venv.
NOT_SOURCE = shutil.ignore_patterns(
    ".git", ".venv", ".lode", "build", "dist", "*.egg-info", "__pycache__", ".*_cache",
    ".hypothesis", "out", "tests",
)  # fmt: skip
REPOSITORY_DIRECTORIES = ("schemas", "services", "agents", "client", "infra", "platform_adapters")


def run(argv: list[str | Path], cwd: Path, env: dict[str, str]) -> str:
    done = subprocess.run(
        argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, f"{argv} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, dict[str, str]]:
    """(the wheel, the fresh venv, an environment that does not see the repository)."""
    root = tmp_path_factory.mktemp("wheel")
    source = root / "src"
    shutil.copytree(REPO, source, symlinks=True, ignore=NOT_SOURCE)
    env = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "VIRTUAL_ENV"}}
    run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
         "--no-index", "--wheel-dir", root / "dist", source],
        root, env,
    )  # fmt: skip
    (wheel,) = (root / "dist").glob("lodestream-*.whl")
    venv = root / "venv"
    run([sys.executable, "-m", "venv", "--without-pip", venv], root, env)
    python = venv / "bin" / "python"
    run(
        [sys.executable, "-m", "pip", "--python", python, "install", "--quiet", "--no-deps",
         "--no-index", wheel],
        root, env,
    )  # fmt: skip
    # The dependencies come from the development environment, added after the
    # fresh site-packages (a path from a .pth is appended), so lodestream itself
    # can only be the installed wheel. That directory's own .pth files (the
    # editable install's finder among them) are not processed from there.
    (site,) = (venv / "lib").glob("python3.*/site-packages")
    (site / "_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return wheel, venv, env


def test_the_wheel_holds_one_top_level_name(installed: tuple[Path, Path, dict[str, str]]) -> None:
    wheel, _, _ = installed
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        (entry_points,) = (n for n in names if n.endswith(".dist-info/entry_points.txt"))
        scripts = archive.read(entry_points).decode()
    tops = {name.split("/", 1)[0] for name in names}
    assert tops == {"lodestream", "lodestream-0.1.0.dist-info"}
    for directory in REPOSITORY_DIRECTORIES:
        assert f"lodestream/{directory}/__init__.py" in names
    # Data the running code reads is in the wheel, not only the source tree.
    assert "lodestream/infra/postgres/alembic.ini" in names
    assert "lodestream/infra/postgres/roles.sql" in names
    assert "lodestream/agents/site/apps/examples/eigh.py" in names
    assert "lodestream/platform_adapters/compute/machines/polaris.yaml" in names
    for asset in ("index.html", "dashboard.js", "dashboard.css"):  # the dashboard, /ui
        assert f"lodestream/services/api/ui/{asset}" in names
    assert scripts.split() == ["[console_scripts]", "lode", "=", "lodestream.client.cli.main:app"]


def test_the_venv_gains_only_lodestream_and_its_script(
    installed: tuple[Path, Path, dict[str, str]],
) -> None:
    _, venv, _ = installed
    (site,) = (venv / "lib").glob("python3.*/site-packages")
    assert {p.name for p in site.iterdir()} == {
        "lodestream", "lodestream-0.1.0.dist-info", "_dependencies.pth",
    }  # fmt: skip
    assert (venv / "bin" / "lode").is_file()


def test_lode_and_the_sdk_run_from_the_installed_wheel(
    installed: tuple[Path, Path, dict[str, str]], tmp_path: Path
) -> None:
    _, venv, env = installed
    help_text = run([venv / "bin" / "lode", "--help"], tmp_path, env)
    assert "Usage: lode" in help_text
    assert "up" in help_text
    where = run(
        [venv / "bin" / "python", "-I", "-c",
         "import lodestream.client.sdk as sdk; print(sdk.LodeClient.__module__, sdk.__file__)"],
        tmp_path, env,
    )  # fmt: skip
    module, path = where.split()
    assert module == "lodestream.client.sdk"
    assert Path(path).is_relative_to(venv)
    # Package data is read through importlib.resources, from the wheel too.
    machine = run(
        [venv / "bin" / "python", "-I", "-c",
         "from lodestream.platform_adapters.compute import load_machine as m; "
         "print(m('polaris').launcher)"],
        tmp_path, env,
    )  # fmt: skip
    assert machine.strip() == "pals"
    # None of the repository's directory names is claimed as a top-level import.
    probe = "import importlib.util as u, sys; print([n for n in sys.argv[1:] if u.find_spec(n)])"
    python = venv / "bin" / "python"
    claimed = run([python, "-I", "-c", probe, *REPOSITORY_DIRECTORIES], tmp_path, env)
    assert claimed.strip() == "[]"
