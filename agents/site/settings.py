"""A site's ``settings.yml``, validated by pydantic models with errors that name the field.

    site: theta-like
    nats:
      url: wss://127.0.0.1:14443
      ca_file: ca.pem            # relative paths are relative to the site directory
      seed_file: site.nk
      revoked_after_s: 30        # NATS refusing the key this long means it was revoked
    api_url: http://127.0.0.1:8400
    launcher:
      heartbeat_ttl_s: 10
      idle_ttl_s: 60
      machine: local             # or polaris, frontier, ...; or the path of a description
      virtual_nodes: 1
      mode: serial               # or mpi: every job through the app launcher (mpiexec, srun)
      srun_mpi: pmi2             # srun's --mpi (PMI) for MPI jobs; default: the machine's
      serial_workers: none       # or mpi4py: serial mode with one worker rank per node
      cache_bytes: 0             # node-local caches of cacheable inputs, bytes per node (0: off)
      cache_dir: cache           # below the site directory, or an absolute path ($TMPDIR's)
    processing:
      retry_budget: 3            # retries after the first attempt; an app may set its own
      retry_backoff:             # the wait before each retry; an app may override any field
        base_s: 10
        factor: 2
        max_s: 600
        jitter: 0.2
    scheduler:                   # where pilots are submitted (lode queue submit)
      type: slurm                # local (default), slurm, pbs, lsf, cobalt, flux
      project: cosmo             # defaults for requests that name none
      queue: debug
      options: {constraint: cpu} # added to every pilot's submission
      request_options: [qos]     # the option names a request may set
      template: job-template.sh  # the pilot's script (lode site init writes one)
      sync_interval_s: 5
    elastic:                     # the elastic queue: off unless enabled
      enabled: true
      period_s: 60
      queue: debug
      project: myproject
      min_nodes: 1
      max_nodes: 8
      max_queued_jobs: 2
    transfers:                   # data staging: where jobs may stage from and to
      locations:
        aps_dtn: globus://7c1f0e9a-0000-4000-8000-000000000001/
        beamline: rsync://scientist@127.0.0.1:2222/data
        scratch: local:/scratch/shared
      batch_size: 100            # items per transfer task
      max_concurrent: 5          # tasks in flight
      globus_collection: ...     # this site's own collection, for globus locations

Only entry points (``lode site start``, ``lode launcher``) read the file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Final, Literal, Self

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from lodestream.agents.site.apps.spec import MAX_RETRY_BUDGET
from lodestream.platform_adapters.compute.machine import SRUN_MPI_PATTERN
from lodestream.platform_adapters.launchers.options import Arity
from lodestream.schemas.events.batch import SCHEDULER_OPTION_PATTERN, SchedulerWord
from lodestream.schemas.events.scaler import ScalerLimits
from lodestream.schemas.resources import PRINTABLE_PATTERN, LocationName, LocationUrl
from lodestream.schemas.retry import RetryBackoff
from lodestream.schemas.subjects import SiteSlug

SETTINGS_FILE = "settings.yml"


class SiteSettingsError(ValueError):
    """settings.yml is missing, not YAML, or fails validation; the message says where."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SiteNats(_Strict):
    url: str = Field(pattern=r"^(wss|tls|nats)://")
    ca_file: Path | None = None
    seed_file: Path = Path("site.nk")
    # How long NATS must refuse the site's key, on every attempt, before a site process
    # takes it as revoked and exits (lodestream.agents.site.credential says why).
    revoked_after_s: float = Field(30.0, ge=1.0, le=86_400.0)
    # Set when ``url`` is the site's own leaf node (docs/operations.md, "Sites behind an
    # unreliable WAN link"): the hub's JetStream domain, through which the site's processes
    # reach the hub's streams and consumers; results the hub cannot take during a cut are
    # kept in the leaf's OUTBOX and forwarded by the site agent.
    hub_domain: str | None = Field(None, pattern=r"^[A-Za-z0-9_-]{1,32}$")


AppLauncherName = Literal[
    "local", "fake", "mpich", "pals", "openmpi", "srun", "aprun", "jsrun", "flux"
]
# serial: single-rank jobs (num_nodes 1, ranks_per_node 1); mpi: any job, each started through
# an MPI app launcher on the nodes the pilot packs it on (docs/platforms.md, "Pilot modes").
JobMode = Literal["serial", "mpi"]
# How a serial-mode pilot runs its jobs on many nodes. none: one process starts every job with
# the app launcher; mpi4py: one worker rank per node runs that node's jobs, rank 0 leases.
SerialWorkers = Literal["none", "mpi4py"]
LaunchOptionName = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}$")]


class PythonWorkerSettings(_Strict):
    """Warm Python workers: Python-function jobs run in long-lived processes forked from a
    template that has imported the site's apps (docs/platforms.md, "Warm Python workers").

    ``enabled: false`` runs every function job in a fresh interpreter, as an app with
    ``isolation = "process"`` always does. A worker is recycled after ``max_jobs`` jobs, or
    when its RSS after a job is above ``max_rss_mb``; ``memory_limit_mb`` caps its address
    space (``RLIMIT_AS``: a job over it gets ``MemoryError``), and a job still running after
    ``time_limit_s`` has its worker killed and replaced. None: no such limit.
    """

    enabled: bool = True
    max_jobs: int = Field(10_000, ge=1)
    max_rss_mb: float = Field(4096.0, gt=0)
    memory_limit_mb: float | None = Field(None, gt=0)
    time_limit_s: float | None = Field(None, gt=0)


class LauncherSettings(_Strict):
    heartbeat_ttl_s: int = Field(10, ge=2, le=600)
    idle_ttl_s: float = Field(60.0, ge=0)
    virtual_nodes: int = Field(1, ge=1, le=1024)
    cores_per_node: int | None = Field(None, ge=1)
    gpus_per_node: int | None = Field(None, ge=0)
    # A machine shipped with lodestream (platform_adapters/compute/machines/) or the path of a
    # description file, relative to the site directory: the nodes' shape and the scheduler
    # whose allocation the pilot runs in.
    machine: str = Field("local", min_length=1, max_length=1024, pattern=r"^[^\x00-\x1f]+$")
    # None: the machine's own launcher.
    app_launcher: AppLauncherName | None = None
    # srun's --mpi plugin for the site's jobs (pmi2, pmix, ...), over the machine's srun_mpi;
    # `default`: pass none, the cluster's MpiDefault. None: the machine's.
    srun_mpi: str | None = Field(None, pattern=SRUN_MPI_PATTERN)
    # Further options a job's launch_params may pass to the launcher: the name without dashes
    # (flux: `setopt:NAME` for `-o NAME=...`) and how the launcher reads it, `switch`, `value`
    # or `optional`; the arity keeps a value from becoming an option or a program of its own.
    allow_launch_options: dict[LaunchOptionName, Arity] = Field(default_factory=dict)
    max_fetch: int = Field(256, ge=1, le=10_000)
    # Deliveries a pilot keeps beside its full slots, unleased, to start the moment a slot
    # frees (no fetch in between); one kept longer than a few seconds goes back to the feed
    # for other pilots. 0: fetch only for free slots.
    prefetch: int = Field(2, ge=0, le=1024)
    # The mode of this site's pilots; `lode launcher --mode` overrides it.
    mode: JobMode = "serial"
    serial_workers: SerialWorkers = "none"
    # mpi4py workers: a rank silent for this long is lost, and so are the jobs it ran.
    worker_timeout_s: float = Field(30.0, ge=1, le=3600)
    # Node-local caches of cacheable inputs (docs/platforms.md, "Node-local caches and
    # data-aware dispatch"): bytes per node, 0 turns them off. cache_dir: where, relative to
    # the site directory (default <site>/cache); a session's caches are below it, removed
    # when the pilot exits. cache_defer_deliveries: how many deliveries of a job whose
    # inputs a peer pilot caches this pilot hands back before it takes the job anyway.
    cache_bytes: int = Field(0, ge=0, le=2**62)
    cache_dir: Path = Path("cache")
    cache_defer_deliveries: int = Field(2, ge=0, le=20)
    python_workers: PythonWorkerSettings = PythonWorkerSettings()


class ProcessingSettings(_Strict):
    retry_budget: int = Field(3, ge=0, le=MAX_RETRY_BUDGET)
    retry_backoff: RetryBackoff = RetryBackoff()
    workers: int = Field(4, ge=1, le=64)


SchedulerType = Literal["local", "slurm", "pbs", "lsf", "cobalt", "flux"]
OptionName = Annotated[str, Field(pattern=SCHEDULER_OPTION_PATTERN)]
OptionValue = Annotated[str, Field(max_length=1024, pattern=PRINTABLE_PATTERN)]


class SchedulerSettings(_Strict):
    """The site's batch scheduler and how the agent submits pilots to it.

    ``adapter`` holds further settings of the backend (``LsfScheduler``'s
    ``slots_per_node``, ``PbsScheduler``'s ``queue_attribute``, ...). Paths are relative to
    the site directory. A request's ``options`` reach the scheduler only if their names are
    in ``request_options``: an option such as Slurm's ``--export`` or ``--chdir`` could
    change what the pilot runs, so the site decides which ones its users may set.
    """

    type: SchedulerType = "local"
    project: SchedulerWord = ""
    queue: SchedulerWord = ""
    options: dict[OptionName, OptionValue] = Field(default_factory=dict)
    request_options: tuple[OptionName, ...] = ()
    template: Path = Path("job-template.sh")
    script_dir: Path = Path("batch")
    sync_interval_s: float = Field(5.0, gt=0, le=3600)
    # Syncs a batch job may be missing from the scheduler's queue, with no accounting record,
    # before it is taken to have ended ("vanished from the queue").
    vanish_after: int = Field(2, ge=1, le=1000)
    timeout_s: float = Field(60.0, gt=0, le=3600)  # per scheduler command
    jobcomp_path: Path | None = None  # Slurm without slurmdbd: its jobcomp/filetxt log
    state_dir: Path = Path("batch/local")  # the local scheduler's jobs
    seconds_per_minute: float = Field(60.0, gt=0)  # the local scheduler's minute (tests)
    adapter: dict[str, str | int | float | bool] = Field(default_factory=dict)


class CleanerSettings(_Strict):
    interval_s: float = Field(30.0, gt=0)


BACKFILL_SCHEDULERS: Final = frozenset({"slurm", "pbs", "lsf", "cobalt"})
"""The scheduler types whose adapter can tell backfill windows (``capabilities.backfill``;
a test checks this against the adapters)."""


class ElasticSettings(ScalerLimits):
    """The elastic queue (``agents/site/elastic/``): the policy's limits, and when to decide.

    The limits are recorded in every decision as they were (``scaler.decided``); see
    ``docs/user-guide.md`` for what each means.
    """

    enabled: bool = False
    period_s: float = Field(60.0, ge=1, le=86_400)

    @property
    def limits(self) -> ScalerLimits:
        return ScalerLimits.model_validate(self.model_dump(exclude={"enabled", "period_s"}))


class RsyncLocationSettings(_Strict):
    """What a site may set for one ``rsync:`` location (``transfers.rsync.<location>``)."""

    # Added to every run; an allow-list (platform_adapters/transfers/rsync.py), one word each.
    rsync_options: tuple[OptionValue, ...] = ()
    io_timeout_s: int = Field(300, ge=1, le=86_400)  # rsync --timeout
    connect_timeout_s: int = Field(30, ge=1, le=3600)  # ssh ConnectTimeout
    # How long the shared ssh connection outlives its last run; 0: a login per run.
    control_persist_s: int = Field(60, ge=0, le=86_400)

    @model_validator(mode="after")
    def _allowed_options(self) -> Self:
        from lodestream.platform_adapters.transfers.rsync import (  # noqa: PLC0415
            rsync_option_problem,
        )

        for word in self.rsync_options:
            if problem := rsync_option_problem(word):
                raise ValueError(problem)
        return self


class TransferSettings(_Strict):
    """The site's transfer module (``agents/site/transfers/``) and the locations it trusts.

    ``locations`` names the remote places a job may stage from or to (``slot: "name:/path"``)
    and says how: ``globus://<collection>/``, ``rsync://user@host[:port]/base``, ``rsync:/base``,
    ``local:`` or ``local:/base``. The site declares them to the control plane at start; a job
    naming any other location is refused at submission.
    """

    locations: dict[LocationName, LocationUrl] = Field(default_factory=dict, max_length=256)
    batch_size: int = Field(100, ge=1, le=10_000)  # items per backend task
    max_concurrent: int = Field(5, ge=1, le=1000)  # backend tasks in flight at once
    retry_budget: int = Field(3, ge=0, le=100)  # resubmissions of an item after a transient fault
    poll_interval_s: float = Field(2.0, gt=0, le=3600)
    state_dir: Path = Path("transfers")  # the local and rsync backends' task records
    link: bool = False  # local backend: hard-link instead of copying, where one filesystem
    ssh_identity: Path | None = None  # rsync over ssh
    ssh_options: tuple[OptionValue, ...] = ()
    # Per rsync location: its options, timeouts and shared connection (defaults otherwise).
    rsync: dict[LocationName, RsyncLocationSettings] = Field(default_factory=dict)
    globus_collection: str = ""  # this site's own Globus collection (endpoint) id
    globus_client_id: str = ""  # the native app registered for `lode site globus-login`
    globus_sync_level: Literal["exists", "size", "mtime", "checksum"] = "mtime"
    # The directory of this machine that the site's collection shows as "/".
    globus_site_root: str = Field("/", pattern=r"^/[^\x00-\x1f]*$")
    # The site's cache of staged inputs (agents/site/transfers/stage_cache.py): an input slot
    # the app marks ``cache`` is fetched from its location once and linked into later jobs'
    # workdirs. 0 turns it off.
    stage_cache_bytes: int = Field(0, ge=0)
    stage_cache_ttl_s: float = Field(86_400.0, gt=0)
    stage_cache_dir: Path = Path("cache/staged")
    # For measurements (bench/staging.py): no task is taken as done sooner than this after
    # its submission, as if every task paid a wide-area service's fixed overhead. 0 in use.
    simulated_task_latency_s: float = Field(0.0, ge=0, le=3600)

    @model_validator(mode="after")
    def _rsync_of_rsync_locations(self) -> Self:
        for name in self.rsync:
            if not self.locations.get(name, "").startswith("rsync:"):
                raise ValueError(f"transfers.rsync.{name}: {name!r} is not an rsync location")
        return self


class SiteSettings(_Strict):
    site: SiteSlug
    nats: SiteNats
    api_url: str = "http://127.0.0.1:8400"
    launcher: LauncherSettings = LauncherSettings()
    processing: ProcessingSettings = ProcessingSettings()
    cleaner: CleanerSettings = CleanerSettings()
    scheduler: SchedulerSettings = SchedulerSettings()
    elastic: ElasticSettings = ElasticSettings()
    transfers: TransferSettings = TransferSettings()
    directory: Path = Path()

    @model_validator(mode="after")
    def _backfill_is_answerable(self) -> Self:
        if self.elastic.use_backfill and self.scheduler.type not in BACKFILL_SCHEDULERS:
            raise ValueError(
                f"elastic.use_backfill: the {self.scheduler.type} scheduler cannot tell backfill "
                f"windows (only {', '.join(sorted(BACKFILL_SCHEDULERS))} can)"
            )
        return self

    @property
    def seed_path(self) -> Path:
        """Relative paths in the file are relative to the site directory, not the cwd."""
        return self.directory / self.nats.seed_file

    @property
    def ca_path(self) -> Path | None:
        return self.directory / self.nats.ca_file if self.nats.ca_file else None

    @property
    def apps_dir(self) -> Path:
        return self.directory / "apps"

    @property
    def data_dir(self) -> Path:
        return self.directory / "data"

    @property
    def log_dir(self) -> Path:
        return self.directory / "log"

    def site_path(self, path: Path) -> Path:
        """``path`` from the settings file: relative to the site directory, not the cwd."""
        return path if path.is_absolute() else self.directory / path

    def to_yaml(self) -> str:
        data: dict[str, Any] = self.model_dump(mode="json", exclude={"directory"})
        return yaml.safe_dump(data, sort_keys=False)


def load_site_settings(directory: Path) -> SiteSettings:
    path = directory / SETTINGS_FILE
    if not path.is_file():
        raise SiteSettingsError(f"{path}: not found — create the site with `lode site init`")
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise SiteSettingsError(f"{path}: not valid YAML: {exc}") from exc
    if not isinstance(raw, dict):
        raise SiteSettingsError(f"{path}: expected a mapping of settings, got {type(raw).__name__}")
    try:
        return SiteSettings.model_validate({**raw, "directory": directory.absolute()})
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in exc.errors()
        )
        raise SiteSettingsError(f"{path}: {problems}") from exc
