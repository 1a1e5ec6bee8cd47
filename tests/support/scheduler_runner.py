"""A scripted ``CommandRunner``: answers scheduler commands with outputs captured in tests/data.

Each call takes the next reply in order and records what was asked, so a test can check the
argv an adapter rendered and feed it the output a real scheduler printed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from lodestream.platform_adapters.schedulers.runner import CommandResult

DATA = Path(__file__).resolve().parents[1] / "data" / "schedulers"


def captured(scheduler: str, name: str) -> str:
    """The text of ``tests/data/schedulers/<scheduler>/<name>``."""
    return (DATA / scheduler / name).read_text(encoding="utf-8")


def result(
    scheduler: str = "",
    *,
    stdout: str | None = None,
    stderr: str | None = None,
    returncode: int = 0,
    argv: tuple[str, ...] = ("cmd",),
) -> CommandResult:
    """A ``CommandResult`` whose stdout/stderr are captured files of ``scheduler`` (by name)."""
    return CommandResult(
        argv=argv,
        returncode=returncode,
        stdout=captured(scheduler, stdout) if stdout else "",
        stderr=captured(scheduler, stderr) if stderr else "",
    )


@dataclass
class Call:
    argv: list[str]
    timeout_s: float
    env: Mapping[str, str] | None
    cwd: Path | None


@dataclass
class ScriptedRunner:
    """Replies, in order, to the commands an adapter runs; ``calls`` records them."""

    replies: list[CommandResult]
    calls: list[Call] = field(default_factory=list)

    def __call__(
        self,
        argv: Sequence[str],
        *,
        timeout_s: float,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
    ) -> CommandResult:
        self.calls.append(Call(list(argv), timeout_s, env, cwd))
        assert self.replies, f"no reply scripted for {list(argv)}"
        reply = self.replies.pop(0)
        return CommandResult(tuple(argv), reply.returncode, reply.stdout, reply.stderr)

    @property
    def argvs(self) -> list[list[str]]:
        return [call.argv for call in self.calls]
