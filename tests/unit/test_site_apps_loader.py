"""Loading the site's apps/ directory, and the App model the agent publishes."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from lodestream.agents.site.apps import AppLoadError, app_fingerprint, load_apps, to_app_model
from lodestream.agents.site.apps.loader import app_version
from lodestream.schemas.resources import App, AppParameter, AppTransferSlot

GOOD = '''
from lodestream.agents.site.apps import ApplicationDefinition, Decision, Parameter, TransferSlot


class Sim(ApplicationDefinition):
    """Runs the simulation."""

    command_template = "sim --steps {{ steps }} --out {{ out }}"
    parameters = {
        "steps": Parameter(help="time steps"),
        "out": {"default": "out.h5"},
    }
    transfers = {
        "mesh": TransferSlot(direction="in", local_path="mesh.h5", required=True, cache=True)
    }

    def postprocess(self) -> None:
        pass


class Base(ApplicationDefinition, abstract=True):
    def handle_error(self) -> Decision:
        return Decision.FAIL


class Fit(Base):
    name = "fit"

    def run(self, n: str) -> int:
        return int(n)
'''


def write(apps: Path, name: str, source: str) -> Path:
    apps.mkdir(exist_ok=True)
    path = apps / name
    path.write_text(textwrap.dedent(source).lstrip("\n"))
    return path


@pytest.fixture
def apps(tmp_path: Path) -> Path:
    return tmp_path / "apps"


def load_error(apps: Path) -> AppLoadError:
    with pytest.raises(AppLoadError) as info:
        load_apps(apps)
    return info.value


def test_loads_every_public_file_and_skips_helpers(apps: Path) -> None:
    write(apps, "sim.py", GOOD)
    write(
        apps,
        "more.py",
        """
        from lodestream.agents.site.apps import ApplicationDefinition
        class Echo(ApplicationDefinition):
            command_template = "echo {{ x }}"
    """,
    )
    write(apps, "_helpers.py", "raise RuntimeError('never imported')\n")
    write(apps, "__init__.py", "raise RuntimeError('never imported')\n")
    (apps / "notes.txt").write_text("not python")
    loaded = load_apps(apps)
    assert sorted(loaded) == ["Echo", "Sim", "fit"]
    assert loaded["fit"].spec.is_python


def test_empty_directory_has_no_apps(apps: Path) -> None:
    apps.mkdir()
    assert load_apps(apps) == {}


def test_missing_directory(apps: Path) -> None:
    assert str(load_error(apps)) == f"{apps}: apps directory does not exist"


def test_syntax_error_names_file_and_line(apps: Path) -> None:
    write(apps, "good.py", GOOD)
    path = write(apps, "broken.py", "x = 1\n\ndef f(:\n    pass\n")
    error = load_error(apps)
    assert (error.path, error.line) == (path.resolve(), 3)
    assert str(error).startswith(f"{path.resolve()}:3: SyntaxError: ")


def test_missing_import_names_file_line_and_module(apps: Path) -> None:
    path = write(apps, "needs.py", "import os\n\nimport no_such_module_for_lode\n")
    error = load_error(apps)
    assert str(error) == (
        f"{path.resolve()}:3: ModuleNotFoundError: No module named 'no_such_module_for_lode'"
    )


def test_error_while_importing_points_at_the_files_own_line(apps: Path) -> None:
    path = write(apps, "boom.py", "def f():\n    return 1 / 0\n\n\nVALUE = f()\n")
    error = load_error(apps)
    assert str(error) == f"{path.resolve()}:2: ZeroDivisionError: division by zero"


def test_invalid_definition_names_file_class_line_and_reason(apps: Path) -> None:
    path = write(apps, "bad.py", '''
        from lodestream.agents.site.apps import ApplicationDefinition


        class Quoted(ApplicationDefinition):
            command_template = 'echo "{{ msg }}"'
    ''')  # fmt: skip
    error = load_error(apps)
    assert error.line == 4
    assert str(error).startswith(
        f"{path.resolve()}:4: AppDefinitionError: ApplicationDefinition Quoted: command_template: "
        "placeholder '{{ msg }}' is inside a \"...\" quoted string"
    )


def test_duplicate_names_across_files(apps: Path) -> None:
    first = write(apps, "a.py", GOOD)
    second = write(apps, "b.py", '''
        from lodestream.agents.site.apps import ApplicationDefinition


        class Other(ApplicationDefinition):
            name = "fit"
            command_template = "fit"
    ''')  # fmt: skip
    fit_line = GOOD.lstrip("\n").splitlines().index("class Fit(Base):") + 1
    error = load_error(apps)
    assert str(error) == (
        f"{second.resolve()}:4: duplicate app name 'fit' "
        f"(first defined at {first.resolve()}:{fit_line})"
    )


def test_duplicate_names_within_one_file(apps: Path) -> None:
    path = write(apps, "twice.py", '''
        from lodestream.agents.site.apps import ApplicationDefinition


        class One(ApplicationDefinition):
            name = "same"
            command_template = "one"


        class Two(ApplicationDefinition):
            name = "same"
            command_template = "two"
    ''')  # fmt: skip
    assert str(load_error(apps)).startswith(f"{path.resolve()}:9: duplicate app name 'same'")


def test_imported_apps_are_not_registered_twice(apps: Path) -> None:
    write(apps, "reuse.py", '''
        from lodestream.agents.site.apps import ApplicationDefinition
        from lodestream.agents.site.apps.examples.eigh import Eigh


        class Local(ApplicationDefinition):
            command_template = "true"
    ''')  # fmt: skip
    assert sorted(load_apps(apps)) == ["Local"]


def test_same_file_name_in_two_sites_stays_apart(tmp_path: Path) -> None:
    one, two = tmp_path / "one", tmp_path / "two"
    write(one, "app.py", "from lodestream.agents.site.apps import ApplicationDefinition\n"
          "class A(ApplicationDefinition):\n    command_template = 'one'\n")  # fmt: skip
    write(two, "app.py", "from lodestream.agents.site.apps import ApplicationDefinition\n"
          "class A(ApplicationDefinition):\n    command_template = 'two'\n")  # fmt: skip
    a1, a2 = load_apps(one)["A"], load_apps(two)["A"]
    assert a1.__module__ != a2.__module__
    assert (a1.spec.command_template, a2.spec.command_template) == ("one", "two")
    assert load_apps(one)["A"].spec.command_template == "one"


def test_app_model_describes_interface_never_command(apps: Path) -> None:
    write(apps, "sim.py", GOOD)
    loaded = load_apps(apps)
    sim = to_app_model(loaded["Sim"], "theta")
    assert sim.version == app_version(loaded["Sim"])
    assert sim.model_copy(update={"version": ""}) == App(
        site="theta",
        name="Sim",
        description="Runs the simulation.",
        parameters={
            "steps": AppParameter(required=True, default=None, help="time steps", type="str"),
            "out": AppParameter(required=False, default="out.h5", type="str"),
        },
        transfers={
            "mesh": AppTransferSlot(direction="in", local_path="mesh.h5", required=True, cache=True)
        },
        python=False,
        hooks=("postprocess",),
    )
    assert "sim --steps" not in sim.model_dump_json()
    fit = to_app_model(loaded["fit"], "theta")
    assert (fit.python, fit.hooks, list(fit.parameters)) == (True, ("handle_error",), ["n"])
    assert App.model_validate_json(fit.model_dump_json()) == fit


def test_fingerprint_is_stable_and_changes_only_with_the_interface(tmp_path: Path) -> None:
    def fingerprint(source: str, where: str) -> str:
        apps = tmp_path / where
        write(apps, "app.py", source)
        return app_fingerprint(load_apps(apps)["A"])

    header = (
        "from lodestream.agents.site.apps import ApplicationDefinition\n"
        "class A(ApplicationDefinition):\n"
    )
    base = fingerprint(header + "    command_template = 'a {{ x }} {{ y }}'\n", "base")
    assert len(base) == 64
    assert base == fingerprint(header + "    command_template = 'a {{ x }} {{ y }}'\n", "again")
    # The command is not published, so changing only it needs no app.updated.
    assert base == fingerprint(header + "    command_template = 'b {{ x }} {{ y }}'\n", "cmd")
    assert base == fingerprint(header + "    command_template = 'b {{ y }} {{ x }}'\n", "order")
    assert base != fingerprint(header + "    command_template = 'a {{ x }}'\n", "fewer")
    assert base != fingerprint(
        header + "    command_template = 'a {{ x }} {{ y }}'\n"
        "    parameters = {'y': {'help': 'now documented'}}\n", "help"
    )  # fmt: skip
    assert base != fingerprint(header + "    '''Described.'''\n"
                               "    command_template = 'a {{ x }} {{ y }}'\n", "doc")  # fmt: skip
    assert base != fingerprint(
        header + "    command_template = 'a {{ x }} {{ y }}'\n"
        "    def preprocess(self) -> None:\n        pass\n", "hook"
    )  # fmt: skip


def test_examples_load(tmp_path: Path) -> None:
    examples = Path(__file__).resolve().parents[2] / "agents" / "site" / "apps" / "examples"
    loaded = load_apps(examples)
    assert sorted(loaded) == ["eigh", "eigh_py"]
    eigh = to_app_model(loaded["eigh"], "local")
    assert eigh.parameters == {
        "n": AppParameter(required=True, help="matrix size, 1..20000", type="str"),
        "seed": AppParameter(
            required=False, default="0", help="seed of numpy's default_rng", type="str"
        ),
    }
    assert eigh.hooks == ("preprocess", "postprocess", "handle_error")
    python = to_app_model(loaded["eigh_py"], "local").parameters
    assert python == {n: p.model_copy(update={"type": "any"}) for n, p in eigh.parameters.items()}


def test_a_version_changes_with_the_file_the_fingerprint_with_the_interface(apps: Path) -> None:
    write(apps, "sim.py", GOOD)
    first = load_apps(apps)["Sim"]
    write(apps, "sim.py", GOOD + "\n# a comment, or a new command: a new version\n")
    edited = load_apps(apps)["Sim"]
    assert app_fingerprint(edited) == app_fingerprint(first)
    assert app_version(edited) != app_version(first)
    assert len(app_version(edited)) == 16
    write(apps, "sim.py", GOOD)
    assert app_version(load_apps(apps)["Sim"]) == app_version(first)
