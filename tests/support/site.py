"""A site directory on disk for tests: settings.yml, credentials, apps, data."""

from __future__ import annotations

import shutil
from pathlib import Path

from lodestream.agents.site.scheduler.template import DEFAULT_TEMPLATE
from lodestream.agents.site.settings import SiteSettings, load_site_settings
from tests.fixtures.nats import SecureNats
from tests.support.processes import TEST_HEARTBEAT_TTL_S

TEST_APPS = Path(__file__).parent.parent / "data" / "apps"
# Retries in tests wait tens of milliseconds, not the production seconds; a test that is
# about the backoff sets its own (processing={"retry_backoff": ...}).
TEST_RETRY_BACKOFF = {"base_s": 0.05, "factor": 2.0, "max_s": 0.4, "jitter": 0.5}


def make_site_dir(
    root: Path,
    site: str,
    *,
    wss_url: str,
    ca_file: Path,
    seed_file: Path,
    processing: dict[str, object] | None = None,
    scheduler: dict[str, object] | None = None,
    nats: dict[str, object] | None = None,
    transfers: dict[str, object] | None = None,
    elastic: dict[str, object] | None = None,
    **launcher: object,
) -> SiteSettings:
    directory = root / site
    for sub in ("apps", "data", "log"):
        (directory / sub).mkdir(parents=True, exist_ok=True)
    shutil.copy(ca_file, directory / "ca.pem")
    shutil.copy(seed_file, directory / "site.nk")
    for app in TEST_APPS.glob("*.py"):
        shutil.copy(app, directory / "apps" / app.name)
    shutil.copy(DEFAULT_TEMPLATE, directory / "job-template.sh")
    settings = SiteSettings.model_validate(
        {
            "site": site,
            "nats": {"url": wss_url, "ca_file": "ca.pem", "seed_file": "site.nk", **(nats or {})},
            # The control plane's HB stream expires heartbeats after the same TTL.
            "launcher": {"heartbeat_ttl_s": round(TEST_HEARTBEAT_TTL_S), "idle_ttl_s": 30,
                         "virtual_nodes": 2, "cores_per_node": 4, **launcher},
            "processing": {"retry_backoff": TEST_RETRY_BACKOFF, **(processing or {})},
            "scheduler": scheduler or {},
            "transfers": transfers or {},
            "elastic": elastic or {},
        }
    )  # fmt: skip
    (directory / "settings.yml").write_text(settings.to_yaml())
    return load_site_settings(directory)


def secure_site_dir(
    secure: SecureNats,
    root: Path,
    processing: dict[str, object] | None = None,
    scheduler: dict[str, object] | None = None,
    *,
    site: str = "alpha",
    wss_url: str | None = None,
    nats: dict[str, object] | None = None,
    transfers: dict[str, object] | None = None,
    elastic: dict[str, object] | None = None,
    **launcher: object,
) -> SiteSettings:
    """A site directory for ``site`` (``alpha`` by default) of the ``secure_nats`` fixture;
    ``wss_url`` if its processes reach the server another way (through a proxy)."""
    return make_site_dir(
        root, site, wss_url=wss_url or secure.server.websocket_url, ca_file=secure.ca_file,
        seed_file=secure.seed_files[site], processing=processing, scheduler=scheduler,
        nats=nats, transfers=transfers, elastic=elastic, **launcher,
    )  # fmt: skip
