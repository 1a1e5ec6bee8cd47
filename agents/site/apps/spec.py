"""What an ApplicationDefinition declares, checked once when its class is created.

``build_spec`` turns the class attributes a site author writes (plain dicts
allowed) into one frozen ``AppSpec``; every other module reads the spec,
never the raw attributes.
"""

from __future__ import annotations

import inspect
import json
import math
import re
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Final, Literal

from lodestream.agents.site.apps.errors import AppDefinitionError
from lodestream.agents.site.apps.template import is_parameter_name, placeholders
from lodestream.schemas.params import PARAM_TYPES, default_type, type_problem

APP_NAME: Final = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,79}$")  # schemas.resources.AppName
SLOT_NAME: Final = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]{0,63}$")  # schemas.resources.SlotName
ENV_NAME: Final = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
HOOKS: Final = ("preprocess", "postprocess", "handle_error", "handle_timeout", "shell_preamble")
_PARAMETER_KEYS: Final = frozenset({"required", "default", "help", "type"})
_SLOT_KEYS: Final = frozenset(
    {"direction", "local_path", "required", "recursive", "description", "cache", "overwrite",
     "verify"}
)  # fmt: skip
MAX_RETRY_BUDGET: Final = 100  # the most retries a site or an app may allow
BACKOFF_KEYS: Final = ("base_s", "factor", "max_s", "jitter")  # schemas.retry.RetryBackoff


class Parameter:
    """One parameter. ``required`` defaults to "no default given"; ``type`` (one of
    ``schemas.params.PARAM_TYPES``) to the app kind's: ``any`` for a Python-function app,
    ``str`` for a shell app. A default is a JSON value of the parameter's type."""

    __slots__ = ("default", "help", "required", "type")

    def __init__(
        self,
        *,
        required: bool | None = None,
        default: object = None,
        help: str = "",
        type: str | None = None,
    ) -> None:
        self.required: bool = default is None if required is None else required
        self.default = default
        self.help = help
        self.type = type

    def _key(self) -> tuple[object, ...]:
        return (self.required, self.default, self.help, self.type)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Parameter):
            return NotImplemented
        return self._key() == other._key()

    def __hash__(self) -> int:
        return hash(repr(self._key()))

    def __repr__(self) -> str:
        return (
            f"Parameter(required={self.required!r}, default={self.default!r}, "
            f"help={self.help!r}, type={self.type!r})"
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class TransferSlot:
    """A named place for staged data; ``local_path`` is relative to the job's workdir."""

    direction: Literal["in", "out"]
    local_path: str
    required: bool = False
    recursive: bool = False
    description: str = ""
    # An input that pilots may keep in node-local caches, keyed by its source and version,
    # and offer to the jobs that read it again (agents/launcher/cache.py).
    cache: bool = False
    # An existing destination: "never" (kept unless it holds the same bytes), "always",
    # "if-newer"; a job's transfer spec may override it. verify: check what is moved.
    # docs/transfers.md, "Overwrite" and "Integrity".
    overwrite: Literal["never", "always", "if-newer"] = "never"
    verify: bool = False


@dataclass(frozen=True, slots=True)
class AppSpec:
    name: str
    description: str
    command_template: str | None
    placeholders: tuple[str, ...]
    parameters: Mapping[str, Parameter]
    environment_variables: Mapping[str, str] = field(default_factory=dict)
    cleanup_files: tuple[str, ...] = ()
    transfers: Mapping[str, TransferSlot] = field(default_factory=dict)
    python_exe: str = sys.executable
    retry_budget: int | None = None  # None: the site's processing.retry_budget
    retry_backoff: Mapping[str, float] = field(default_factory=dict)  # over the site's

    @property
    def is_python(self) -> bool:
        return self.command_template is None


def build_spec(cls: type) -> AppSpec:
    """Validate ``cls`` and return its spec; ``AppDefinitionError`` names the class and the fix."""
    label = f"ApplicationDefinition {cls.__name__}"

    def fail(reason: str) -> AppDefinitionError:
        return AppDefinitionError(f"{label}: {reason}")

    name = cls.__dict__.get("name", cls.__name__)
    if not isinstance(name, str) or not APP_NAME.match(name):
        raise fail(f"name {name!r} must match {APP_NAME.pattern}")
    description = cls.__dict__.get("description", _summary(cls.__doc__))
    if not isinstance(description, str):
        raise fail("description must be a string")
    check_hooks(cls)

    template = getattr(cls, "command_template", None)
    run = inspect.getattr_static(cls, "run", None)
    if (template is None) == (run is None):
        raise fail("define exactly one of command_template (a shell command) or run() (Python)")
    declared = _declared_parameters(
        getattr(cls, "_declared_parameters", {}), default_type(python=template is None), fail
    )
    if template is not None:
        if not isinstance(template, str) or not template.strip() or "\x00" in template:
            raise fail("command_template must be a non-empty string")
        try:
            used = placeholders(template)
        except ValueError as exc:
            raise fail(f"command_template: {exc}") from exc
        unused = sorted(set(declared) - set(used))
        if unused:
            raise fail(
                f"parameters {unused} are declared but not used in command_template "
                f"(placeholders: {list(used)})"
            )
        shell_str = default_type(python=False)
        parameters = {
            **declared,
            **{p: Parameter(type=shell_str) for p in used if p not in declared},
        }
        template = template.strip()
    else:
        used = ()
        parameters = _run_parameters(run, declared, fail)

    python_exe = getattr(cls, "python_exe", sys.executable)
    if not isinstance(python_exe, str) or not python_exe:
        raise fail("python_exe must be a non-empty string")
    return AppSpec(
        name=name,
        description=description,
        command_template=template,
        placeholders=used,
        parameters=parameters,
        environment_variables=_environment(getattr(cls, "environment_variables", {}), fail),
        cleanup_files=_cleanup(getattr(cls, "cleanup_files", []), fail),
        transfers=_transfers(getattr(cls, "transfers", {}), fail),
        python_exe=python_exe,
        retry_budget=_retry_budget(getattr(cls, "retry_budget", None), fail),
        retry_backoff=_retry_backoff(getattr(cls, "retry_backoff", {}), fail),
    )


Fail = Callable[[str], AppDefinitionError]


def _summary(doc: str | None) -> str:
    lines = inspect.cleandoc(doc).splitlines() if doc else []
    return lines[0].strip() if lines else ""


def check_hooks(cls: type) -> None:
    """Hooks defined on ``cls`` itself take only ``self`` and are plain (not async) methods."""

    def fail(reason: str) -> AppDefinitionError:
        return AppDefinitionError(f"ApplicationDefinition {cls.__name__}: {reason}")

    for hook in HOOKS:
        if hook not in cls.__dict__:
            continue
        func = cls.__dict__[hook]
        if not inspect.isfunction(func) or inspect.iscoroutinefunction(func):
            raise fail(f"{hook} must be a plain method: def {hook}(self)")
        params = list(inspect.signature(func).parameters.values())
        if len(params) != 1 or params[0].kind is not params[0].POSITIONAL_OR_KEYWORD:
            raise fail(f"{hook} must take only self (read the job from self.job): def {hook}(self)")


def _parameter(name: str, raw: object, kind: str, fail: Fail) -> Parameter:
    """The declared parameter, checked, with its type filled in (``kind``: the app's default)."""
    if not is_parameter_name(name):
        raise fail(f"parameter name {name!r} must be a Python identifier of at most 64 characters")
    if isinstance(raw, Mapping):
        extra = sorted(set(raw) - _PARAMETER_KEYS)
        if extra:
            known = ", ".join(sorted(_PARAMETER_KEYS))
            raise fail(f"parameter {name!r}: unknown keys {extra}; known: {known}")
        raw = Parameter(**raw)
    if not isinstance(raw, Parameter):
        raise fail(f"parameter {name!r} must be a Parameter or a dict, not {type(raw).__name__}")
    declared = kind if raw.type is None else raw.type
    if declared not in PARAM_TYPES:
        raise fail(f"parameter {name!r}: type {declared!r} is not one of {', '.join(PARAM_TYPES)}")
    if not isinstance(raw.required, bool) or not isinstance(raw.help, str):
        raise fail(f"parameter {name!r}: required must be a bool and help a string")
    if raw.required and raw.default is not None:
        raise fail(f"parameter {name!r} is required but has a default; drop one of them")
    if not raw.required and raw.default is None:
        raise fail(f"parameter {name!r} is optional, so it needs a default")
    if raw.default is not None:
        problem = type_problem(declared, raw.default) or _json_problem(raw.default)
        if problem is not None:
            raise fail(f"parameter {name!r}: default {raw.default!r} {problem}")
    return Parameter(required=raw.required, default=raw.default, help=raw.help, type=declared)


def _json_problem(value: object) -> str | None:
    """Why ``value`` cannot be a parameter's default (it travels as JSON), or None."""
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as exc:
        return f"is not a JSON value ({exc})"
    return None


def _declared_parameters(raw: object, kind: str, fail: Fail) -> dict[str, Parameter]:
    if not isinstance(raw, Mapping):
        raise fail("parameters must be a dict of name -> Parameter or dict")
    return {name: _parameter(name, value, kind, fail) for name, value in raw.items()}


def _run_parameters(
    run: object, declared: dict[str, Parameter], fail: Fail
) -> dict[str, Parameter]:
    if not inspect.isfunction(run) or inspect.iscoroutinefunction(run):
        raise fail("run must be a plain method: def run(self, ...)")
    if inspect.isgeneratorfunction(run):
        raise fail("run must return its result, not yield it")
    params = list(inspect.signature(run).parameters.values())
    if not params or params[0].kind is not params[0].POSITIONAL_OR_KEYWORD:
        raise fail("run must take self first: def run(self, ...)")
    found: dict[str, Parameter] = {}
    for p in params[1:]:
        if p.kind not in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY):
            raise fail(f"run: argument {p} must be a named argument (no *args, **kwargs, or /)")
        given = declared.get(p.name)
        kind = given.type if given is not None and given.type else default_type(python=True)
        if p.default is p.empty:
            found[p.name] = _parameter(p.name, Parameter(type=kind), kind, fail)
        elif p.default is None:
            raise fail(
                f"run: default of {p.name!r} is None, which means no default here; "
                "give a JSON value (a string, number, bool, list or dict)"
            )
        else:
            found[p.name] = _parameter(p.name, Parameter(default=p.default, type=kind), kind, fail)
    for name, given in declared.items():
        if name not in found:
            raise fail(f"parameter {name!r} is declared but run() has no such argument")
        if given.default is not None and given.default != found[name].default:
            raise fail(f"parameter {name!r}: its default comes from run()'s signature")
        found[name] = Parameter(
            required=found[name].required, default=found[name].default, help=given.help,
            type=found[name].type,
        )  # fmt: skip
    return found


def _environment(raw: object, fail: Fail) -> dict[str, str]:
    if not isinstance(raw, Mapping):
        raise fail("environment_variables must be a dict of str -> str")
    for key, value in raw.items():
        if not isinstance(key, str) or not ENV_NAME.match(key):
            raise fail(f"environment variable name {key!r} is not a valid shell name")
        if not isinstance(value, str) or "\x00" in value:
            raise fail(f"environment variable {key}: value must be a string without NUL")
    return dict(raw)


def _relative(path: object) -> bool:
    if not isinstance(path, str) or not path or "\x00" in path:
        return False
    pure = PurePosixPath(path)
    return not pure.is_absolute() and ".." not in pure.parts


def _cleanup(raw: object, fail: Fail) -> tuple[str, ...]:
    if isinstance(raw, str) or not isinstance(raw, list | tuple):
        raise fail("cleanup_files must be a list of glob patterns")
    for pattern in raw:
        if not _relative(pattern):
            raise fail(f"cleanup_files: {pattern!r} must be a glob inside the workdir (no '..')")
    return tuple(raw)


def _transfers(raw: object, fail: Fail) -> dict[str, TransferSlot]:
    if not isinstance(raw, Mapping):
        raise fail("transfers must be a dict of slot name -> TransferSlot")
    slots: dict[str, TransferSlot] = {}
    for slot, given in raw.items():
        if not isinstance(slot, str) or not SLOT_NAME.match(slot):
            raise fail(f"transfer slot name {slot!r} must match {SLOT_NAME.pattern}")
        value = given
        if isinstance(given, Mapping):
            extra = sorted(set(given) - _SLOT_KEYS)
            if extra:
                raise fail(f"transfer slot {slot!r} has unknown keys {extra}")
            try:
                value = TransferSlot(**given)
            except TypeError as exc:
                raise fail(f"transfer slot {slot!r}: {exc}") from exc
        if not isinstance(value, TransferSlot):
            raise fail(f"transfer slot {slot!r} must be a TransferSlot or a dict")
        if value.direction not in ("in", "out"):
            raise fail(f"transfer slot {slot!r}: direction must be 'in' or 'out'")
        if not _relative(value.local_path):
            raise fail(f"transfer slot {slot!r}: local_path must be relative to the workdir")
        if value.cache and value.direction != "in":
            raise fail(f"transfer slot {slot!r}: only an input (direction 'in') can be cached")
        if value.overwrite not in ("never", "always", "if-newer"):
            raise fail(f"transfer slot {slot!r}: overwrite must be never, always or if-newer")
        slots[slot] = value
    return slots


def _retry_budget(raw: object, fail: Fail) -> int | None:
    if raw is None:
        return None
    if isinstance(raw, bool) or not isinstance(raw, int) or not 0 <= raw <= MAX_RETRY_BUDGET:
        raise fail(f"retry_budget must be None (the site's) or an int from 0 to {MAX_RETRY_BUDGET}")
    return raw


def _retry_backoff(raw: object, fail: Fail) -> dict[str, float]:
    """Keys and types only: the ranges are the site settings' own (checked at agent start,
    against the merged values), and pydantic is not imported here (see loader.to_app_model)."""
    if not isinstance(raw, Mapping):
        raise fail(f"retry_backoff must be a dict with any of {list(BACKOFF_KEYS)}")
    unknown = sorted(str(key) for key in set(raw) - set(BACKOFF_KEYS))
    if unknown:
        raise fail(f"retry_backoff has unknown keys {unknown}; known: {', '.join(BACKOFF_KEYS)}")
    backoff: dict[str, float] = {}
    for key, value in raw.items():
        number = isinstance(value, int | float) and not isinstance(value, bool)
        if not number or not math.isfinite(value):
            raise fail(f"retry_backoff[{key!r}] must be a finite number, not {value!r}")
        backoff[key] = float(value)
    return backoff
