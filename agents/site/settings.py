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
    processing:
      retry_budget: 3            # retries after the first attempt; an app may set its own
      retry_backoff:             # the wait before each retry; an app may override any field
        base_s: 10
        factor: 2
        max_s: 600
        jitter: 0.2
    elastic:                     # the elastic queue: off unless enabled
      enabled: true
      period_s: 60
      queue: debug
      project: myproject
      min_nodes: 1
      max_nodes: 8
      max_queued_jobs: 2

Only entry points (``lode site start``, ``lode launcher``) read the file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from lodestream.agents.site.apps.spec import MAX_RETRY_BUDGET
from lodestream.schemas.events.scaler import ScalerLimits
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


AppLauncherName = Literal[
    "local", "fake", "mpich", "pals", "openmpi", "srun", "aprun", "jsrun", "flux"
]


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
    # Further options (names without dashes) a job's launch_params may pass to the launcher.
    allow_launch_options: tuple[str, ...] = ()
    max_fetch: int = Field(256, ge=1, le=10_000)


class ProcessingSettings(_Strict):
    retry_budget: int = Field(3, ge=0, le=MAX_RETRY_BUDGET)
    retry_backoff: RetryBackoff = RetryBackoff()
    workers: int = Field(4, ge=1, le=64)


class CleanerSettings(_Strict):
    interval_s: float = Field(30.0, gt=0)


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


class SiteSettings(_Strict):
    site: SiteSlug
    nats: SiteNats
    api_url: str = "http://127.0.0.1:8400"
    launcher: LauncherSettings = LauncherSettings()
    processing: ProcessingSettings = ProcessingSettings()
    cleaner: CleanerSettings = CleanerSettings()
    elastic: ElasticSettings = ElasticSettings()
    directory: Path = Path()

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
