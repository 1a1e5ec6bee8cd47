"""NATS user nkeys: a site's seed and public key, and the check nats-server applies to a key.

Kept light (no event models, no NATS client): ``lode`` imports it at every start, for the
monitoring credential.

A key that merely looks right (``U`` and 55 base32 letters) but whose CRC-16
does not match is refused by nats-server when it loads its configuration, so
accepting one would break the next reload for every site. nkeys 0.2.1 has no
public-key decoder; this is the same decoding as Go's ``nkeys.FromPublicKey``.
"""

from __future__ import annotations

import base64
import re
import secrets
from typing import Annotated, Final

import nkeys
from pydantic import AfterValidator, Field, StringConstraints

USER_PUBLIC_KEY_PATTERN: Final = r"^U[A-Z2-7]{55}$"
USER_PUBLIC_KEY_FORMAT: Final = "nkey-user"  # JSON Schema "format": the checksum is part of it
_USER_PUBLIC_KEY_RE: Final = re.compile(USER_PUBLIC_KEY_PATTERN)
_CRC_BYTES: Final = 2


def new_user_seed() -> bytes:
    """A fresh nkey user seed (``SU…``). Sites call this; the seed never leaves the site."""
    seed: bytes = nkeys.encode_seed(secrets.token_bytes(32), nkeys.PREFIX_BYTE_USER)
    return seed


def user_public_key(seed: bytes) -> str:
    """The public key (``U…``) a site registers with the control plane for ``seed``."""
    public: bytes = nkeys.from_seed(bytearray(seed)).public_key
    return public.decode()


def check_user_public_key(key: str) -> str:
    """Return ``key`` if it is a valid NATS user public key; raise ValueError saying why not."""
    if not _USER_PUBLIC_KEY_RE.fullmatch(key):
        raise ValueError(
            "not an nkey user public key: expected 'U' followed by 55 characters A-Z and 2-7"
        )
    # 56 base32 characters are exactly 35 bytes (no padding): prefix, 32-byte key, CRC-16.
    raw = base64.b32decode(key)
    body, crc = raw[:-_CRC_BYTES], int.from_bytes(raw[-_CRC_BYTES:], "little")
    if body[0] != nkeys.PREFIX_BYTE_USER:
        raise ValueError("not an nkey user public key: its prefix byte is not a user's")
    if int(nkeys.crc16(body)) != crc:
        raise ValueError(
            "not a valid nkey: its checksum does not match (copy the public key again, whole)"
        )
    return key


UserPublicKey = Annotated[
    str,
    StringConstraints(pattern=USER_PUBLIC_KEY_PATTERN),
    AfterValidator(check_user_public_key),
    Field(json_schema_extra={"format": USER_PUBLIC_KEY_FORMAT}),
]
"""A user public key as a pydantic field: JSON Schema shows the pattern and names the format;
the checksum is checked after the pattern."""
