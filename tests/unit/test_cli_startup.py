"""Every ``lode`` command imports the whole command tree to register its commands: what the
tree imports at that point is paid by each start (a pilot, a site agent, every CLI call)."""

from __future__ import annotations

import subprocess
import sys

# Imported only by the commands that use them. Each took a share of every `lode` start when
# the tree imported it: the analytics package with the simulator (about half a second), the
# NATS client with aiohttp (a sixth of a second, for `lode watch`), the event models (a
# tenth, for a list of names and constants that now live in lighter modules).
NOT_AT_START = (
    "lodestream.client.analytics",
    "lodestream.client.analytics.simulate",
    "nats",
    "aiohttp",
    "lodestream.schemas.events",
)


def test_registering_the_commands_imports_none_of_what_only_some_commands_use() -> None:
    probe = (
        "import sys, lodestream.client.cli.main; "
        f"print(','.join(m for m in {NOT_AT_START!r} if m in sys.modules))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    )
    assert done.stdout.strip() == ""


def test_the_analytics_commands_are_still_there() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "lodestream.client.cli.main", "analytics", "--help"],
        capture_output=True, text=True, check=True, timeout=60,
    )  # fmt: skip
    for command in ("summary", "report", "export", "simulate"):
        assert command in done.stdout
