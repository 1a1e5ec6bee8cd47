"""Creating a site directory: settings.yml, the site's own nkey, the pilot's job template,
apps/, data/, log/."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from lodestream.agents.site.scheduler.template import DEFAULT_TEMPLATE
from lodestream.agents.site.settings import SiteSettings
from lodestream.schemas.errors import SubjectError
from lodestream.schemas.nkey import new_user_seed, user_public_key
from lodestream.schemas.strategies import AUTO_SITE, RESERVED_SITE_NAMES
from lodestream.schemas.subjects import check_site

EXAMPLE_APPS = Path(__file__).resolve().parent / "apps" / "examples"


def init_site_dir(
    directory: Path,
    name: str,
    *,
    nats_url: str,
    ca_file: Path | None,
    api_url: str,
    examples: bool = True,
    launcher: dict[str, Any] | None = None,
) -> str:
    """Create the site directory and return the public key to register (the seed stays here)."""
    check_site(name)
    if name in RESERVED_SITE_NAMES:  # refused by the API too; checked here before any file
        raise SubjectError(f'{name!r} is reserved (site "{AUTO_SITE}" lets lodestream choose)')
    if directory.exists() and any(directory.iterdir()):
        raise FileExistsError(f"{directory} exists and is not empty")
    for sub in ("apps", "data", "log"):
        (directory / sub).mkdir(parents=True, exist_ok=True)
    seed = new_user_seed()
    fd = os.open(directory / "site.nk", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(seed + b"\n")
    nats: dict[str, Any] = {"url": nats_url, "seed_file": "site.nk"}
    if ca_file is not None:
        shutil.copy(ca_file, directory / "ca.pem")
        nats["ca_file"] = "ca.pem"
    settings = SiteSettings.model_validate(
        {"site": name, "nats": nats, "api_url": api_url, "launcher": launcher or {}}
    )
    (directory / "settings.yml").write_text(settings.to_yaml())
    # The pilot's batch script, the site's to edit (modules, environments) before it submits.
    shutil.copy(DEFAULT_TEMPLATE, directory / settings.scheduler.template)
    if examples:
        for example in EXAMPLE_APPS.glob("[!_]*.py"):
            shutil.copy(example, directory / "apps" / example.name)
    return user_public_key(seed)
