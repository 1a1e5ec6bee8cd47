"""The shared transfer suite run against the local backend and rsync, on this machine and over
ssh to a real sshd on loopback."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from lodestream.platform_adapters.transfers.local import LocalBackend
from lodestream.platform_adapters.transfers.rsync import RsyncBackend
from tests.fixtures.sshd import SshServer, require_rsync
from tests.support.transfer_contract import TransferContract, TransferHarness


class TestLocalContract(TransferContract):
    @pytest.fixture
    def harness(self, tmp_path: Path) -> Iterator[TransferHarness]:
        url = f"local:{tmp_path / 'remote'}"
        harness = TransferHarness(
            url=url,
            remote_root=tmp_path / "remote",
            site_root=tmp_path / "site",
            make_backend=lambda: LocalBackend(url, state_dir=tmp_path / "state"),
        )
        yield harness
        harness.close()


class TestRsyncLocalContract(TransferContract):
    @pytest.fixture
    def harness(self, tmp_path: Path) -> Iterator[TransferHarness]:
        require_rsync()
        url = f"rsync:{tmp_path / 'remote'}"
        harness = TransferHarness(
            url=url,
            remote_root=tmp_path / "remote",
            site_root=tmp_path / "site",
            make_backend=lambda: RsyncBackend(url, state_dir=tmp_path / "state"),
        )
        yield harness
        harness.close()


class TestRsyncSshContract(TransferContract):
    @pytest.fixture
    def harness(self, tmp_path: Path, sshd_server: SshServer) -> Iterator[TransferHarness]:
        server = sshd_server
        url = f"rsync://{server.user}@{server.host}:{server.port}{tmp_path / 'remote'}"
        harness = TransferHarness(
            url=url,
            remote_root=tmp_path / "remote",
            site_root=tmp_path / "site",
            make_backend=lambda: RsyncBackend(
                url,
                state_dir=tmp_path / "state",
                identity_file=server.identity_file,
                ssh_options=server.ssh_options,
            ),
        )
        yield harness
        harness.close()
