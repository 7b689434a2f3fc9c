"""Fixtures for egress tests: origin servers on this machine's loopback, known to
Ringfence's resolver under test names, and a local executor whose proxy resolves only
those names (nothing is ever asked of a real resolver or sent off this machine)."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import ipaddress
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from ringfence.audit.chain import AuditRecord
from ringfence.audit.signing import SealKey
from ringfence.config import Config
from ringfence.models import AuditQuery
from ringfence.network import EgressGateway, Resolver
from ringfence.network.gateway import LISTENING
from ringfence.policy.egress import own_endpoints
from ringfence.service.audit import AuditLog
from ringfence.store import MemoryStore

# Every name the tests use; all of them are this machine's loopback, seen from the host.
TEST_NAMES = (
    "allowed.test", "other.test", "wild.test", "a.wild.test", "b.a.wild.test",
    "denied.test", "secret.test", "ask.test", "evil.test",
)  # fmt: skip


@dataclass
class Origin:
    """A server on the host's loopback that records what reaches it."""

    port: int
    heads: list[bytes] = field(default_factory=list)  # plain HTTP request heads
    connections: int = 0
    received: int = 0  # bytes, over every connection


async def _http(origin: Origin, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    origin.connections += 1
    with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
        head = await reader.readuntil(b"\r\n\r\n")
        origin.received += len(head)
        origin.heads.append(head)
        body = b"hello from origin\n"
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % len(body) + body
        )
        await writer.drain()
    writer.close()


@pytest.fixture
async def http_origin() -> AsyncIterator[Origin]:
    origin = Origin(0)
    server = await asyncio.start_server(lambda r, w: _http(origin, r, w), "127.0.0.1", 0)
    origin.port = server.sockets[0].getsockname()[1]
    async with server:
        yield origin


def _certificate(directory: Path) -> tuple[Path, Path]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "allowed.test")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName(n) for n in TEST_NAMES]
                + [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / "cert.pem", directory / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


@pytest.fixture(scope="session")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return _certificate(tmp_path_factory.mktemp("tls"))


async def _tls(origin: Origin, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    origin.connections += 1
    with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError, ssl.SSLError):
        head = await reader.readuntil(b"\r\n\r\n")
        origin.received += len(head)
        origin.heads.append(head)
        body = b"hello over tls\n"
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
        await writer.drain()
    writer.close()


@pytest.fixture
async def tls_origin(tls_files: tuple[Path, Path]) -> AsyncIterator[Origin]:
    origin = Origin(0)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(*tls_files)
    server = await asyncio.start_server(
        lambda r, w: _tls(origin, r, w), "127.0.0.1", 0, ssl=context
    )
    origin.port = server.sockets[0].getsockname()[1]
    async with server:
        yield origin


@pytest.fixture
async def raw_origin() -> AsyncIterator[Origin]:
    """A TCP server that only counts the bytes that reach it (no TLS, never answers)."""
    origin = Origin(0)

    async def count(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        origin.connections += 1
        with contextlib.suppress(ConnectionError):
            while chunk := await reader.read(65536):
                origin.received += len(chunk)
        writer.close()

    server = await asyncio.start_server(count, "127.0.0.1", 0)
    origin.port = server.sockets[0].getsockname()[1]
    async with server:
        yield origin


@pytest.fixture
def gateway() -> EgressGateway:
    return EgressGateway(
        Resolver({name: ["127.0.0.1"] for name in TEST_NAMES}, system=False),
        own=own_endpoints(LISTENING),
    )


@pytest.fixture
async def egress_executor(local_host: object, gateway: EgressGateway) -> AsyncIterator[object]:
    from ringfence.backends.local import LocalExecutor
    from ringfence.backends.local.probe import Host

    assert isinstance(local_host, Host)
    executor = LocalExecutor(Config(), host=local_host, egress=gateway)
    yield executor
    await executor.aclose()


@pytest.fixture
async def audit() -> AsyncIterator[AuditLog]:
    log = AuditLog(MemoryStore(), SealKey.generate(), seal_interval=3600)
    log.start()
    yield log
    await log.aclose()


async def audited(audit: AuditLog, action: str = "network.") -> list[AuditRecord]:
    await audit.flush()
    return await audit.query(AuditQuery(action=action, limit=1000))


@pytest.fixture
async def intercepting_executor(
    local_host: object, tls_files: tuple[Path, Path]
) -> AsyncIterator[object]:
    """A local executor whose proxy intercepts TLS for header rules; it trusts the test
    origins' certificate upstream (the host's trust store would not)."""
    from ringfence.backends.local import LocalExecutor
    from ringfence.backends.local.probe import Host
    from ringfence.network.intercept import Interceptor

    assert isinstance(local_host, Host)
    config = Config()
    upstream = ssl.create_default_context(cafile=str(tls_files[0]))
    interceptor = Interceptor(config.runtime_dir, upstream)
    resolver = Resolver({name: ["127.0.0.1"] for name in TEST_NAMES}, system=False)
    executor = LocalExecutor(
        config,
        host=local_host,
        egress=EgressGateway(resolver, interceptor, own=own_endpoints(LISTENING)),
    )
    yield executor
    await executor.aclose()
    interceptor.close()
