"""Brokered credentials (egress rules' header values): the one rule, and the key it needs.

The rule, for sandboxes, executions and proposals alike: a credential value is never
returned by the API, written to the audit log, a webhook, a log line or a console page, nor
stored in clear.

- A sandbox's and an execution's values live only in the process that runs them (the
  egress proxy's policy); the store, the answers and the audit log have the policy with
  every value replaced by ``<redacted>`` (``NetworkPolicy.redacted``).
- A proposal must keep its values until it is approved, perhaps after a restart or on
  another replica: they are stored sealed (AES-256-GCM, bound to the tenant and the
  proposal id) under this key, which lives outside the database. What the proposal shows,
  stores in clear and digests has each value replaced by a marker,
  ``<redacted hmac-sha256:HEX>``: a keyed fingerprint (HMAC-SHA256 under this key, the
  first 128 bits) of the tenant, the proposal id, the header's name and the value, so the
  digest an approver approves binds the exact values (another value is another marker,
  another digest: a new approval), and the value itself, however guessable, can be neither
  read nor tested from it without the key. Equal values show as equal within one proposal
  only: were markers the same across proposals, any key that may propose could propose a
  guessed value and compare its marker with another proposal's (a guessing oracle).

A sandbox paused to disk keeps its environment and egress policy (values included) for its
resume, perhaps after a restart: sealed the same way (bound to the tenant and the sandbox id,
under a key derived from this one), in its directory in the data directory, never in clear.

The key is a file in the data directory (``credentials-key``, 32 random bytes in base64,
made 0600 on first start). Replicas that share a database must share it, as they share
the audit seal key: a proposal sealed under another key fails when approved, it never runs
without its credentials.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets
import stat
from pathlib import Path

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from pydantic import ValidationError

from ringfence._keyfiles import create_once
from ringfence.errors import Conflict
from ringfence.models import NetworkPolicy

__all__ = ["KEY_FILE", "CredentialKey", "is_marker"]

KEY_FILE = "credentials-key"
_MARKER_PREFIX = "<redacted hmac-sha256:"
_FINGERPRINT_BYTES = 16
_NONCE_BYTES = 12
_VERSION = b"\x01"


def is_marker(value: str) -> bool:
    """Whether ``value`` is a proposal's redacted form of a credential."""
    return value.startswith(_MARKER_PREFIX) and value.endswith(">")


class CredentialKey:
    """Seals a proposal's credential values and fingerprints them."""

    def __init__(self, secret: bytes) -> None:
        if len(secret) != 32:
            raise ValueError("a credentials key is 32 bytes")
        self._seal = AESGCM(hmac.digest(secret, b"ringfence credentials: seal", hashlib.sha256))
        self._mark = hmac.digest(secret, b"ringfence credentials: mark", hashlib.sha256)
        self._state = AESGCM(hmac.digest(secret, b"ringfence credentials: state", hashlib.sha256))
        self._secret = secret

    @classmethod
    def generate(cls) -> CredentialKey:
        """A key for this process only: what it seals dies with it."""
        return cls(secrets.token_bytes(32))

    @classmethod
    def load_or_create(cls, data_dir: Path) -> CredentialKey:
        """The key in ``data_dir``, made (0600, atomically) when there is none.

        Raises:
            OSError: the file cannot be read or written.
            ValueError: the file holds no key, or others than its owner and group may read
                it (a key anyone on the host reads protects nothing).
        """
        path = data_dir / KEY_FILE
        try:
            mode = path.stat().st_mode
        except FileNotFoundError:
            return cls._create(data_dir, path)
        if mode & stat.S_IROTH:
            raise ValueError(f"{path} is readable by every user: chmod 600 it")
        try:
            return cls.from_text(path.read_text())
        except ValueError as exc:
            raise ValueError(f"{path} holds no credentials key: {exc}") from exc

    @classmethod
    def from_text(cls, text: str) -> CredentialKey:
        """The key a key file's ``text`` holds. Raises ``ValueError`` if none."""
        try:
            return cls(base64.b64decode(text.strip(), validate=True))
        except binascii.Error as exc:
            raise ValueError(f"not base64: {exc}") from None

    @classmethod
    def _create(cls, data_dir: Path, path: Path) -> CredentialKey:
        secret = secrets.token_bytes(32)
        if not create_once(path, secret):  # another process made one meanwhile: use it
            return cls.load_or_create(data_dir)
        return cls(secret)

    def marked(self, policy: NetworkPolicy, *, tenant: str, proposal_id: str) -> NetworkPolicy:
        """``policy`` with each header value replaced by its marker, for this tenant's
        proposal only."""
        context = _context(tenant, proposal_id)
        rules = [
            rule.model_copy(
                update={
                    "headers": {n: self._marker(context, n, v) for n, v in rule.headers.items()}
                }
            )
            for rule in policy.rules
        ]
        return policy.model_copy(update={"rules": rules})

    def seal(self, policy: NetworkPolicy, *, tenant: str, proposal_id: str) -> str:
        """The policy, values included, encrypted for this tenant's proposal only."""
        nonce = secrets.token_bytes(_NONCE_BYTES)
        sealed = self._seal.encrypt(
            nonce, policy.model_dump_json().encode(), _context(tenant, proposal_id)
        )
        return base64.b64encode(_VERSION + nonce + sealed).decode()

    def open(
        self, sealed: str, marked: NetworkPolicy, *, tenant: str, proposal_id: str
    ) -> NetworkPolicy:
        """The policy ``seal`` sealed, checked to be the one ``marked`` shows.

        Raises:
            Conflict: sealed under another key, for another proposal, altered, or its
                values are not the ones the (approved) markers stand for.
        """
        try:
            raw = base64.b64decode(sealed, validate=True)
            if raw[:1] != _VERSION:
                raise ValueError("unknown format")
            nonce, body = raw[1 : 1 + _NONCE_BYTES], raw[1 + _NONCE_BYTES :]
            opened = self._seal.decrypt(nonce, body, _context(tenant, proposal_id))
            policy = NetworkPolicy.model_validate_json(opened)
        except (binascii.Error, ValueError, InvalidTag, ValidationError) as exc:
            raise Conflict(
                "this proposal's credentials cannot be opened with this server's credentials "
                f"key ({type(exc).__name__}): replicas must share the data directory's "
                f"{KEY_FILE}; propose it again"
            ) from None
        if self.marked(policy, tenant=tenant, proposal_id=proposal_id) != marked:
            raise Conflict(
                "this proposal's sealed credentials are not the ones it shows (or it was "
                "proposed by a version whose markers were not bound to their proposal): "
                "refused; propose it again"
            )
        return policy

    def seal_state(self, data: bytes, *, tenant: str, sandbox_id: str) -> bytes:
        """``data`` (a paused sandbox's environment and egress policy, values included)
        encrypted for this tenant's sandbox only."""
        nonce = secrets.token_bytes(_NONCE_BYTES)
        sealed = self._state.encrypt(nonce, data, _state_context(tenant, sandbox_id))
        return _VERSION + nonce + sealed

    def open_state(self, sealed: bytes, *, tenant: str, sandbox_id: str) -> bytes:
        """What ``seal_state`` sealed.

        Raises:
            Conflict: sealed under another key, for another sandbox, or altered.
        """
        try:
            if sealed[:1] != _VERSION:
                raise ValueError("unknown format")
            nonce, body = sealed[1 : 1 + _NONCE_BYTES], sealed[1 + _NONCE_BYTES :]
            return self._state.decrypt(nonce, body, _state_context(tenant, sandbox_id))
        except (ValueError, InvalidTag) as exc:
            raise Conflict(
                f"sandbox {sandbox_id}'s saved environment cannot be opened with this "
                f"server's credentials key ({type(exc).__name__}): it was saved under another "
                f"key (replicas must share the data directory's {KEY_FILE}) or altered"
            ) from None

    def derive(self, purpose: str) -> bytes:
        """A 32-byte key for ``purpose`` (as the local runtime's key that seals and checks
        exported snapshots), derived from this one: it changes only with it."""
        return hmac.digest(self._secret, f"ringfence key: {purpose}".encode(), hashlib.sha256)

    def _marker(self, context: bytes, name: str, value: str) -> str:
        # Every part but the value is free of NULs (ids and header names are tokens).
        message = context + f"\0{name.lower()}\0{value}".encode()
        fingerprint = hmac.digest(self._mark, message, hashlib.sha256)[:_FINGERPRINT_BYTES]
        return f"{_MARKER_PREFIX}{fingerprint.hex()}>"


def _state_context(tenant: str, sandbox_id: str) -> bytes:
    return f"ringfence paused sandbox\0{tenant}\0{sandbox_id}".encode()


def _context(tenant: str, proposal_id: str) -> bytes:
    return f"ringfence proposal credentials\0{tenant}\0{proposal_id}".encode()
