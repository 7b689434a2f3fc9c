"""The egress gateway: Ringfence's proxy and resolver, attached to each sandbox that has a
network policy, on the sandbox's own loopback.

``attach`` makes three sockets inside the sandbox's (otherwise empty) network namespace,
before the sandbox's command starts: the proxy on 127.0.0.1:3128 (TCP) and the resolver on
127.0.0.1:53 (UDP and TCP). The event loop of the Ringfence process serves them. There is
no route out of the namespace, so these sockets are the sandbox's only way out, whatever it
does: a direct connection to any address, another port, UDP, IPv6 or a raw socket has
nowhere to go (see docs/network.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import os
import socket
import struct
from typing import cast

from ringfence.models import NetworkPolicy
from ringfence.network import dns
from ringfence.network.intercept import Interceptor
from ringfence.network.netns import ListenSpec, listen_in_netns, no_route_counts, open_netns
from ringfence.network.proxy import serve_client
from ringfence.network.resolver import Resolver, ResolverBusy
from ringfence.network.session import EgressSession, Requester
from ringfence.policy.egress import (
    OwnEndpoints,
    check_addresses,
    decide,
    name_resolvable,
)

__all__ = [
    "DNS_PORT",
    "LISTENING",
    "PROXY_PORT",
    "PROXY_URL",
    "Attachment",
    "EgressGateway",
    "proxy_env",
]

log = logging.getLogger(__name__)

PROXY_PORT = 3128
DNS_PORT = 53
PROXY_URL = f"http://127.0.0.1:{PROXY_PORT}"
# Where the gateway listens (inside each sandbox's namespace): Ringfence's own, on any host.
LISTENING = (
    (ipaddress.IPv4Address("127.0.0.1"), PROXY_PORT),
    (ipaddress.IPv4Address("127.0.0.1"), DNS_PORT),
)
# Per sandbox, connections and DNS questions in flight at once: past it, new ones are
# dropped, so a sandbox cannot exhaust the server's descriptors or memory through its proxy.
MAX_IN_FLIGHT = 256


def proxy_env() -> dict[str, str]:
    """The variables that point common tools (pip, curl, git, npm) at the proxy."""
    return {
        "HTTP_PROXY": PROXY_URL, "HTTPS_PROXY": PROXY_URL,
        "http_proxy": PROXY_URL, "https_proxy": PROXY_URL,
        "NO_PROXY": "localhost,127.0.0.1,::1", "no_proxy": "localhost,127.0.0.1,::1",
    }  # fmt: skip


class Attachment:
    """The gateway's listeners in one sandbox, and its session."""

    def __init__(self, gateway: EgressGateway, session: EgressSession) -> None:
        self.session = session
        self._gateway = gateway
        self._servers: list[asyncio.AbstractServer] = []
        self._transports: list[asyncio.BaseTransport] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False
        self._netns: int | None = None  # held to read its counters at the end

    async def aclose(self) -> None:
        """Stop listening and cut every connection of this sandbox."""
        if self._closed:
            return
        self._closed = True
        self._gateway._forget(self)
        self._record_blocked()
        for server in self._servers:
            server.close()
        for transport in self._transports:
            transport.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def _record_blocked(self) -> None:
        """Direct attempts never reach Ringfence (the kernel refuses them: no route), but
        the namespace counts them: their number goes on the audit record."""
        if self._netns is None:
            return
        try:
            counts = no_route_counts(self._netns)
        except OSError as exc:
            log.warning("cannot read the sandbox's network counters: %s", exc)
            counts = {}
        finally:
            os.close(self._netns)
            self._netns = None
        if any(counts.values()):
            details = {
                "ipv4_no_route": counts.get("ipv4", 0),
                "ipv6_no_route": counts.get("ipv6", 0),
            }
            self.session.record("network.blocked", "denied", details)
        if self.session.unrecorded_questions:
            self.session.record(
                "network.dns", "unrecorded", {"questions": self.session.unrecorded_questions}
            )

    def _track(self, coroutine: object) -> bool:
        assert asyncio.iscoroutine(coroutine)
        if len(self._tasks) >= MAX_IN_FLIGHT or self._closed:
            coroutine.close()
            return False
        task: asyncio.Task[None] = asyncio.ensure_future(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return True


class EgressGateway:
    """Attaches the proxy and the resolver to sandboxes, and finds a running sandbox's
    session to change its policy."""

    def __init__(
        self,
        resolver: Resolver | None = None,
        interceptor: Interceptor | None = None,
        *,
        own: OwnEndpoints,
    ) -> None:
        """``interceptor``: open TLS tunnels whose rule adds headers (None: never).
        ``own``: Ringfence's endpoints, never a destination (``network.own``): required, as
        a default would protect too little (fail closed)."""
        self.resolver = resolver or Resolver()
        self.interceptor = interceptor
        self.own = own
        self._attached: dict[tuple[str, str], Attachment] = {}

    def session(self, tenant: str, subject: str) -> EgressSession | None:
        """The session of a running sandbox, or None."""
        attachment = self._attached.get((tenant, subject))
        return attachment.session if attachment is not None else None

    def rebind(self, tenant: str, subject: str, requester: Requester) -> EgressSession | None:
        """Hand the session of (``tenant``, ``subject``) over to ``requester``: a pooled
        sandbox's egress, now its claimer's (its records, asks and later policy changes
        are the claimer's). None if there is no such session.
        """
        attachment = self._attached.pop((tenant, subject), None)
        if attachment is None:
            return None
        attachment.session.hand_over(requester)
        self._attached[(requester.tenant, requester.subject)] = attachment
        return attachment.session

    async def attach(self, pid: int, requester: Requester, policy: NetworkPolicy) -> Attachment:
        """Serve the proxy and the resolver inside the network namespace of ``pid``.

        Raises:
            OSError: the namespace could not be entered or the sockets not bound.
        """
        proxy, resolver_udp, resolver_tcp = listen_in_netns(
            pid,
            [ListenSpec(socket.SOCK_STREAM, PROXY_PORT), ListenSpec(socket.SOCK_DGRAM, DNS_PORT),
             ListenSpec(socket.SOCK_STREAM, DNS_PORT)],
        )  # fmt: skip
        attachment = Attachment(self, EgressSession(requester, policy))
        try:
            attachment._netns = open_netns(pid)
            loop = asyncio.get_running_loop()
            session = attachment.session

            def on_client(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
                served = serve_client(
                    session, self.resolver, reader, writer, self.interceptor, own=self.own
                )
                if not attachment._track(served):
                    writer.close()

            def on_dns_stream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
                if not attachment._track(self._dns_over_tcp(session, reader, writer)):
                    writer.close()

            attachment._servers.append(await asyncio.start_server(on_client, sock=proxy))
            attachment._servers.append(await asyncio.start_server(on_dns_stream, sock=resolver_tcp))
            transport, _ = await loop.create_datagram_endpoint(
                lambda: _DnsProtocol(self, attachment), sock=resolver_udp
            )
            attachment._transports.append(transport)
        except BaseException:
            for sock in (proxy, resolver_udp, resolver_tcp):
                sock.close()
            await attachment.aclose()
            raise
        self._attached[(requester.tenant, requester.subject)] = attachment
        return attachment

    def _forget(self, attachment: Attachment) -> None:
        key = (attachment.session.requester.tenant, attachment.session.requester.subject)
        if self._attached.get(key) is attachment:
            del self._attached[key]

    async def answer(self, session: EgressSession, query: bytes) -> bytes | None:
        """The resolver's answer to one DNS message from the sandbox: addresses for names
        the policy allows, NXDOMAIN for every other name; every question is audited."""
        question = dns.parse_query(query)
        if question is None:
            return dns.format_error(query)
        name, policy = question.name, session.policy
        if not name_resolvable(policy, name):
            session.record_question(
                name, question.qtype, "denied", {"name": name, "type": question.qtype}
            )
            return dns.answer(question, dns.NXDOMAIN)
        addresses: list[ipaddress.IPv4Address] = []
        if question.qtype == dns.TYPE_A:
            try:
                found = await self.resolver.resolve(name, session)
            except ResolverBusy:
                details = {"name": name, "type": question.qtype, "reason": "lookups busy"}
                session.record_question(name, question.qtype, "failed", details)
                return dns.answer(question, dns.SERVFAIL)
            # The addresses a connection to this name could use (IPv6 has no way out).
            for port in sorted({p for rule in policy.rules for p in rule.ports}):
                verdict = decide(policy, name, port)
                if verdict.rule is None or verdict.action.value == "deny":
                    continue
                checked = check_addresses(policy, verdict, name, port, found, own=self.own)
                addresses = [a for a in checked.addresses if isinstance(a, ipaddress.IPv4Address)]
                if addresses:
                    break
        session.record_question(
            name, question.qtype, "allowed",
            {"name": name, "type": question.qtype, "answers": [str(a) for a in addresses]},
        )  # fmt: skip
        return dns.answer(question, dns.NOERROR, addresses)

    async def _dns_over_tcp(
        self, session: EgressSession, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        try:
            while True:
                size = struct.unpack("!H", await reader.readexactly(2))[0]
                reply = await self.answer(session, await reader.readexactly(size))
                if reply is None:
                    return
                writer.write(struct.pack("!H", len(reply)) + reply)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            return
        finally:
            writer.close()


class _DnsProtocol(asyncio.DatagramProtocol):
    def __init__(self, gateway: EgressGateway, attachment: Attachment) -> None:
        self._gateway = gateway
        self._attachment = attachment
        self._transport: asyncio.DatagramTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.DatagramTransport, transport)

    def datagram_received(self, data: bytes, addr: tuple[str | object, int]) -> None:
        self._attachment._track(self._reply(data, addr))

    async def _reply(self, data: bytes, addr: tuple[str | object, int]) -> None:
        reply = await self._gateway.answer(self._attachment.session, data)
        if reply is not None and self._transport is not None:
            with contextlib.suppress(OSError):
                self._transport.sendto(reply, addr)
