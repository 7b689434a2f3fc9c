"""How the proxy and the sandbox resolver learn a name's addresses: a fixed table first
(operators' and tests' own names), then, if enabled, the host's resolver."""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Mapping, Sequence

from ringfence.network.policy import Address, normalize_host

__all__ = ["Resolver"]

_TIMEOUT_SECONDS = 5.0


class Resolver:
    def __init__(
        self, hosts: Mapping[str, Sequence[str]] | None = None, *, system: bool = True
    ) -> None:
        """``hosts``: names answered from this table, never asked upstream. ``system``:
        other names go to the host's resolver (getaddrinfo); False answers nothing else."""
        self._hosts = {
            normalize_host(name): tuple(ipaddress.ip_address(a) for a in addresses)
            for name, addresses in (hosts or {}).items()
        }
        self._system = system

    async def resolve(self, host: str) -> list[Address]:
        """The addresses of ``host`` (itself for an IP literal); empty when unknown."""
        host = normalize_host(host)
        try:
            return [ipaddress.ip_address(host)]
        except ValueError:
            pass
        if host in self._hosts:
            return list(self._hosts[host])
        if not self._system:
            return []
        loop = asyncio.get_running_loop()
        try:
            infos = await asyncio.wait_for(
                loop.getaddrinfo(host, None, type=socket.SOCK_STREAM), _TIMEOUT_SECONDS
            )
        except (OSError, TimeoutError, UnicodeError):
            return []
        found: list[Address] = []
        for family, _, _, _, sockaddr in infos:
            if family in (socket.AF_INET, socket.AF_INET6):
                found.append(ipaddress.ip_address(str(sockaddr[0]).partition("%")[0]))
        return list(dict.fromkeys(found))
