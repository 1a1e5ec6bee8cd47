"""What the command-line scheduler adapters share: a runner, a timeout, the user, the clock."""

from __future__ import annotations

import getpass
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime, tzinfo
from pathlib import Path
from typing import TypedDict

from lodestream.platform_adapters.schedulers.base import Scheduler
from lodestream.platform_adapters.schedulers.runner import (
    DEFAULT_TIMEOUT_S,
    CommandResult,
    CommandRunner,
    run_command,
)


def utc_now() -> datetime:
    return datetime.now(UTC)


class CommandOptions(TypedDict, total=False):
    """The settings every command-line adapter takes (see ``CommandScheduler``)."""

    runner: CommandRunner
    timeout_s: float
    user: str | None
    tz: tzinfo | None
    clock: Callable[[], datetime]


class CommandScheduler(Scheduler):
    """A scheduler driven through its commands, one ``runner`` call per operation.

    ``user`` is whose jobs ``status()`` lists (the site's user, by default whoever runs the
    agent). ``tz`` is the zone the scheduler prints wall-clock times in (None: this host's
    zone). ``clock`` gives "now" for elapsed times, so tests can fix it.
    """

    def __init__(
        self,
        *,
        runner: CommandRunner = run_command,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        user: str | None = None,
        tz: tzinfo | None = None,
        clock: Callable[[], datetime] = utc_now,
    ) -> None:
        self._runner = runner
        self._timeout_s = timeout_s
        self._user = user
        self.tz = tz
        self._clock = clock

    @property
    def user(self) -> str:
        if self._user is None:
            self._user = getpass.getuser()
        return self._user

    def now(self) -> datetime:
        return self._clock()

    def run(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
    ) -> CommandResult:
        return self._runner(argv, timeout_s=self._timeout_s, env=env, cwd=cwd)
