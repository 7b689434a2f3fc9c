"""The control plane's egress proxy for its sandbox Pods: one listening socket, and each
connection's sandbox told by its source address (docs/network.md, "Enforcement on
Kubernetes").

On ``local`` a sandbox's identity is the socket Ringfence made inside its network
namespace. A sandbox Pod's connections all arrive at one socket of the replica that runs it,
so the identity is the connection's source address: the Pod's IP, which that replica read
from its own watch of the Pod it created. It holds because the sandbox NetworkPolicy lets
such a Pod reach only the control plane's proxy port, the Pod has no capability to forge
packets (``NET_RAW`` is dropped), the CNI drops packets whose source is not the Pod's own
address, and a TCP connection needs the answer to come back to that address. An address
that is no sandbox of this replica (another replica's, a Pod that has ended, anyone else)
gets an immediate 403.

An address is registered once the Pod is ready and unregistered *before* its Pod is deleted
(and at the first sign of its deletion by someone else), with its open connections cut, so
a later Pod given the same address never inherits the policy.

A second, tiny listener, the gate, answers one question for a Job's Pod (whose command
starts with its container, before the replica has seen its address): "does the proxy admit
my address for this owner yet?" (``egress.gate_command``). It tells nothing else.

The decisions, the audit and ``ask`` are the local proxy's (``network.proxy``), unchanged.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging

from ringfence.network.gateway import MAX_IN_FLIGHT
from ringfence.network.http import response
from ringfence.network.intercept import Interceptor
from ringfence.network.proxy import serve_client
from ringfence.network.resolver import Resolver
from ringfence.network.session import EgressSession
from ringfence.policy.egress import OwnEndpoints

__all__ = ["PodEgressProxy", "pod_address"]

log = logging.getLogger(__name__)

Address = ipaddress.IPv4Address | ipaddress.IPv6Address


def pod_address(text: str) -> Address:
    """A Pod's (or a peer's) address, IPv4-mapped IPv6 seen as the IPv4 address it is.

    Raises:
        ValueError: not an IP address.
    """
    address = ipaddress.ip_address(text.split("%", 1)[0])
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


_GATE_READ_SECONDS = 5.0
_GATE_LINE_BYTES = 1024
_GATE_PER_ADDRESS = 4  # questions in flight from one address; past it, closed at once


class _Registration:
    def __init__(self, session: EgressSession, owner: str) -> None:
        self.session = session
        self.owner = owner
        self.tasks: set[asyncio.Task[None]] = set()


class PodEgressProxy:
    """Serves the sandbox Pods this replica runs, each by its own session and policy."""

    def __init__(
        self,
        resolver: Resolver,
        interceptor: Interceptor | None = None,
        *,
        own: OwnEndpoints,
    ) -> None:
        """``own``: Ringfence's endpoints (its API, this proxy and gate), never a destination:
        required, as a default would protect nothing (fail closed)."""
        self._resolver = resolver
        self._interceptor = interceptor
        self._own = own
        self._pods: dict[Address, _Registration] = {}
        self._servers: list[asyncio.AbstractServer] = []
        self._asking: dict[Address, int] = {}  # gate questions in flight, by address
        self._gate_tasks: set[asyncio.Task[None]] = set()

    async def start(self, host: str | None, port: int) -> int:
        """Listen on ``host:port`` (host None: every address of both families, on a port
        given; port 0: any free one); returns the port.

        Raises:
            OSError: it cannot listen there.
        """
        server = await asyncio.start_server(self._on_client, host, port)
        self._servers.append(server)
        return int(server.sockets[0].getsockname()[1])

    async def start_gate(self, host: str | None, port: int) -> int:
        """Listen for the gate's question on ``host:port`` (as ``start``); returns the port.

        Raises:
            OSError: it cannot listen there.
        """
        server = await asyncio.start_server(self._on_gate, host, port, limit=_GATE_LINE_BYTES)
        self._servers.append(server)
        return int(server.sockets[0].getsockname()[1])

    def register(self, pod_ip: str, session: EgressSession, owner: str = "") -> None:
        """Connections from ``pod_ip`` are ``session``'s from now on. ``owner``: what the
        gate of its Pod names (``execution:<id>``; default: the session's subject).

        Raises:
            ValueError: not an address, or one still registered (its Pod not yet
                unregistered: two sandboxes never share an address's policy).
        """
        address = pod_address(pod_ip)
        if address in self._pods:
            raise ValueError(f"{address} is still the address of another sandbox")
        self._pods[address] = _Registration(session, owner or session.requester.subject)

    def session_at(self, pod_ip: str) -> EgressSession | None:
        """The session of the sandbox at ``pod_ip``, or None."""
        registration = self._pods.get(pod_address(pod_ip))
        return registration.session if registration is not None else None

    def session(self, tenant: str, subject: str) -> EgressSession | None:
        """The session of a running sandbox (to change its policy), or None: the lookup
        ``EgressGateway.session`` offers on ``local``."""
        for registration in self._pods.values():
            requester = registration.session.requester
            if (requester.tenant, requester.subject) == (tenant, subject):
                return registration.session
        return None

    async def unregister(self, pod_ip: str) -> None:
        """Forget ``pod_ip`` and cut its open connections; unknown is fine."""
        registration = self._pods.pop(pod_address(pod_ip), None)
        if registration is None:
            return
        for task in list(registration.tasks):
            task.cancel()
        await asyncio.gather(*registration.tasks, return_exceptions=True)

    async def aclose(self) -> None:
        for server in self._servers:
            server.close()
        for task in list(self._gate_tasks):
            task.cancel()
        await asyncio.gather(*self._gate_tasks, return_exceptions=True)
        for address in list(self._pods):
            await self.unregister(str(address))

    def _registration(self, writer: asyncio.StreamWriter) -> _Registration | None:
        """The registration of the connection's source address, if any."""
        peer = writer.get_extra_info("peername")
        if isinstance(peer, tuple) and peer:
            return self._pods.get(pod_address(str(peer[0])))
        return None

    def _on_gate(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        if not (isinstance(peer, tuple) and peer):
            writer.close()
            return
        address = pod_address(str(peer[0]))
        if self._asking.get(address, 0) >= _GATE_PER_ADDRESS:
            writer.close()  # a Pod asks one question at a time: no descriptors hoarded
            return
        self._asking[address] = self._asking.get(address, 0) + 1
        task = asyncio.ensure_future(self._answer(address, reader, writer))
        self._gate_tasks.add(task)
        task.add_done_callback(self._gate_tasks.discard)

    async def _answer(
        self, address: Address, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        """One question, a line naming an owner; the answer ``open`` when the source address
        is admitted for that owner, else ``wait``. Nothing else is told."""
        try:
            line = await asyncio.wait_for(reader.readline(), _GATE_READ_SECONDS)
            registration = self._pods.get(address)
            owner = line.rstrip(b"\n").decode("utf-8", "replace")
            admitted = registration is not None and owner and registration.owner == owner
            writer.write(b"open\n" if admitted else b"wait\n")
            await writer.drain()
        except (TimeoutError, ConnectionError, ValueError):  # slow, gone, or a line too long
            pass
        finally:
            writer.close()
            if (left := self._asking.pop(address) - 1) > 0:
                self._asking[address] = left

    def _on_client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        registration = self._registration(writer)
        if registration is None:
            log.warning("egress proxy: a connection from %s, no sandbox of this replica", peer)
            reason = "egress denied by Ringfence: this address is no sandbox of this replica"
            writer.write(response(403, reason))
            writer.close()
            return
        if len(registration.tasks) >= MAX_IN_FLIGHT:
            writer.close()
            return
        served = serve_client(
            registration.session, self._resolver, reader, writer, self._interceptor, own=self._own
        )
        task = asyncio.ensure_future(served)
        registration.tasks.add(task)
        task.add_done_callback(registration.tasks.discard)
