"""``pg_hba.conf`` for the embedded cluster: every connection authenticates with a password.

Pure text in, text out; :mod:`lodestream.infra.postgres.server` decides when to write the
file and reload. Clusters initialised by an older ``lode up`` trusted every
loopback connection; :func:`trusts` tells those apart so they can be upgraded
in place.
"""

from __future__ import annotations

from typing import Final

HBA_FILE: Final = "pg_hba.conf"
METHOD: Final = "scram-sha-256"

# Loopback and the unix socket only: the embedded cluster never listens elsewhere.
_RULES: Final = (
    ("local", "all", "all", ""),
    ("host", "all", "all", "127.0.0.1/32"),
    ("host", "all", "all", "::1/128"),
)


def render_hba() -> str:
    """The whole file: SCRAM for every database, user and loopback address."""
    lines = [
        "# Rendered by infra/postgres/hba.py: no connection is trusted without a password.",
        "# TYPE  DATABASE  USER  ADDRESS        METHOD",
    ]
    lines += [
        f"{kind:<7} {db:<9} {user:<5} {address:<14} {METHOD}" for kind, db, user, address in _RULES
    ]
    return "\n".join(lines) + "\n"


def trusts(text: str) -> bool:
    """True if any active rule of ``text`` lets a client in without a password.

    A rule's method is not in a fixed column (``local`` rules have no address,
    ``host`` rules may spell the mask apart), so any field ``trust`` counts; no
    database or role of ours is called that.
    """
    for line in text.splitlines():
        fields = line.split("#", 1)[0].split()
        if "trust" in fields:
            return True
    return False
