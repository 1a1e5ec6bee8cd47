"""Every ``lode`` command imports the whole command tree to register its commands: what the
tree imports at that point is paid by each start (a pilot, a site agent, every CLI call)."""

from __future__ import annotations

import subprocess
import sys

# Imported only by the commands that use them: the analytics package (the simulator with it)
# took about half a second of each `lode` start when the tree imported it.
NOT_AT_START = ("lodestream.client.analytics", "lodestream.client.analytics.simulate")


def test_registering_the_commands_imports_no_analytics() -> None:
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
