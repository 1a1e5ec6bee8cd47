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
with the backend's ``allow_options``. Values go into argv as given, never through a shell.

A key is written as on the command line (``--cpu-bind``, ``-d``); the value ``""`` makes a
switch (``{"--overlap": ""}``). A long option with a value is rendered ``--name=value`` by
backends whose parsers take that form (srun, flux, jsrun) and as two words otherwise.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from lodestream.platform_adapters.errors import InvalidLaunchParams

_KEY = re.compile(r"-{1,2}[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
_MAX_VALUE = 4096


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
    allowed: frozenset[str]
    # Options that may be given several times, told apart by the name before '=' in the value
    # (flux's `-o cpu-affinity=per-task -o gpu-affinity=per-task`).
    repeatable: frozenset[str] = frozenset()

    def name(self, flag: str, value: str | None) -> str:
        """The option's identity: its name without dashes, aliases resolved."""
        bare = flag.lstrip("-")
        bare = self.aliases.get(bare, bare)
        if bare in self.repeatable and value:
            return f"{bare}:{value.split('=', 1)[0]}"
        return bare

    def option(self, flag: str, value: str | None = None) -> Option:
        """An option written the way this backend's parser reads it best."""
        return Option(flag, value, joined=self.joins_long and flag.startswith("--"))


def job_options(
    params: Mapping[str, str], style: OptionStyle, extra_allowed: Iterable[str] = ()
) -> list[Option]:
    """The job's ``launch_params`` as options; ``InvalidLaunchParams`` for anything else."""
    allowed = style.allowed | frozenset(extra_allowed)
    options: list[Option] = []
    for key, value in params.items():
        if not _KEY.fullmatch(key):
            raise InvalidLaunchParams(f"launch_params: {key!r} is not a command-line option")
        if "\0" in value or len(value) > _MAX_VALUE or any(c in value for c in "\n\r"):
            raise InvalidLaunchParams(f"launch_params: the value of {key} is not one line")
        option = style.option(key, value or None)
        name = style.name(key, option.value)
        if name not in allowed:
            raise InvalidLaunchParams(
                f"launch_params: {key} is not an option a job may pass to this launcher; "
                f"allowed: {', '.join(sorted(allowed))}"
            )
        options.append(option)
    return options


def with_launch_params(
    rendered: list[Option],
    params: Mapping[str, str],
    style: OptionStyle,
    extra_allowed: Iterable[str] = (),
) -> list[str]:
    """The backend's options with the job's merged in (a job's option replaces the backend's
    of the same name), as argv words."""
    extra = job_options(params, style, extra_allowed)
    replaced = {style.name(o.flag, o.value) for o in extra}
    merged = [o for o in rendered if style.name(o.flag, o.value) not in replaced] + extra
    return [word for option in merged for word in option.argv()]
