"""Launcher options as data, and a job's ``launch_params`` merged into them.

A backend renders its command line as a list of ``Option``s; ``with_launch_params`` adds the
job's extras and lets one replace an option the backend rendered (``{"--cpu-bind": "none"}``
instead of the backend's ``--cpu-bind=cores``). Options are matched by name, dashes stripped
and the backend's short aliases resolved, so ``-c`` and ``--cpus-per-task`` are one option
for srun.

``launch_params`` come with the job, that is from whoever holds an API token for the site,
while apps (what runs) are the site's own. So a job may only pass the options its backend lists
as safe: placement, binding and tuning knobs. Options that run programs or read files (srun's
``--task-prolog``, Hydra's ``-launcher-exec``, ``--export``/``-x``/``--env`` which could set
``LD_PRELOAD``, MCA parameters) are refused with ``InvalidLaunchParams``; a site widens the list
with the backend's ``allow_options``.

The list is checked against the words that will be run, not the request's keys: each allowed
option says whether it is a switch or takes a value (``Arity``), because a value given to a
switch would otherwise become a word of its own, that is a new option or the program
(``{"-l": "--export=…"}`` made srun run ``-l --export=… bash -c …``). A switch takes only
``""``; a value-taking option needs one; a value is one word that does not start with ``-``
(the shared rule ``schemas.resources.LAUNCH_VALUE_PATTERN``, checked again here because a job
on the log is hostile until checked). Backends whose parsers read ``--name=value`` (srun,
flux, jsrun: getopt_long) get every job option in that form under its long name, so the value
is inside the option's own word; the others take it as the next word.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

from lodestream.platform_adapters.errors import InvalidLaunchParams
from lodestream.schemas.resources import LAUNCH_KEY_PATTERN, LAUNCH_VALUE_PATTERN

_KEY = re.compile(LAUNCH_KEY_PATTERN)
_VALUE = re.compile(LAUNCH_VALUE_PATTERN)


class Arity(StrEnum):
    """How an option's parser reads what follows it."""

    SWITCH = "switch"  # no value
    VALUE = "value"  # exactly one value
    # A value or none (srun's ``--exclusive[=user]``); only where the value can be joined to
    # the option's word, otherwise it is a switch.
    OPTIONAL = "optional"


@dataclass(frozen=True, slots=True)
class Option:
    """One launcher option: ``flag``, its ``value`` (None: a switch), written joined or not."""

    flag: str
    value: str | None = None
    joined: bool = False

    def argv(self) -> list[str]:
        if self.value is None:
            return [self.flag]
        if self.joined:
            return [f"{self.flag}={self.value}"]
        return [self.flag, self.value]


@dataclass(frozen=True, slots=True)
class OptionStyle:
    """How a backend's parser reads options, and which of them a job may pass."""

    joins_long: bool
    aliases: Mapping[str, str]
    allowed: Mapping[str, Arity]
    # Options that may be given several times, told apart by the name before '=' in the value
    # (flux's `-o cpu-affinity=per-task -o gpu-affinity=per-task`).
    repeatable: frozenset[str] = frozenset()

    def canonical(self, flag: str) -> str:
        """The option's name without dashes, aliases resolved."""
        bare = flag.lstrip("-")
        return self.aliases.get(bare, bare)

    def name(self, flag: str, value: str | None) -> str:
        """The option's identity: its canonical name, and for a repeatable option the name its
        value sets."""
        bare = self.canonical(flag)
        if bare in self.repeatable and value:
            return f"{bare}:{value.split('=', 1)[0]}"
        return bare

    def option(self, flag: str, value: str | None = None) -> Option:
        """An option written the way this backend's parser reads it best."""
        return Option(flag, value, joined=self.joins_long and flag.startswith("--"))

    def job_option(self, flag: str, value: str | None) -> Option:
        """A job's option as it will be run: under its long name joined to its value where the
        parser reads that form, as written otherwise."""
        if self.joins_long:
            return Option(f"--{self.canonical(flag)}", value, joined=True)
        return Option(flag, value)


def job_options(
    params: Mapping[str, str], style: OptionStyle, extra_allowed: Mapping[str, Arity] | None = None
) -> list[Option]:
    """The job's ``launch_params`` as options; ``InvalidLaunchParams`` for anything else."""
    allowed = {**style.allowed, **(extra_allowed or {})}
    options: list[Option] = []
    for key, value in params.items():
        if not _KEY.fullmatch(key):
            raise InvalidLaunchParams(f"launch_params: {key!r} is not a command-line option")
        if not _VALUE.fullmatch(value):
            raise InvalidLaunchParams(
                f"launch_params: the value of {key} is not one word of letters, digits and "
                "'_.,:=+/@%-' that does not start with '-'"
            )
        name = style.name(key, value or None)
        arity = allowed.get(name)
        if arity is None:
            raise InvalidLaunchParams(
                f"launch_params: {key} is not an option a job may pass to this launcher; "
                f"allowed: {', '.join(sorted(allowed))}"
            )
        options.append(style.job_option(key, _checked_value(key, value, arity, style)))
    return options


def _checked_value(key: str, value: str, arity: Arity, style: OptionStyle) -> str | None:
    """The option's value, or None for a switch; ``InvalidLaunchParams`` where its arity and
    the value disagree."""
    takes_optional = arity is Arity.OPTIONAL and style.joins_long
    if value and (arity is Arity.SWITCH or (arity is Arity.OPTIONAL and not takes_optional)):
        raise InvalidLaunchParams(f'launch_params: {key} is a switch; give it the value ""')
    if not value and arity is Arity.VALUE:
        raise InvalidLaunchParams(f"launch_params: {key} needs a value")
    return value or None


def with_launch_params(
    rendered: list[Option],
    params: Mapping[str, str],
    style: OptionStyle,
    extra_allowed: Mapping[str, Arity] | None = None,
) -> list[str]:
    """The backend's options with the job's merged in (a job's option replaces the backend's
    of the same name), as argv words."""
    extra = job_options(params, style, extra_allowed)
    replaced = {style.name(o.flag, o.value) for o in extra}
    merged = [o for o in rendered if style.name(o.flag, o.value) not in replaced] + extra
    return [word for option in merged for word in option.argv()]
