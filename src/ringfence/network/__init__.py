"""Network egress for sandboxes: the host-side proxy and resolver, and their attachment to a
sandbox's network namespace (docs/network.md). They enforce the decisions of
``ringfence.policy.egress`` and ``ringfence.policy.network``, which are pure."""

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
