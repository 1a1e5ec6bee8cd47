"""App launchers: the interface, the local backend, the MPI backends, a fake, and the registry."""

from lodestream.platform_adapters.launchers.aprun import AprunLauncher
from lodestream.platform_adapters.launchers.base import (
    AppLauncher,
    RunningTask,
    TaskSpec,
    launch_env,
    read_tail,
    render_env,
)
from lodestream.platform_adapters.launchers.fake import FakeLauncher, FakeOutcome, FakeTask
from lodestream.platform_adapters.launchers.flux import FluxLauncher
from lodestream.platform_adapters.launchers.jsrun import JsrunLauncher
from lodestream.platform_adapters.launchers.local import LocalLauncher, LocalTask
from lodestream.platform_adapters.launchers.mpi import MpiLauncher
from lodestream.platform_adapters.launchers.mpich import MpichLauncher
from lodestream.platform_adapters.launchers.openmpi import OpenMpiLauncher
from lodestream.platform_adapters.launchers.pals import PalsLauncher
from lodestream.platform_adapters.launchers.process import ProcessTask, SubprocessLauncher
from lodestream.platform_adapters.launchers.registry import get_launcher, launcher_names
from lodestream.platform_adapters.launchers.srun import SrunLauncher

__all__ = [
    "AppLauncher",
    "AprunLauncher",
    "FakeLauncher",
    "FakeOutcome",
    "FakeTask",
    "FluxLauncher",
    "JsrunLauncher",
    "LocalLauncher",
    "LocalTask",
    "MpiLauncher",
    "MpichLauncher",
    "OpenMpiLauncher",
    "PalsLauncher",
    "ProcessTask",
    "RunningTask",
    "SrunLauncher",
    "SubprocessLauncher",
    "TaskSpec",
    "get_launcher",
    "launch_env",
    "launcher_names",
    "read_tail",
    "render_env",
]
