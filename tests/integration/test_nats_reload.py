"""A refused reload never leaves nats-server, or its config file, on a config it refused."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import time
from pathlib import Path

import pytest

from lodestream.infra.nats.auth import render_authorization
from lodestream.infra.nats.errors import ReloadError
from lodestream.infra.nats.server import RELOAD_FAILED, NatsServer
from lodestream.schemas.nkey import new_user_seed, user_public_key
from tests.fixtures.nats import SecureNats, connect_site, write_seed

# Matches the pattern of an nkey user public key, but its checksum is wrong.
BAD_CHECKSUM_KEY = "UDXU4RCSJNZOIQHZNWXHXORDPRTGNJAHAHFRGZNEEJCPQTT2M7NLCNF5"


def _wait_exited(server: NatsServer) -> None:
    while server.running:
        time.sleep(0.01)


async def test_a_config_that_fails_the_test_never_reaches_the_server(
    secure_nats: SecureNats,
) -> None:
    server = secure_nats.server
    live = server.config_path.read_bytes()
    # Written by hand: render_authorization refuses such a key itself.
    authorization = render_authorization(secure_nats.user, secure_nats.password, {})
    authorization = authorization.replace(
        "\n  ]", f"\n    {{nkey: {json.dumps(BAD_CHECKSUM_KEY)}}}\n  ]"
    )
    broken = dataclasses.replace(server.config, authorization=authorization)

    with pytest.raises(ReloadError, match=r"(?s)nats-server -t refused .*valid public nkey"):
        server.reload(broken)

    assert server.config_path.read_bytes() == live
    assert RELOAD_FAILED not in server.log_path.read_text()  # never signalled
    assert not list(server.directory.glob(".*.new"))
    alpha = await connect_site(secure_nats, "alpha")  # still on the old users
    await alpha.close()


async def test_a_reload_the_server_refuses_puts_the_last_good_config_back(
    secure_nats: SecureNats,
) -> None:
    server = secure_nats.server
    good = server.config
    live = server.config_path.read_bytes()
    # Passes `nats-server -t`, but a running server cannot change its name.
    unreloadable = dataclasses.replace(good, server_name="renamed")

    with pytest.raises(ReloadError, match="refused"):
        server.reload(unreloadable)

    assert server.running
    assert server.config == good
    assert server.config_path.read_bytes() == live


async def test_a_restart_comes_up_on_the_last_accepted_config(
    secure_nats: SecureNats, tmp_path: Path
) -> None:
    server = secure_nats.server
    gamma_seed = new_user_seed()
    secure_nats.seed_files["gamma"] = write_seed(tmp_path / "gamma.nk", gamma_seed)
    secure_nats.set_sites({**secure_nats.public_keys, "gamma": user_public_key(gamma_seed)})
    with pytest.raises(ReloadError):
        server.reload(dataclasses.replace(server.config, server_name="renamed"))
    pid = server.pid
    assert pid is not None

    os.kill(pid, signal.SIGKILL)
    _wait_exited(server)
    assert server.exited
    server.restart()

    assert not server.exited
    assert server.config.server_name == "lode-test"
    gamma = await connect_site(secure_nats, "gamma")
    await gamma.close()


def test_stop_is_not_an_exit(secure_nats: SecureNats) -> None:
    server = secure_nats.server
    server.stop()
    assert not server.exited
    assert server.pid is None
