"""Batch scheduler adapters: the interface, one backend per scheduler, a fake, the registry."""

from lodestream.platform_adapters.schedulers.base import (
    BackfillWindow,
    BatchRecord,
    BatchRequest,
    BatchStatus,
    Capabilities,
    Scheduler,
)
from lodestream.platform_adapters.schedulers.cobalt import CobaltScheduler
from lodestream.platform_adapters.schedulers.fake import FakeOutcome, FakeScheduler
from lodestream.platform_adapters.schedulers.flux import FluxScheduler
from lodestream.platform_adapters.schedulers.local import LocalScheduler
from lodestream.platform_adapters.schedulers.lsf import LsfScheduler
from lodestream.platform_adapters.schedulers.pbs import PbsScheduler
from lodestream.platform_adapters.schedulers.registry import get_scheduler, scheduler_names
from lodestream.platform_adapters.schedulers.runner import (
    CommandResult,
    CommandRunner,
    run_command,
)
from lodestream.platform_adapters.schedulers.slurm import SlurmScheduler

__all__ = [
    "BackfillWindow",
    "BatchRecord",
    "BatchRequest",
    "BatchStatus",
    "Capabilities",
    "CobaltScheduler",
    "CommandResult",
    "CommandRunner",
    "FakeOutcome",
    "FakeScheduler",
    "FluxScheduler",
    "LocalScheduler",
    "LsfScheduler",
    "PbsScheduler",
    "Scheduler",
    "SlurmScheduler",
    "get_scheduler",
    "run_command",
    "scheduler_names",
]
