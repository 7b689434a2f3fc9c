"""Egress through Ringfence's proxy from real sandboxes: allow, deny, wildcards, TLS with
the SNI check, header injection, and the audit record of every attempt. The origins are
servers on this machine under test names that only Ringfence's resolver knows."""

from __future__ import annotations

from typing import Any

from ringfence.backends.local import LocalExecutor
from ringfence.models import ExecutionRequest, ExecutionResult, NetworkPolicy, Status
from ringfence.network import Requester, requesting
from ringfence.service.audit import AuditLog
from tests.integration._attack_helpers import python, reported
from tests.network.conftest import Origin, audited

LOOPBACK = "127.0.0.1/32"


def rules(*items: dict[str, Any]) -> NetworkPolicy:
    return NetworkPolicy.model_validate({"mode": "rules", "rules": list(items)})


async def run(
    executor: object,
    policy: NetworkPolicy | None,
    command: list[str],
    audit: AuditLog | None = None,
    env: dict[str, str] | None = None,
) -> ExecutionResult:
    assert isinstance(executor, LocalExecutor)
    request = ExecutionRequest(command=command, network=policy, env=env or {}, timeout=60)
    with requesting(Requester("acme", "execution:test", "key-1", audit)):
        return await executor.execute(request)


def curl(url: str, *extra: str) -> list[str]:
    # -f: HTTP errors fail; -S: say why; -m: only a guard, never what a test waits for.
    return ["curl", "-fsS", "-m", "20", *extra, url]


async def test_an_allowed_name_is_reached_through_the_proxy(
    egress_executor: object, http_origin: Origin, audit: AuditLog
) -> None:
    policy = rules({"domain": "allowed.test", "cidr": LOOPBACK, "ports": [http_origin.port]})
    result = await run(
        egress_executor, policy, curl(f"http://allowed.test:{http_origin.port}/x"), audit
    )
    assert result.status is Status.SUCCEEDED, result.logs
    assert result.logs == "hello from origin\n"
    assert http_origin.heads[0].startswith(b"GET /x HTTP/1.1\r\n")
    (record,) = await audited(audit, "network.connect")
    assert (record.tenant, record.target, record.outcome) == ("acme", "execution:test", "allowed")
    details = record.details
    assert (details["host"], details["port"], details["method"]) == (
        "allowed.test", http_origin.port, "GET",
    )  # fmt: skip
    assert details["bytes_received"] > len("hello from origin\n")
    assert details["bytes_sent"] > 0 and details["duration_ms"] >= 0


async def test_a_denied_name_fails_at_once_with_a_clear_error(
    egress_executor: object, http_origin: Origin, audit: AuditLog
) -> None:
    policy = rules({"domain": "allowed.test", "cidr": LOOPBACK, "ports": [http_origin.port]})
    port = http_origin.port
    command = [
        "sh", "-c",
        f"curl -sS -o /dev/null -w '%{{http_code}}' -m 20 -x http://127.0.0.1:3128 "
        f"http://denied.test:{port}/; echo \" $?\";"
        f"curl -sS -m 20 https://denied.test:{port}/ 2>&1; echo \" $?\"",
    ]  # fmt: skip
    result = await run(egress_executor, policy, command, audit)
    lines = result.logs.splitlines()
    assert lines[0] == "403 0", result.logs  # an answer (403), not a timeout (curl's 28)
    assert lines[1:] == ["curl: (56) CONNECT tunnel failed, response 403", " 56"], result.logs
    assert http_origin.connections == 0
    records = await audited(audit, "network.connect")
    assert [r.outcome for r in records] == ["denied", "denied"]
    assert all(r.details["host"] == "denied.test" for r in records)
    assert records[0].details["reason"].endswith(f"no rule allows denied.test:{http_origin.port}")


async def test_the_refusal_reason_reaches_python_clients(
    egress_executor: object, http_origin: Origin
) -> None:
    policy = rules({"domain": "allowed.test", "cidr": LOOPBACK, "ports": [http_origin.port]})
    script = f"""
    import urllib.request
    try:
        urllib.request.urlopen("https://evil.test:{http_origin.port}/", timeout=20)
        report("reached")
    except OSError as e:
        report(str(e))
    """
    out = reported(await run(egress_executor, policy, python(script)))
    assert "403" in out and "egress denied by Ringfence" in out, out


async def test_wildcards_match_below_the_suffix_only(
    egress_executor: object, http_origin: Origin, audit: AuditLog
) -> None:
    policy = rules({"domain": "*.wild.test", "cidr": LOOPBACK, "ports": [http_origin.port]})
    port = http_origin.port
    script = f"""
    import urllib.request
    out = {{}}
    for name in ("a.wild.test", "b.a.wild.test", "wild.test", "other.test"):
        try:
            out[name] = urllib.request.urlopen(f"http://{{name}}:{port}/", timeout=20).status
        except OSError as e:
            out[name] = getattr(e, "code", str(e))
    report(out)
    """
    out = reported(await run(egress_executor, policy, python(script), audit))
    assert out == {"a.wild.test": 200, "b.a.wild.test": 200, "wild.test": 403, "other.test": 403}
    outcomes = {r.details["host"]: r.outcome for r in await audited(audit, "network.connect")}
    assert outcomes == {"a.wild.test": "allowed", "b.a.wild.test": "allowed",
                        "wild.test": "denied", "other.test": "denied"}  # fmt: skip


async def test_deny_wins_over_a_wildcard_allow(
    egress_executor: object, http_origin: Origin
) -> None:
    port = http_origin.port
    policy = rules(
        {"domain": "*.wild.test", "cidr": LOOPBACK, "ports": [port]},
        {"domain": "b.a.wild.test", "action": "deny", "ports": [port]},
    )
    script = f"""
    import urllib.request
    out = {{}}
    for name in ("a.wild.test", "b.a.wild.test"):
        try:
            out[name] = urllib.request.urlopen(f"http://{{name}}:{port}/", timeout=20).status
        except OSError as e:
            out[name] = getattr(e, "code", str(e))
    report(out)
    """
    assert reported(await run(egress_executor, policy, python(script))) == {
        "a.wild.test": 200, "b.a.wild.test": 403,
    }  # fmt: skip


async def test_an_allowed_name_needs_a_cidr_to_reach_loopback(
    egress_executor: object, http_origin: Origin
) -> None:
    policy = rules({"domain": "allowed.test", "ports": [http_origin.port]})  # no cidr
    result = await run(egress_executor, policy, curl(f"http://allowed.test:{http_origin.port}/"))
    assert "403" in result.logs and result.status is Status.FAILED
    assert http_origin.connections == 0


async def test_https_through_connect_with_a_matching_server_name(
    egress_executor: object, tls_origin: Origin, audit: AuditLog
) -> None:
    policy = rules({"domain": "allowed.test", "cidr": LOOPBACK, "ports": [tls_origin.port]})
    result = await run(
        egress_executor, policy, curl(f"https://allowed.test:{tls_origin.port}/", "-k"), audit
    )
    assert result.status is Status.SUCCEEDED, result.logs
    assert result.logs == "hello over tls\n"
    (record,) = await audited(audit, "network.connect")
    assert record.outcome == "allowed"
    assert (record.details["method"], record.details["sni"]) == ("CONNECT", "allowed.test")


async def test_an_empty_rule_list_allows_nothing(
    egress_executor: object, http_origin: Origin, audit: AuditLog
) -> None:
    result = await run(
        egress_executor,
        NetworkPolicy(mode="rules"),
        curl(f"http://allowed.test:{http_origin.port}/"),
        audit,
    )
    assert result.status is Status.FAILED and "403" in result.logs
    assert [r.outcome for r in await audited(audit, "network.connect")] == ["denied"]


async def test_headers_are_added_to_plain_http_and_never_enter_the_sandbox(
    egress_executor: object, http_origin: Origin
) -> None:
    secret = "rf-test-secret-" + "7f3a9c" * 4
    port = http_origin.port
    policy = rules(
        {"domain": "secret.test", "cidr": LOOPBACK, "ports": [port],
         "headers": {"Authorization": f"Bearer {secret}", "X-Api-Key": secret}},
    )  # fmt: skip
    script = f"""
    import os, urllib.request
    out = {{}}
    out["body"] = urllib.request.urlopen(
        urllib.request.Request(f"http://secret.test:{port}/api",
                               headers={{"Authorization": "Bearer mine"}}), timeout=20
    ).read().decode()
    needle = ({secret[:12]!r} + {secret[12:]!r}).encode()  # never whole in this script
    found = []
    places = ["/proc/self/environ", "/proc/1/environ", "/proc/self/cmdline", "/proc/1/cmdline"]
    for root in ("/home", "/tmp", "/etc", "/run", "/dev/shm", "/var"):
        for directory, _, files in os.walk(root):
            places += [os.path.join(directory, f) for f in files]
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            places += [f"/proc/{{pid}}/environ", f"/proc/{{pid}}/cmdline"]
    for place in places:
        try:
            with open(place, "rb") as f:
                if needle in f.read():
                    found.append(place)
        except OSError:
            pass
    out["found"] = found
    out["env"] = [k for k, v in os.environ.items() if needle.decode() in v]
    out["read"] = len(places)
    report(out)
    """
    result = await run(egress_executor, policy, python(script))
    out = reported(result)
    assert out["body"] == "hello from origin\n"
    assert out["found"] == [] and out["env"] == []
    assert out["read"] > 20, "control: the search read files"
    head = http_origin.heads[0].decode()
    assert f"Authorization: Bearer {secret}\r\n" in head
    assert f"X-Api-Key: {secret}\r\n" in head
    assert "Bearer mine" not in head, "the rule's header replaces the sandbox's own"
    assert secret not in result.logs


async def test_headers_are_not_added_inside_tls_tunnels(
    egress_executor: object, tls_origin: Origin
) -> None:
    # Without interception (not built), the proxy never sees inside TLS: the header cannot be
    # added, and the tunnel still works.
    policy = rules(
        {"domain": "allowed.test", "cidr": LOOPBACK, "ports": [tls_origin.port],
         "headers": {"X-Api-Key": "never-sent"}},
    )  # fmt: skip
    result = await run(
        egress_executor, policy, curl(f"https://allowed.test:{tls_origin.port}/", "-k")
    )
    assert result.status is Status.SUCCEEDED, result.logs


async def test_each_dns_question_is_audited_once(
    egress_executor: object, http_origin: Origin, audit: AuditLog
) -> None:
    policy = rules({"domain": "allowed.test", "cidr": LOOPBACK, "ports": [http_origin.port]})
    script = """
    import socket
    for _ in range(20):
        for name in ("allowed.test", "denied.test"):
            try:
                socket.getaddrinfo(name, 80, socket.AF_INET)
            except socket.gaierror:
                pass
    report("done")
    """
    assert reported(await run(egress_executor, policy, python(script), audit)) == "done"
    questions = [(r.details["name"], r.details["type"], r.outcome)
                 for r in await audited(audit, "network.dns")]  # fmt: skip
    assert sorted(questions) == [("allowed.test", 1, "allowed"), ("denied.test", 1, "denied")]


async def test_an_allowed_destination_that_does_not_answer_is_a_502(
    egress_executor: object, audit: AuditLog
) -> None:
    import socket

    with socket.socket() as probe:  # a port nothing listens on: bound, never listening
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
        policy = rules({"domain": "allowed.test", "cidr": LOOPBACK, "ports": [port]})
        command = ["sh", "-c", f"curl -sS -o /dev/null -w '%{{http_code}}' -m 20 "
                   f"http://allowed.test:{port}/"]  # fmt: skip
        result = await run(egress_executor, policy, command, audit)
    assert result.logs == "502"
    (record,) = await audited(audit, "network.connect")
    assert record.outcome == "failed" and "did not answer" in record.details["reason"]


async def test_a_server_that_speaks_first_works_through_a_tunnel(
    egress_executor: object,
) -> None:
    import asyncio

    async def banner(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"SSH-2.0-RingfenceTest\r\n")
        line = await reader.readline()
        writer.write(b"echo " + line)
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(banner, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    policy = rules({"domain": "allowed.test", "cidr": LOOPBACK, "ports": [port]})
    script = f"""
    import socket
    s = socket.create_connection(("127.0.0.1", 3128), timeout=20)
    s.sendall(b"CONNECT allowed.test:{port} HTTP/1.1\\r\\n\\r\\n")
    f = s.makefile("rb")
    status = f.readline(); f.readline()
    first = f.readline()
    s.sendall(b"hi\\n")
    report([status.decode().strip(), first.decode().strip(), f.readline().decode().strip()])
    """
    async with server:
        out = reported(await run(egress_executor, policy, python(script)))
    assert out == ["HTTP/1.1 200 Connection established", "SSH-2.0-RingfenceTest", "echo hi"]


async def test_with_interception_https_requests_get_the_rules_headers(
    intercepting_executor: object, tls_origin: Origin, audit: AuditLog
) -> None:
    secret = "rf-tls-secret-" + "5eed" * 6
    port = tls_origin.port
    policy = rules(
        {"domain": "secret.test", "cidr": LOOPBACK, "ports": [port],
         "headers": {"X-Api-Key": secret}},
        {"domain": "allowed.test", "cidr": LOOPBACK, "ports": [port]},
    )  # fmt: skip
    script = f"""
    import os, subprocess
    out = {{}}
    # No -k: the sandbox trusts Ringfence's CA through the system bundle.
    out["intercepted"] = subprocess.run(
        ["curl", "-sS", "-f", "-m", "20", "https://secret.test:{port}/api?x=1"],
        capture_output=True, text=True).stdout
    # A rule without headers: passed through untouched, the origin's own certificate.
    out["passthrough_verified"] = subprocess.run(
        ["curl", "-sS", "-m", "20", "https://allowed.test:{port}/"],
        capture_output=True, text=True).returncode
    out["passthrough"] = subprocess.run(
        ["curl", "-sS", "-k", "-m", "20", "https://allowed.test:{port}/"],
        capture_output=True, text=True).stdout
    needle = ({secret[:12]!r} + {secret[12:]!r}).encode()
    places = ["/proc/self/environ", "/proc/1/environ", "/etc/ssl/certs/ca-certificates.crt"]
    for directory, _, files in os.walk("/tmp"):
        places += [os.path.join(directory, f) for f in files]
    out["found"] = [p for p in places if needle in open(p, "rb").read()]
    bundle = open("/etc/ssl/certs/ca-certificates.crt", "rb").read()
    out["ca_key_visible"] = b"PRIVATE KEY" in bundle
    report(out)
    """
    out = reported(await run(intercepting_executor, policy, python(script), audit))
    assert out["intercepted"] == "hello over tls\n"
    assert out["passthrough_verified"] == 60, "the origin's self-signed cert: not intercepted"
    assert out["passthrough"] == "hello over tls\n"
    assert out["found"] == [] and out["ca_key_visible"] is False
    intercepted = tls_origin.heads[0].decode()
    assert intercepted.startswith("GET /api?x=1 HTTP/1.1\r\n")
    assert f"X-Api-Key: {secret}\r\n" in intercepted and "Host: secret.test:" in intercepted
    assert all(secret not in head.decode() for head in tls_origin.heads[1:])
    records = await audited(audit, "network.connect")
    methods = sorted((r.details["host"], r.details["method"], r.outcome) for r in records)
    assert methods == [
        ("allowed.test", "CONNECT", "allowed"),
        ("allowed.test", "CONNECT", "allowed"),
        ("secret.test", "CONNECT+GET", "allowed"),
    ]


async def test_concurrent_starts_all_get_their_proxy(
    egress_executor: object, http_origin: Origin
) -> None:
    # bubblewrap brings the loopback up from inside after it reports the pid, so the proxy
    # binds before the address exists (IP_FREEBIND): under load, that race is common.
    import asyncio

    policy = rules({"domain": "allowed.test", "cidr": LOOPBACK, "ports": [http_origin.port]})
    url = f"http://allowed.test:{http_origin.port}/"
    results = await asyncio.gather(*(run(egress_executor, policy, curl(url)) for _ in range(16)))
    assert [(r.status, r.logs) for r in results] == [
        (Status.SUCCEEDED, "hello from origin\n")
    ] * 16, [r.error or r.logs for r in results if r.status is not Status.SUCCEEDED]
