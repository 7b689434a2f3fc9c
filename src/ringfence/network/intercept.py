"""TLS interception for rules that add headers to HTTPS requests (operator's choice:
``RINGFENCE_NETWORK_INTERCEPT``).

At start a CA is generated in memory; its private key never touches the disk and dies with
the process (so do the sandboxes that trust it). Sandboxes with a network policy see the
host's CA bundle plus this CA at ``/etc/ssl/certs/ca-certificates.crt``. For a tunnel whose
deciding rule has headers, the proxy completes the client's TLS handshake with a leaf
certificate for the CONNECT host (its SNI already checked against it), opens its own TLS
connection to the origin (verified against the host's trust store), and adds the headers to
the request it relays.
"""

from __future__ import annotations

import datetime
import hashlib
import os
import ssl
import tempfile
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

__all__ = ["HOST_BUNDLE", "SANDBOX_BUNDLE", "Interceptor", "TlsStream"]

HOST_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
SANDBOX_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"  # where sandboxes find the bundle
_VALID = datetime.timedelta(days=7)
_MAX_LEAVES = 1024


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


class Interceptor:
    """The CA, the sandbox's trust bundle, and TLS contexts for both ends of a tunnel."""

    def __init__(self, runtime_dir: Path, upstream: ssl.SSLContext | None = None) -> None:
        """``upstream``: how origins are verified (default: the host's trust store).

        Raises:
            OSError: the bundle cannot be written under ``runtime_dir``.
        """
        self._key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        self._ca_name = _name(f"Ringfence egress CA {os.getpid()}")
        self._ca = (
            x509.CertificateBuilder()
            .subject_name(self._ca_name)
            .issuer_name(self._ca_name)
            .public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + _VALID)
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
            .sign(self._key, hashes.SHA256())
        )
        self.ca_pem = self._ca.public_bytes(serialization.Encoding.PEM)
        host = HOST_BUNDLE.read_bytes() if HOST_BUNDLE.exists() else b""
        bundle = host.rstrip(b"\n") + b"\n" + self.ca_pem
        self.bundle = runtime_dir / f"egress-ca-{hashlib.sha256(bundle).hexdigest()[:16]}.pem"
        runtime_dir.mkdir(parents=True, exist_ok=True)
        temporary = self.bundle.with_suffix(".tmp")
        temporary.write_bytes(bundle)
        temporary.chmod(0o644)
        temporary.replace(self.bundle)
        self.upstream = upstream or ssl.create_default_context()
        self._leaves: dict[str, ssl.SSLContext] = {}

    def close(self) -> None:
        self.bundle.unlink(missing_ok=True)

    def server_context(self, host: str) -> ssl.SSLContext:
        """A TLS server context presenting a leaf certificate for ``host``."""
        context = self._leaves.get(host)
        if context is None:
            if len(self._leaves) >= _MAX_LEAVES:
                self._leaves.clear()
            context = self._leaves[host] = self._leaf_context(host)
        return context

    def _leaf_context(self, host: str) -> ssl.SSLContext:
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        try:
            import ipaddress

            alt: x509.GeneralName = x509.IPAddress(ipaddress.ip_address(host))
        except ValueError:
            alt = x509.DNSName(host)
        cert = (
            x509.CertificateBuilder()
            .subject_name(_name(host[:64]))
            .issuer_name(self._ca_name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + _VALID)
            .add_extension(x509.SubjectAlternativeName([alt]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .sign(self._key, hashes.SHA256())
        )
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        # load_cert_chain reads files only: a private directory, removed at once.
        with tempfile.TemporaryDirectory(prefix="ringfence-leaf-") as directory:
            path = Path(directory, "leaf.pem")
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as out:
                out.write(
                    key.private_bytes(
                        serialization.Encoding.PEM,
                        serialization.PrivateFormat.PKCS8,
                        serialization.NoEncryption(),
                    )
                )
                out.write(cert.public_bytes(serialization.Encoding.PEM))
            context.load_cert_chain(path)
        return context


class TlsStream:
    """The server side of TLS over an asyncio stream, fed the bytes already read from it
    (the ClientHello the proxy inspected)."""

    def __init__(
        self,
        context: ssl.SSLContext,
        reader: object,
        writer: object,
        initial: bytes,
    ) -> None:
        import asyncio

        assert isinstance(reader, asyncio.StreamReader)
        assert isinstance(writer, asyncio.StreamWriter)
        self._reader = reader
        self._writer = writer
        self._incoming = ssl.MemoryBIO()
        self._outgoing = ssl.MemoryBIO()
        self._tls = context.wrap_bio(self._incoming, self._outgoing, server_side=True)
        self._incoming.write(initial)

    async def _flush(self) -> None:
        data = self._outgoing.read()
        if data:
            self._writer.write(data)
            await self._writer.drain()

    async def _fill(self) -> bool:
        chunk = await self._reader.read(65536)
        if not chunk:
            self._incoming.write_eof()
            return False
        self._incoming.write(chunk)
        return True

    async def handshake(self) -> None:
        """Raises ``ssl.SSLError`` or ``ConnectionError``."""
        while True:
            try:
                self._tls.do_handshake()
                await self._flush()
                return
            except ssl.SSLWantReadError:
                await self._flush()
                if not await self._fill():
                    raise ConnectionError("the client left during the TLS handshake") from None

    async def read(self, size: int = 65536) -> bytes:
        """Plaintext from the client; b"" at its end."""
        while True:
            try:
                return self._tls.read(size)
            except ssl.SSLWantReadError:
                await self._flush()
                if not await self._fill():
                    return b""
            except (ssl.SSLZeroReturnError, ssl.SSLEOFError):
                return b""

    async def write(self, data: bytes) -> None:
        self._tls.write(data)
        await self._flush()
