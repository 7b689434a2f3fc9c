"""The key that seals the audit log: Ed25519, made on first use, kept beside the database.

The private key never leaves the data directory (a file readable by its owner only); the
public key travels in every seal and is what ``ringfence audit verify --public-key`` pins.
"""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from ringfence._keyfiles import create_once
from ringfence.audit.chain import seal_message
from ringfence.errors import InvalidRequest

__all__ = ["KEY_FILE", "SealKey", "check_seal", "parse_public_key"]

KEY_FILE = "audit-seal-key"


class SealKey:
    """Signs seals. ``public_key`` is the base64 of the raw 32-byte public key."""

    def __init__(self, private: Ed25519PrivateKey) -> None:
        self._private = private
        raw = private.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
        self.public_key = base64.b64encode(raw).decode()

    @classmethod
    def generate(cls) -> SealKey:
        return cls(Ed25519PrivateKey.generate())

    @classmethod
    def load_or_create(cls, data_dir: Path) -> SealKey:
        """The key in ``data_dir``, made (0600, atomically) when there is none.

        Raises:
            OSError: the file cannot be read or written.
            ValueError: the file holds no key.
        """
        path = data_dir / KEY_FILE
        try:
            seed = base64.b64decode(path.read_text().strip(), validate=True)
            return cls(Ed25519PrivateKey.from_private_bytes(seed))
        except FileNotFoundError:
            pass
        from cryptography.hazmat.primitives.serialization import NoEncryption, PrivateFormat

        key = Ed25519PrivateKey.generate()
        seed = key.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())
        if not create_once(path, seed):  # another process made one meanwhile: use it
            return cls.load_or_create(data_dir)
        return cls(key)

    def sign(self, seq: int, at: str, prev_hash: str) -> dict[str, Any]:
        """A seal's details: the signature over its position, time and predecessor."""
        signature = self._private.sign(seal_message(seq, at, prev_hash))
        return {"public_key": self.public_key, "signature": base64.b64encode(signature).decode()}


def parse_public_key(public_key: str) -> Ed25519PublicKey:
    """Raises ``InvalidRequest`` when ``public_key`` is not a base64 Ed25519 public key."""
    try:
        return Ed25519PublicKey.from_public_bytes(base64.b64decode(public_key, validate=True))
    except ValueError as exc:
        raise InvalidRequest(f"not an Ed25519 public key (base64 of 32 bytes): {exc}") from exc


def check_seal(seq: int, at: str, prev_hash: str, details: dict[str, Any], public_key: str) -> bool:
    """Whether ``details`` hold a valid signature by ``public_key`` (base64) for that place.

    Raises:
        InvalidRequest: ``public_key`` is not a base64 Ed25519 public key.
    """
    key = parse_public_key(public_key)
    try:
        signature = base64.b64decode(str(details.get("signature", "")), validate=True)
        key.verify(signature, seal_message(seq, at, prev_hash))
    except (InvalidSignature, ValueError):
        return False
    return True
