"""What a network policy changes in the bwrap arguments (pure): the proxy variables, the
trust bundle when the proxy intercepts TLS; and never the namespace itself."""

from __future__ import annotations

from ringfence.backends.local.bwrap import Fds, bwrap_args
from ringfence.models import ExecutionRequest, NetworkPolicy, ResourceLimits
from ringfence.network.gateway import PROXY_URL

LIMITS = ResourceLimits(memory=1 << 28, pids=64, cpus=1.0, disk=1 << 26)
POLICY = NetworkPolicy.model_validate({"rules": [{"domain": "pypi.org"}]})


def env_of(argv: list[str]) -> dict[str, str]:
    return {argv[i + 1]: argv[i + 2] for i, word in enumerate(argv) if word == "--setenv"}


def test_no_policy_no_proxy_variables() -> None:
    for network in (None, NetworkPolicy()):
        argv = bwrap_args([], ExecutionRequest(command=["true"], network=network), LIMITS, Fds(3))
        assert not any("proxy" in name.lower() for name in env_of(argv))
        assert "--unshare-net" in argv


def test_a_policy_points_tools_at_the_proxy_and_keeps_the_namespace_empty() -> None:
    request = ExecutionRequest(command=["true"], network=POLICY, env={"NO_PROXY": "mine"})
    argv = bwrap_args([], request, LIMITS, Fds(3))
    env = env_of(argv)
    assert env["HTTPS_PROXY"] == env["http_proxy"] == PROXY_URL
    assert env["NO_PROXY"] == "mine", "the request's own variables win"
    assert "--unshare-net" in argv and "--share-net" not in argv
    assert "/etc/ssl/certs/ca-certificates.crt" not in argv
    assert "NODE_EXTRA_CA_CERTS" not in env


def test_interception_shows_the_bundle_with_the_proxys_ca() -> None:
    request = ExecutionRequest(command=["true"], network=POLICY)
    argv = bwrap_args([], request, LIMITS, Fds(3), trust_bundle="/run/ringfence/egress-ca-x.pem")
    at = argv.index("/run/ringfence/egress-ca-x.pem")
    assert argv[at - 1 : at + 2] == [
        "--ro-bind", "/run/ringfence/egress-ca-x.pem", "/etc/ssl/certs/ca-certificates.crt",
    ]  # fmt: skip
    assert argv.index("--remount-ro") > at, "bound before the root is made read-only"
    assert env_of(argv)["NODE_EXTRA_CA_CERTS"] == "/etc/ssl/certs/ca-certificates.crt"
