"""What a pilot is, and the parts it runs jobs with: settled before it connects.

:func:`lodestream.agents.launcher.main.run` builds both from the site's settings and the
pilot's plan; the :class:`~lodestream.agents.launcher.launcher.Launcher` and its parts only
read them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from lodestream.agents.launcher.decide import PilotBatch, SiteShape
from lodestream.agents.launcher.diffusion import Diffusion
from lodestream.agents.launcher.warm import WarmPool
from lodestream.agents.site.apps import ApplicationDefinition
from lodestream.agents.site.settings import JobMode
from lodestream.eventlog.outbox import Outbox
from lodestream.platform_adapters.compute.base import NodeSpec
from lodestream.platform_adapters.launchers.base import AppLauncher


@dataclass(frozen=True, slots=True)
class PilotConfig:
    """What the pilot is: where it runs, on what, in which mode, and what it takes."""

    site: str
    nodes: tuple[NodeSpec, ...]  # what jobs are packed on
    data_dir: Path  # the site's data directory: jobs' workdirs are under it
    idle_ttl_s: float  # the pilot exits after this long with nothing to run
    max_fetch: int = 256
    prefetch: int = 0  # deliveries kept, unleased, beside full slots (launcher.prefetch)
    # Tasks inherit only what the entry point passes, not the pilot's own environment.
    base_env: Mapping[str, str] = field(default_factory=dict)
    mode: JobMode = "serial"
    site_shape: SiteShape = field(default_factory=SiteShape)
    batch: PilotBatch | None = None  # the batch job we run in, named in the causes of drains
    # Only jobs whose tags include all of these are leased here; empty: every job.
    filter_tags: Mapping[str, str] = field(default_factory=dict)
    # Why this pilot's MPI launcher starts no one world (its probe), or None: MPI jobs are
    # then failed with it, serial ones still run.
    mpi_broken: str | None = None


@dataclass(frozen=True, slots=True)
class PilotParts:
    """What the pilot runs jobs with: the apps, what starts them, and its optional helpers."""

    apps: Mapping[str, type[ApplicationDefinition]]
    app_launcher: AppLauncher
    # Warm Python workers for function apps (agents/launcher/warm/); None: every job is
    # started by the app launcher.
    warm: WarmPool | None = None
    diffusion: Diffusion | None = None  # node caches and data-aware dispatch; None: off
    # At a leaf-node site, where results the hub does not answer for are kept.
    outbox: Outbox | None = None
