"""Location URLs of the local and rsync backends, remote paths under their base, and the
registry that picks a backend by scheme."""

from __future__ import annotations

import importlib.util
import os
import tempfile
from pathlib import Path

import pytest
from pydantic import ValidationError

from lodestream.agents.site.settings import SiteSettings
from lodestream.agents.site.transfers.locations import default_builder
from lodestream.platform_adapters.errors import UnknownBackend
from lodestream.platform_adapters.transfers.base import (
    TransferBatch,
    TransferItem,
    TransferRefused,
)
from lodestream.platform_adapters.transfers.local import LocalBackend, LocalLocation
from lodestream.platform_adapters.transfers.paths import ItemPaths, item_paths, under_base
from lodestream.platform_adapters.transfers.registry import backend_for, transfer_schemes
from lodestream.platform_adapters.transfers.rsync import (
    SOCKET_PATH_MAX,
    RsyncBackend,
    RsyncLocation,
    control_socket,
    render_rsync_argv,
    rsync_option_problem,
)


def test_local_urls_with_and_without_a_base() -> None:
    assert LocalLocation.parse("local:").base is None
    assert LocalLocation.parse("local:/").base is None
    assert LocalLocation.parse("local:/data/in/").base == "/data/in"


@pytest.mark.parametrize(
    "url",
    ["local://host/x", "local:data", "local:/a/../b", "rsync:/x", "local:/x?y=1", "file:/x"],
)
def test_malformed_local_urls_are_refused(url: str) -> None:
    with pytest.raises(TransferRefused):
        LocalLocation.parse(url)


def test_rsync_urls_local_and_over_ssh() -> None:
    assert RsyncLocation.parse("rsync:/scratch") == RsyncLocation("rsync:/scratch", "/scratch")
    remote = RsyncLocation.parse("rsync://bob@dtn01.example.org:2200/project/data")
    assert (remote.user, remote.host, remote.port, remote.base) == (
        "bob",
        "dtn01.example.org",
        2200,
        "/project/data",
    )
    bare = RsyncLocation.parse("rsync://dtn01")
    assert (bare.user, bare.port, bare.base) == (None, None, None)


@pytest.mark.parametrize(
    "url",
    [
        "rsync://u@host:notaport/x",
        "rsync://-oProxyCommand=x/y",
        "rsync://u:secret@host/x",
        "rsync://-l@host/x",
        "rsync://host/a/../b",
        "rsync:relative",
        "local:/x",
    ],
)
def test_malformed_rsync_urls_are_refused(url: str) -> None:
    with pytest.raises(TransferRefused):
        RsyncLocation.parse(url)


def test_remote_paths_are_read_under_the_base() -> None:
    assert under_base("u", "/base", "/a/b.txt") == "/base/a/b.txt"
    assert under_base("u", "/base", "/a/../b.txt") == "/base/b.txt"
    assert under_base("u", "/base", "/") == "/base"
    assert under_base("u", None, "/a/./b") == "/a/b"


@pytest.mark.parametrize("path", ["/../etc/passwd", "/a/../../x", "/..", "relative/x", "/a\0b"])
def test_paths_that_climb_out_or_are_not_absolute_are_refused(path: str) -> None:
    with pytest.raises(TransferRefused):
        under_base("local:/base", "/base", path)


def test_a_sibling_of_the_base_is_outside_it() -> None:
    with pytest.raises(TransferRefused, match="climbs out"):
        under_base("local:/base", "/base", "/../base2/x")


def _batch(direction: str, source: str, destination: str) -> TransferBatch:
    item = TransferItem("item-1", source, destination)
    return TransferBatch("store", "local:/base", direction, (item,), "key-1")  # type: ignore[arg-type]


def test_the_remote_side_depends_on_the_direction() -> None:
    stage_in = _batch("in", "/data/x", "/work/job/x")
    paths = item_paths(stage_in, stage_in.items[0], "/base")
    assert (paths.source, paths.destination, paths.remote_source) == (
        "/base/data/x",
        "/work/job/x",
        True,
    )
    stage_out = _batch("out", "/work/job/y", "/results/y")
    paths = item_paths(stage_out, stage_out.items[0], "/base")
    assert (paths.source, paths.destination, paths.remote_source) == (
        "/work/job/y",
        "/base/results/y",
        False,
    )


def test_a_relative_site_path_is_refused() -> None:
    batch = _batch("in", "/data/x", "work/x")
    with pytest.raises(TransferRefused, match="site path"):
        item_paths(batch, batch.items[0], "/base")


def test_the_registry_picks_by_scheme(tmp_path: Path) -> None:
    local = backend_for("local:/data", state_dir=tmp_path)
    remote = backend_for("rsync://u@h/x", state_dir=tmp_path, identity_file=tmp_path / "k")
    assert isinstance(local, LocalBackend)
    local.close()
    assert isinstance(remote, RsyncBackend)
    remote.close()
    assert remote.location.host == "h"
    assert remote.identity_file == tmp_path / "k"


@pytest.mark.parametrize("url", ["ftp://host/x", "", "no-scheme", "/abs/path"])
def test_an_unknown_scheme_lists_the_known_ones(url: str) -> None:
    with pytest.raises(UnknownBackend, match="known schemes: globus, local, rsync"):
        backend_for(url)
    assert transfer_schemes() == ("globus", "local", "rsync")


def test_a_wrong_option_is_named(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="colour"):
        backend_for("local:", state_dir=tmp_path, colour="blue")


def test_a_malformed_url_of_a_known_scheme_is_refused(tmp_path: Path) -> None:
    with pytest.raises(TransferRefused):
        backend_for("local://nohost", state_dir=tmp_path)


def test_globus_is_loaded_only_when_asked_for() -> None:
    module = "lodestream.platform_adapters.transfers.globus"
    if importlib.util.find_spec(module) is not None:
        pytest.skip("the Globus backend is present; its own tests construct it")
    with pytest.raises(UnknownBackend, match=r"globus transfer backend \(.*\) is not installed"):
        backend_for("globus://0f7c-endpoint/")


def site(tmp_path: Path, transfers: dict[str, object]) -> SiteSettings:
    return SiteSettings.model_validate({
        "site": "alpha", "nats": {"url": "wss://127.0.0.1:1"}, "directory": tmp_path,
        "transfers": transfers,
    })  # fmt: skip


def test_rsync_options_timeouts_and_the_shared_connection_are_settings(tmp_path: Path) -> None:
    url = "rsync://lode@dtn.example.org:2222/scratch"
    settings = site(tmp_path, {
        "locations": {"dtn": url, "near": "rsync:/data"},
        "max_concurrent": 7,
        "rsync": {"dtn": {"rsync_options": ["--bwlimit=10m", "--compress"],
                          "io_timeout_s": 45, "connect_timeout_s": 5, "control_persist_s": 9}},
    })  # fmt: skip
    backend = default_builder("dtn", url, settings)
    assert isinstance(backend, RsyncBackend)
    try:
        assert backend.rsync_options == ("--bwlimit=10m", "--compress")
        assert (backend.io_timeout_s, backend.connect_timeout_s) == (45, 5)
        ssh = backend.ssh_argv(backend.location)
        assert "ConnectTimeout=5" in ssh
        assert "ControlMaster=auto" in ssh
        assert "ControlPersist=9" in ssh
        assert f"ControlPath={backend.control_path}" in ssh
        assert backend.control_path is not None
        # In the site's directory, or a private /tmp one where that path is too long.
        assert backend.control_path == control_socket(
            tmp_path / "transfers" / "ssh", backend.location
        )
        argv = render_rsync_argv(
            "rsync", backend.location, ItemPaths("/a", "/b", remote_source=True),
            recursive=False, io_timeout_s=45, rsync_options=backend.rsync_options,
        )  # fmt: skip
        assert "--timeout=45" in argv
        assert argv[-5:-3] == ["--bwlimit=10m", "--compress"]
    finally:
        backend.close()
    near = default_builder("near", "rsync:/data", settings)
    assert isinstance(near, RsyncBackend)
    assert near.control_path is None  # no ssh: nothing to share
    near.close()


@pytest.mark.parametrize(
    ("option", "words"),
    [
        ("--rsh=sh", "not allowed"),
        ("--rsync-path=rm -rf /", "not allowed"),
        ("--delete", "not allowed"),
        ("--inplace", "not allowed"),
        ("--bwlimit=10m; reboot", "not a value"),
        ("--bwlimit", "not allowed"),
    ],
)
def test_rsync_options_outside_the_allow_list_are_refused(
    tmp_path: Path, option: str, words: str
) -> None:
    assert words in (rsync_option_problem(option) or "")
    with pytest.raises(ValidationError, match=words):
        site(
            tmp_path,
            {"locations": {"dtn": "rsync:/d"}, "rsync": {"dtn": {"rsync_options": [option]}}},
        )


def test_rsync_settings_name_an_rsync_location(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="not an rsync location"):
        site(tmp_path, {"locations": {"lab": "local:/d"}, "rsync": {"lab": {"io_timeout_s": 5}}})


def test_a_control_socket_too_long_for_the_site_directory_goes_to_a_private_tmp_dir(
    tmp_path: Path,
) -> None:
    location = RsyncLocation.parse("rsync://u@h:22/x")
    # pytest's tmp_path is itself long under xdist (…/popen-gw1/test_a_control_socket…0).
    near = Path(tempfile.mkdtemp(prefix="s", dir="/tmp"))
    try:
        short = control_socket(near, location)
        assert short.parent == near
        assert control_socket(near, RsyncLocation.parse("rsync://u@h:23/x")) != short
    finally:
        near.rmdir()
    deep = tmp_path / ("d" * 120)
    moved = control_socket(deep, location)
    assert len(os.fsencode(moved)) <= SOCKET_PATH_MAX
    assert moved.parent.stat().st_mode & 0o777 == 0o700
    assert control_socket(deep, location) == moved  # the same place on every start
