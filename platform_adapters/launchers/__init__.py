"""App launchers: the interface, the local backend, a fake, and the registry."""

from lodestream.platform_adapters.launchers.base import (
    AppLauncher,
    RunningTask,
    TaskSpec,
    read_tail,
    render_env,
)
from lodestream.platform_adapters.launchers.fake import FakeLauncher, FakeOutcome, FakeTask
from lodestream.platform_adapters.launchers.local import LocalLauncher, LocalTask
from lodestream.platform_adapters.launchers.registry import get_launcher, launcher_names

__all__ = [
    "AppLauncher",
    "FakeLauncher",
    "FakeOutcome",
    "FakeTask",
    "LocalLauncher",
    "LocalTask",
    "RunningTask",
    "TaskSpec",
    "get_launcher",
    "launcher_names",
    "read_tail",
    "render_env",
]
