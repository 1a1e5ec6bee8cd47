"""A job's parameter values and the types an app may declare for them.

One rule for the API (which checks a submission against the app its site registered) and
the site (which checks the job again before it renders or runs it). Values are JSON: a
shell app's template renders each as one word (``agents/site/apps/render.py``), a
Python-function app's ``run()`` receives them as they are. Kept free of pydantic: pyrun
imports it in every Python job.
"""

from __future__ import annotations

from typing import Final, Literal, get_args

ParamType = Literal["str", "int", "float", "bool", "list", "dict", "any"]
PARAM_TYPES: Final[tuple[str, ...]] = get_args(ParamType)
SHELL_DEFAULT_TYPE: Final[ParamType] = "str"
PYTHON_DEFAULT_TYPE: Final[ParamType] = "any"
# A job's parameters, as JSON text: they travel in every event of the job that carries its
# spec, and a Python app's go through a file, so they are kept small (data is for bulk).
MAX_PARAMETERS_BYTES: Final = 64 * 1024
# A job of many calls (``calls``): their parameter sets, each like ``parameters``, in one
# list under the same byte limit. Enough for thousands of small calls in one job.
MAX_CALLS: Final = 10_000

_PYTHON_TYPES: Final[dict[str, tuple[type, ...]]] = {
    "str": (str,),
    "int": (int,),
    "float": (int, float),  # 5 is a fine value for a float parameter
    "bool": (bool,),
    "list": (list, tuple),
    "dict": (dict,),
}


def default_type(python: bool) -> ParamType:
    """The type of a parameter that declares none: ``any`` for Python apps, ``str`` for shell."""
    return PYTHON_DEFAULT_TYPE if python else SHELL_DEFAULT_TYPE


def type_problem(declared: str, value: object) -> str | None:
    """Why ``value`` is not of the ``declared`` type, or None if it is.

    ``bool`` is not an ``int`` here (JSON keeps them apart), and ``any`` takes every value.
    """
    if declared == "any":
        return None
    kinds = _PYTHON_TYPES[declared]
    if isinstance(value, bool) and bool not in kinds:
        return f"must be {_article(declared)}, not a bool"
    if isinstance(value, kinds):
        return None
    return f"must be {_article(declared)}, not {json_kind(value)}"


def json_kind(value: object) -> str:
    """``value``'s kind in JSON's words, as a message shows it."""
    for kind, name in _KIND_NAMES:  # bool before int: a bool is an int to isinstance
        if isinstance(value, kind):
            return name
    return "null" if value is None else type(value).__name__


_KIND_NAMES: Final[tuple[tuple[type, str], ...]] = (
    (bool, "a bool"), (int, "an int"), (float, "a float"), (str, "a string"),
    (list, "a list"), (tuple, "a list"), (dict, "a dict"),
)  # fmt: skip


def _article(declared: str) -> str:
    return {"str": "a string", "int": "an int"}.get(declared, f"a {declared}")
