"""A local certificate authority for the embedded stack's websocket listener.

Sites and launchers reach NATS only through ``wss://`` (docs/architecture.md §12),
so even the laptop demo needs TLS. Rather than ship a key, the first run
generates a CA in the state directory and signs a loopback server
certificate with it. The CA is created once and never replaced: clients
that were handed ``ca.pem`` keep trusting the server across restarts and
server-certificate renewals. Only the server certificate is rotated, when it
is missing, about to expire, or was not issued by the CA on disk.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from lodestream.infra.nats.errors import TlsMaterialError

CA_CERT: Final = "ca.pem"
CA_KEY: Final = "ca-key.pem"
SERVER_CERT: Final = "server.pem"
SERVER_KEY: Final = "server-key.pem"

CA_VALIDITY: Final = dt.timedelta(days=3650)
SERVER_VALIDITY: Final = dt.timedelta(days=365)
RENEW_BEFORE: Final = dt.timedelta(days=30)
# Backdating absorbs small clock differences between the host and its clients.
BACKDATE: Final = dt.timedelta(minutes=5)

SERVER_DNS_NAMES: Final = ("localhost",)
SERVER_IPS: Final = (ipaddress.ip_address("127.0.0.1"), ipaddress.ip_address("::1"))


@dataclass(frozen=True, slots=True)
class TlsFiles:
    """Paths a server config and its clients need; the CA key stays out of it on purpose."""

    ca_cert: Path
    server_cert: Path
    server_key: Path


def ensure_local_ca(directory: Path, *, now: dt.datetime | None = None) -> TlsFiles:
    """Create (once) a local CA and (when needed) a loopback server certificate in ``directory``."""
    now = now or dt.datetime.now(dt.UTC)
    directory.mkdir(parents=True, exist_ok=True)
    ca_cert_path, ca_key_path = directory / CA_CERT, directory / CA_KEY
    if ca_cert_path.exists() and ca_key_path.exists():
        ca_cert = x509.load_pem_x509_certificate(ca_cert_path.read_bytes())
        ca_key = _load_ec_key(ca_key_path)
    elif ca_cert_path.exists() or ca_key_path.exists():
        # Replacing half a CA would silently break every client that trusts the old one.
        raise TlsMaterialError(
            f"{directory} holds only one of {CA_CERT} and {CA_KEY}; "
            "restore the other or remove both"
        )
    else:
        ca_key = ec.generate_private_key(ec.SECP256R1())
        ca_cert = _make_ca(ca_key, now)
        _write(ca_key_path, _key_pem(ca_key), mode=0o600)
        _write(ca_cert_path, ca_cert.public_bytes(serialization.Encoding.PEM), mode=0o644)

    files = TlsFiles(ca_cert_path, directory / SERVER_CERT, directory / SERVER_KEY)
    if _server_cert_needed(files, ca_cert, now):
        server_key = ec.generate_private_key(ec.SECP256R1())
        server_cert = _make_server_cert(server_key, ca_key, ca_cert, now)
        _write(files.server_key, _key_pem(server_key), mode=0o600)
        _write(files.server_cert, server_cert.public_bytes(serialization.Encoding.PEM), mode=0o644)
    return files


def _make_ca(key: ec.EllipticCurvePrivateKey, now: dt.datetime) -> x509.Certificate:
    name = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "lodestream"),
            x509.NameAttribute(NameOID.COMMON_NAME, "lodestream local CA"),
        ]
    )
    public = key.public_key()
    return (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(public)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - BACKDATE)
        .not_valid_after(now + CA_VALIDITY)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
        .sign(key, hashes.SHA256())
    )


def _make_server_cert(
    key: ec.EllipticCurvePrivateKey,
    ca_key: ec.EllipticCurvePrivateKey,
    ca_cert: x509.Certificate,
    now: dt.datetime,
) -> x509.Certificate:
    sans: list[x509.GeneralName] = [x509.DNSName(name) for name in SERVER_DNS_NAMES]
    sans += [x509.IPAddress(ip) for ip in SERVER_IPS]
    public = key.public_key()
    return (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")]))
        .issuer_name(ca_cert.subject)
        .public_key(public)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - BACKDATE)
        .not_valid_after(now + SERVER_VALIDITY)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=False,
                crl_sign=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )


def _server_cert_needed(files: TlsFiles, ca_cert: x509.Certificate, now: dt.datetime) -> bool:
    if not (files.server_cert.exists() and files.server_key.exists()):
        return True
    cert = x509.load_pem_x509_certificate(files.server_cert.read_bytes())
    if cert.not_valid_after_utc - now < RENEW_BEFORE:
        return True
    try:
        cert.verify_directly_issued_by(ca_cert)
    except (ValueError, TypeError, InvalidSignature):
        return True
    return False


def _load_ec_key(path: Path) -> ec.EllipticCurvePrivateKey:
    key = serialization.load_pem_private_key(path.read_bytes(), password=None)
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise TlsMaterialError(f"{path} is not an EC private key")
    return key


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _write(path: Path, data: bytes, *, mode: int) -> None:
    """Write via a temporary file and rename, so a crash never leaves half a key behind.

    The file is created with its final mode; a key is never readable by others, not even briefly.
    """
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        tmp.chmod(mode)  # the umask may have removed bits we asked for
        tmp.replace(path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
