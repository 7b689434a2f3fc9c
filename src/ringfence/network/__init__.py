"""Network egress for sandboxes: policy decisions, the host-side proxy and resolver, and
their attachment to a sandbox's network namespace (docs/network.md)."""

from ringfence.network.gateway import PROXY_URL, Attachment, EgressGateway, proxy_env
from ringfence.network.resolver import Resolver
from ringfence.network.session import Asker, EgressSession, Requester, requesting

__all__ = [
    "PROXY_URL",
    "Asker",
    "Attachment",
    "EgressGateway",
    "EgressSession",
    "Requester",
    "Resolver",
    "proxy_env",
    "requesting",
]
