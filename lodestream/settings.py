"""Settings of the central services, one nested model per component.

Only entry points construct :class:`Settings` (which reads the environment);
everything else receives the piece it needs. ``NATS_URL`` and
``DATABASE_URL`` are honoured as-is so an operator can point the same
services at an external NATS cluster and a managed Postgres.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import AliasChoices, BaseModel, Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict


class NatsSettings(BaseModel):
    url: str = "nats://127.0.0.1:4222"
    user: str | None = None
    password: SecretStr | None = None
    ca_file: Path | None = None
    nkey_seed_file: Path | None = None
    inbox_prefix: str = "_INBOX"
    stream_replicas: int = Field(1, ge=1, le=5)
    # The age at which the server removes a launcher's last heartbeat: a stream setting, so
    # one value for every pilot of the deployment (sites cannot set their own TTL).
    heartbeat_ttl_s: float = Field(10.0, ge=1, le=3600)
    name: str = "lodestream"


class StreamSettings(BaseModel):
    """The push feed (``/events/stream``): what one client may hold of the server."""

    # Events waiting for one client; when it stays full for lag_s the client is told it
    # lagged and is disconnected, to resume from its Last-Event-ID. queue_bytes bounds the
    # same in bytes; a socket that takes nothing for lag_s counts as lagging too.
    queue_size: int = Field(1000, ge=1, le=100_000)
    queue_bytes: int = Field(2**18, ge=2**12, le=2**30)
    lag_s: float = Field(5.0, gt=0, le=600)
    # How long a client that lagged has to take its lagged notice (its feed is released at
    # once; its stream slot stays taken) before the api stops writing to it.
    lagged_grace_s: float = Field(60.0, gt=0, le=3600)
    # Streams one user may hold open at once, across all their tokens; past it, 429.
    max_streams_per_user: int = Field(20, ge=1, le=10_000)
    # The newest frames of each filter's hub, shared by all its clients (whatever their
    # number); a client further behind than this reads through a consumer of its own.
    hub_history_bytes: int = Field(64 * 2**20, ge=2**16, le=2**30)
    # A comment at least this often keeps proxies from closing an idle stream.
    heartbeat_s: float = Field(15.0, gt=0, le=300)
    # An abandoned consumer (an api killed mid-stream) is removed by nats-server after this.
    inactive_s: float = Field(30.0, ge=1, le=3600)
    session_hours: float = Field(8.0, gt=0, le=24 * 30)  # the dashboard's login cookie


class ApiSettings(BaseModel):
    host: str = "127.0.0.1"
    port: int = Field(8400, ge=0, le=65535)
    max_jobs_per_request: int = Field(5000, ge=1, le=100_000)
    wait_timeout_s: float = Field(30.0, gt=0)
    max_page_size: int = Field(1000, ge=1, le=1000)  # the limit the OpenAPI document states
    # Keys the ids of idempotent submissions; every api instance needs the same value.
    # Unset: the control plane's NATS password. Changing it changes those ids.
    id_secret: SecretStr | None = None
    stream: StreamSettings = StreamSettings()
    # Public keys of the control plane's own nkeys beyond nats.nkey_seed_file's (other
    # services, another api instance): refused when a user binds them to a site or a
    # monitoring credential.
    control_public_keys: list[str] = []


class ProjectorSettings(BaseModel):
    durable: str = "projector"
    batch_size: int = Field(2000, ge=1, le=20_000)
    fetch_timeout_s: float = Field(0.5, gt=0)
    # How long a partial batch of EVENTS waits for more before it is folded: fewer, larger
    # transactions (at 550 jobs/s: a quarter less projector and Postgres CPU per job) for this
    # much more read-model lag. 0 folds what came at once. Full batches never wait.
    linger_s: float = Field(0.02, ge=0, le=1.0)


class ControllerSettings(BaseModel):
    # How often the controller looks at the backlog of sites with an elastic queue and
    # appends a scaler.backlog for each that changed; 0 turns it off.
    scaler_period_s: float = Field(10.0, ge=0, le=3600)


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="LODE_", env_nested_delimiter="__", extra="ignore", populate_by_name=True
    )

    nats_url: str = Field(
        "nats://127.0.0.1:4222", validation_alias=AliasChoices("NATS_URL", "LODE_NATS_URL")
    )
    database_url: str = Field(
        "postgresql://postgres@127.0.0.1:5432/lodestream",
        validation_alias=AliasChoices("DATABASE_URL", "LODE_DATABASE_URL"),
    )
    nats: NatsSettings = NatsSettings()
    api: ApiSettings = ApiSettings()
    projector: ProjectorSettings = ProjectorSettings()
    controller: ControllerSettings = ControllerSettings()

    def nats_settings(self) -> NatsSettings:
        """NATS settings with the top-level URL applied."""
        return self.nats.model_copy(update={"url": self.nats_url})
