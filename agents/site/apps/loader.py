"""Load the site's ``apps/*.py`` and describe them to the API.

Each file is imported as its own module under a name derived from its
absolute path, so two sites (or two files called ``util.py``) never share a
module, and nothing is added to ``sys.path``. Files starting with ``_`` are
skipped (helpers, ``__init__.py``). Any failure becomes one ``AppLoadError``
naming the file, the line and the reason, so ``lode site start`` can stop
with it.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import inspect
import json
import re
import sys
import traceback
import weakref
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

from lodestream.agents.site.apps.definition import ApplicationDefinition, defined_hooks
from lodestream.agents.site.apps.errors import AppLoadError

if TYPE_CHECKING:
    from lodestream.schemas.resources import App

_FINGERPRINT_SITE = "fingerprint"  # any valid slug: the fingerprint leaves the site out
VERSION_DIGITS = 16
# A hash of the file each app class was loaded from, as it was then: an app's version is of
# the file it came from, not of what the file holds when the version is asked for.
_SOURCES: weakref.WeakKeyDictionary[type, tuple[Path, bytes]] = weakref.WeakKeyDictionary()


def load_apps(apps_dir: Path) -> dict[str, type[ApplicationDefinition]]:
    """Every app defined in ``apps_dir/*.py``, by name; ``AppLoadError`` on the first problem."""
    if not apps_dir.is_dir():
        raise AppLoadError(apps_dir, None, "apps directory does not exist")
    apps: dict[str, type[ApplicationDefinition]] = {}
    for path in sorted(apps_dir.resolve().glob("*.py")):
        if path.name.startswith("_"):
            continue
        source = b""
        with contextlib.suppress(OSError):  # gone meanwhile: the import says so
            source = hashlib.sha256(path.read_bytes()).digest()
        module = _import(path)
        for app_cls in _defined_in(module):
            _SOURCES[app_cls] = (path, source)
            earlier = apps.get(app_cls.spec.name)
            if earlier is not None:
                first = f"{inspect.getfile(earlier)}:{_line_of(earlier)}"
                raise AppLoadError(
                    path,
                    _line_of(app_cls),
                    f"duplicate app name {app_cls.spec.name!r} (first defined at {first})",
                )
            apps[app_cls.spec.name] = app_cls
    return apps


def to_app_model(app_cls: type[ApplicationDefinition], site: str) -> App:
    """The app's interface as published in app.registered / app.updated; never its command."""
    return _interface(app_cls, site).model_copy(update={"version": app_version(app_cls)})


def _interface(app_cls: type[ApplicationDefinition], site: str) -> App:
    # Imported here: pydantic costs pyrun, which loads the apps in every Python job, ~0.25 s.
    from lodestream.schemas.resources import App, AppParameter, AppTransferSlot  # noqa: PLC0415

    spec = app_cls.spec
    return App(
        site=site,
        name=spec.name,
        description=spec.description,
        parameters={
            n: AppParameter(required=p.required, default=p.default, help=p.help, type=p.type)
            for n, p in spec.parameters.items()
        },
        transfers={
            n: AppTransferSlot(
                direction=t.direction,
                local_path=t.local_path,
                required=t.required,
                recursive=t.recursive,
                description=t.description,
                cache=t.cache,
                overwrite=t.overwrite,
                verify=t.verify,
            )
            for n, t in spec.transfers.items()
        },
        python=spec.is_python,
        hooks=defined_hooks(app_cls),
    )


def app_fingerprint(app_cls: type[ApplicationDefinition]) -> str:
    """Hash of the published interface (its version left out): what a submission must match."""
    model = _interface(app_cls, _FINGERPRINT_SITE).model_dump(
        mode="json", exclude={"site", "version"}
    )
    canonical = json.dumps(model, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def app_version(app_cls: type[ApplicationDefinition]) -> str:
    """The app's version: a hash of its interface and of the file that defines it, so an edit
    of its command or its ``run()`` is a new version too (16 hex digits; its file's content
    alone for a class not loaded from a file)."""
    digest = hashlib.sha256(app_fingerprint(app_cls).encode())
    digest.update(_SOURCES.get(app_cls, (None, b""))[1])
    return digest.hexdigest()[:VERSION_DIGITS]


def source_file(app_cls: type[ApplicationDefinition]) -> Path | None:
    """The file ``load_apps`` loaded ``app_cls`` from (still known once a later import of
    the file failed and took its module away); None for a class not loaded so."""
    loaded = _SOURCES.get(app_cls)
    return None if loaded is None else loaded[0]


def _module_name(path: Path) -> str:
    digest = hashlib.sha256(str(path).encode()).hexdigest()[:16]
    return f"lode_site_app_{digest}_{re.sub(r'[^A-Za-z0-9_]', '_', path.stem)}"


def _import(path: Path) -> ModuleType:
    name = _module_name(path)
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise AppLoadError(path, None, "cannot be imported as a Python module")
    module = importlib.util.module_from_spec(spec)
    # Registered before running so dataclasses, pickle and inspect can find the module.
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except SyntaxError as exc:
        sys.modules.pop(name, None)
        raise AppLoadError(path, exc.lineno, f"SyntaxError: {exc.msg}") from exc
    except (Exception, SystemExit) as exc:
        sys.modules.pop(name, None)
        raise AppLoadError(path, _line_in(path, exc), f"{type(exc).__name__}: {exc}") from exc
    return module


def _line_in(path: Path, exc: BaseException) -> int | None:
    """The deepest line of ``path`` on the traceback: where the file itself went wrong."""
    line = None
    for frame in traceback.extract_tb(exc.__traceback__):
        if Path(frame.filename) == path:
            line = frame.lineno
    return line


def _defined_in(module: ModuleType) -> list[type[ApplicationDefinition]]:
    found: list[type[ApplicationDefinition]] = []
    for value in vars(module).values():
        if (
            isinstance(value, type)
            and issubclass(value, ApplicationDefinition)
            and value.__module__ == module.__name__
            and not value.abstract
            and value not in found
        ):
            found.append(value)
    return found


def _line_of(app_cls: type) -> int | None:
    try:
        return inspect.getsourcelines(app_cls)[1]
    except (OSError, TypeError):
        return None
