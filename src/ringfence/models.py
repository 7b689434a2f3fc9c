"""The data of the founding design: what to run, with which limits, and what came out.

These models cross every boundary (Python API, CLI ``--json``, later HTTP), so they are
validated, frozen and JSON-serialisable. Their ``Field(description=...)`` is their documentation.
"""

from __future__ import annotations

import ipaddress
import posixpath
import re
import uuid
from datetime import UTC, datetime
from enum import StrEnum
from typing import Annotated

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic.config import JsonDict
from pydantic_core import ErrorDetails, PydanticSerializationError

from ringfence._units import parse_size

__all__ = [
    "EgressAction",
    "EgressRule",
    "ExecutionRequest",
    "ExecutionResult",
    "Mount",
    "NetworkMode",
    "NetworkPolicy",
    "ResourceLimits",
    "Sandbox",
    "SandboxLimits",
    "SandboxSpec",
    "SandboxState",
    "Status",
    "advance",
    "problems",
    "said",
]

_ID = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$"
_ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]*$"
MAX_TIMEOUT_SECONDS = 7 * 24 * 3600

# Sandbox paths a mount may not cover: the sandbox's own plumbing.
_RESERVED_TARGETS = ("/", "/proc", "/dev", "/sys")


class Status(StrEnum):
    """The lifecycle of an execution. The strings are API: they never change."""

    PENDING = "pending"  # accepted, the sandbox is being set up
    RUNNING = "running"  # the command runs inside its sandbox
    SUCCEEDED = "succeeded"  # the command exited with status 0
    FAILED = "failed"  # non-zero exit, out of memory, or a system failure (see error)
    TIMED_OUT = "timed_out"  # the deadline passed; the whole process tree was killed
    CANCELLED = "cancelled"  # cancel() was called; the whole process tree was killed

    @property
    def is_terminal(self) -> bool:
        return self in _TERMINAL


_TERMINAL = frozenset({Status.SUCCEEDED, Status.FAILED, Status.TIMED_OUT, Status.CANCELLED})
_NEXT: dict[Status, frozenset[Status]] = {
    Status.PENDING: frozenset({Status.RUNNING, Status.FAILED, Status.CANCELLED}),
    Status.RUNNING: _TERMINAL,
}


def advance(current: Status, new: Status) -> Status:
    """Return ``new`` if an execution may move from ``current`` to it.

    Raises:
        ValueError: the move is illegal (for example out of a terminal state).
    """
    if new not in _NEXT.get(current, frozenset()):
        raise ValueError(f"an execution cannot go from {current.value} to {new.value}")
    return new


def problems(exc: Exception) -> str:
    """What is wrong, in one line naming each field: ``limits.pids: Input should be ...;
    env: ...`` (a ``ValidationError``), or the error's own words."""
    if not isinstance(exc, ValidationError):
        return " ".join(str(exc).split())
    found = []
    for error in exc.errors():
        where = ".".join(str(part) for part in error["loc"]) or "input"
        found.append(f"{where}: {said(error)}")
    return " ".join("; ".join(found).split())


def said(error: ErrorDetails) -> str:
    """One validation error's message in our own words: a validator's ``ValueError`` without
    the ``Value error,`` pydantic puts before it."""
    message = error["msg"]
    if error["type"] == "value_error":
        message = message.removeprefix("Value error, ")
    return message


def _checked_env(env: dict[str, str]) -> dict[str, str]:
    # Names and values are checked by ``Env``'s own constraints; this is their total.
    total = sum(len(name) + len(value) + 2 for name, value in env.items())
    if total > MAX_ENV_BYTES:
        raise ValueError(f"the environment is {total} characters, more than {MAX_ENV_BYTES} in all")
    return env


# What a process's environment can hold: the kernel caps argv and environ together (ARG_MAX,
# 2 MiB here) and each string (128 KiB); bubblewrap caps its own arguments (three per
# variable). Bounded well inside all three, so an accepted environment always starts.
MAX_ENV_VARS = 1024
MAX_ENV_VALUE = 32 << 10
MAX_ENV_BYTES = 256 << 10
Env = Annotated[
    dict[
        Annotated[str, Field(pattern=_ENV_NAME, max_length=256)],
        Annotated[str, Field(max_length=MAX_ENV_VALUE, pattern=r"^[^\x00]*$")],
    ],
    Field(max_length=MAX_ENV_VARS, json_schema_extra={"additionalProperties": False}),
]
# Each word (argument) within the kernel's 128 KiB per string; all of them together well
# inside ARG_MAX beside the environment.
MAX_ARGV_BYTES = 512 << 10
Word = Annotated[str, Field(max_length=(128 << 10) - 1, pattern=r"^[^\x00]*$")]
_PROGRAM_FIRST: JsonDict = {"prefixItems": [{"type": "string", "minLength": 1}]}
_ARGV_BOUNDS = f" Words of at most {(128 << 10) - 1} characters, {MAX_ARGV_BYTES} with args in all."
_ENV_BOUNDS = (
    f" At most {MAX_ENV_VARS} variables, names of at most 256 characters, values of at most "
    f"{MAX_ENV_VALUE}, {MAX_ENV_BYTES} characters in all."
)


def _size(value: object) -> object:
    if value is None or isinstance(value, (str, int)):
        return None if value is None else parse_size(value)
    return value


_Sized = BeforeValidator(_size)  # '256M' is accepted as well as bytes
_PIB = 1 << 50
# Measured floors: with pids 1 bubblewrap cannot fork the sandbox's init;
# below 0.01 cores the kernel refuses the CPU quota (1 ms per 100 ms period).
MIN_PIDS = 2
MIN_CPUS = 0.01
# An interactive sandbox runs its daemon (a process and a thread per call), a code kernel
# and the caller's commands: below 6 pids or 16 MiB the daemon or a first command failed.
# The floors are twice that.
MIN_SANDBOX_PIDS = 16
MIN_SANDBOX_MEMORY = 32 << 20


class ResourceLimits(BaseModel):
    """Limits on one sandbox. A field left out takes the default from ``Config``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    memory: Annotated[int, Field(ge=4 << 20, le=_PIB), _Sized] | None = Field(
        None,
        description="Memory limit in bytes (accepts '256M'). Exceeding it kills the command "
        "with the error 'out of memory'. Writable tmpfs contents count towards it.",
    )
    pids: int | None = Field(
        None, ge=MIN_PIDS, le=1_000_000, description="Most processes and threads alive at once."
    )
    cpus: float | None = Field(
        None,
        ge=MIN_CPUS,
        le=1024,
        description="CPU time as a number of cores (0.5 = half a core; at least 0.01).",
    )
    disk: Annotated[int, Field(ge=1 << 20, le=_PIB), _Sized] | None = Field(
        None,
        description="Size in bytes of each writable tmpfs (the workspace, /tmp, /dev/shm).",
    )

    def merged_over(self, defaults: ResourceLimits) -> ResourceLimits:
        """Return these limits with every unset field taken from ``defaults``."""
        given = self.model_dump(exclude_none=True)
        return defaults.model_copy(update=given)


class SandboxLimits(ResourceLimits):
    """The limits of an interactive sandbox: room for its daemon besides your commands."""

    memory: Annotated[int, Field(ge=MIN_SANDBOX_MEMORY, le=_PIB), _Sized] | None = Field(
        None,
        description="Memory limit in bytes (accepts '256M'; at least 32 MiB, the daemon's "
        "room). Exceeding it kills the command with the error 'out of memory'. Writable tmpfs "
        "contents count towards it.",
    )
    pids: int | None = Field(
        None,
        ge=MIN_SANDBOX_PIDS,
        le=1_000_000,
        description="Most processes and threads alive at once (at least 16: the daemon's "
        "count among them).",
    )


def _sandbox_limits(value: object) -> object:
    # Limits built as ResourceLimits (the SDK's, MCP's) are checked against the floors here.
    if isinstance(value, ResourceLimits) and not isinstance(value, SandboxLimits):
        return value.model_dump(exclude_none=True)
    return value


class Mount(BaseModel):
    """A host path made visible inside the sandbox. Read-only unless ``writable``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    source: str = Field(description="Absolute path on the host.")
    target: str = Field(description="Absolute path inside the sandbox.")
    writable: bool = Field(False, description="Mount read-write instead of read-only.")

    @field_validator("source", "target")
    @classmethod
    def _absolute_and_normal(cls, path: str) -> str:
        if "\0" in path or not path.startswith("/"):
            raise ValueError(f"must be an absolute path: {path!r}")
        if ".." in path.split("/"):
            raise ValueError(f"must not contain '..': {path!r}")
        return posixpath.normpath(path)

    @field_validator("target")
    @classmethod
    def _not_reserved(cls, target: str) -> str:
        for reserved in _RESERVED_TARGETS:
            if target == reserved or (reserved != "/" and target.startswith(reserved + "/")):
                raise ValueError(f"cannot mount over {reserved}: it belongs to the sandbox")
        return target

    @classmethod
    def parse(cls, spec: str) -> Mount:
        """Parse the CLI form ``HOST:SANDBOX[:ro|rw]``.

        Raises:
            ValueError: the form or a path is invalid.
        """
        parts = spec.split(":")
        mode = "ro"
        if len(parts) == 3:
            mode = parts.pop()
        if len(parts) != 2 or mode not in ("ro", "rw"):
            raise ValueError(f"mount must be HOST:SANDBOX[:ro|rw], got {spec!r}")
        return cls(source=parts[0], target=parts[1], writable=mode == "rw")


# -- network egress policy (docs/network.md) ---------------------------------------------------

_LABEL = re.compile(r"^(?!-)[a-z0-9_-]{1,63}(?<!-)$")
# The names _valid_domain accepts, for the JSON schema (checked by the validator, which also
# lowercases and strips a final dot).
_SCHEMA_LABEL = r"[A-Za-z0-9_]([A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?"
_OCTET = r"(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
_CIDR_SCHEMA = (  # IPv4 exactly (at most /8 broad); IPv6 by its alphabet (the validator decides)
    rf"^({_OCTET}(\.{_OCTET}){{3}}(/([89]|[12][0-9]|3[0-2]))?"
    r"|[0-9A-Fa-f:.]*:[0-9A-Fa-f:.]*(/[0-9]{1,3})?)$"
)
_DOMAIN_SCHEMA = (
    rf"^(\*\.{_SCHEMA_LABEL}(\.{_SCHEMA_LABEL})+|{_SCHEMA_LABEL}(\.{_SCHEMA_LABEL})*)\.?$"
)
_HEADER_NAME = re.compile(r"^[A-Za-z0-9!#$%&'*+.^_`|~-]{1,64}$")
# Headers the proxy owns: a rule may not set them.
_RESERVED_HEADERS = frozenset(
    {"host", "content-length", "transfer-encoding", "connection", "proxy-authorization",
     "proxy-connection", "keep-alive", "te", "trailer", "upgrade"}
)  # fmt: skip
_MIN_PREFIX = {4: 8, 6: 32}  # broader CIDRs are refused as too broad
_IPV4_MAPPED = ipaddress.IPv6Network("::ffff:0:0/96")  # IPv4 addresses written as IPv6
REDACTED = "<redacted>"


class EgressAction(StrEnum):
    """What a matching rule decides. The strings are API."""

    ALLOW = "allow"
    DENY = "deny"  # wins over every other rule that matches
    ASK = "ask"  # a human decides at the first connection; remembered for the sandbox's life


# What ``EgressRule._consistent`` checks, stated in its JSON schema: a domain or a cidr;
# headers on allow rules only.
_RULE_SCHEMA: JsonDict = {
    "anyOf": [
        {"required": [field], "properties": {field: {"type": "string"}}}
        for field in ("domain", "cidr")
    ],
    "if": {"required": ["action"], "properties": {"action": {"enum": ["deny", "ask"]}}},
    "then": {"properties": {"headers": {"maxProperties": 0}}},
}


class EgressRule(BaseModel):
    """One rule of an egress policy: which destinations it matches, and what it decides."""

    model_config = ConfigDict(extra="forbid", frozen=True, json_schema_extra=_RULE_SCHEMA)

    action: EgressAction = Field(EgressAction.ALLOW, description="allow, deny or ask.")
    domain: str | None = Field(
        None,
        max_length=253,
        description="A host name ('pypi.org', matching only itself) or '*.suffix' (matching "
        "every name below the suffix, not the suffix itself). '*' and '*.tld' are refused.",
        json_schema_extra={"pattern": _DOMAIN_SCHEMA},
    )
    cidr: str | None = Field(
        None,
        description="Addresses the destination must resolve into (with a domain), or IP "
        "literals the rule matches (alone). Needed to reach loopback or private addresses. "
        "At most /8 (IPv4) or /32 (IPv6) broad; an IPv4-mapped range (::ffff:a.b.c.d/n) "
        "is stored as the IPv4 range it names. Loopback and private ranges only where the "
        "operator allows them (RINGFENCE_NETWORK_INTERNAL_CIDRS).",
        json_schema_extra={"pattern": _CIDR_SCHEMA},
    )
    ports: list[Annotated[int, Field(ge=1, le=65535)]] = Field(
        default_factory=lambda: [80, 443],
        min_length=1,
        max_length=64,
        description="Destination ports the rule matches.",
    )
    headers: dict[str, str] = Field(
        default_factory=dict,
        description="allow rules only: headers the proxy adds to plain-HTTP requests it lets "
        "through (a credential the sandbox never sees). Never returned by the API.",
    )

    @field_validator("domain")
    @classmethod
    def _valid_domain(cls, domain: str | None) -> str | None:
        if domain is None:
            return None
        name = domain.strip().lower().removesuffix(".")
        wildcard = name.startswith("*.")
        labels = (name[2:] if wildcard else name).split(".")
        if name == "*" or (wildcard and len(labels) < 2):
            raise ValueError(f"domain {domain!r} is too broad (name at least 'example.com')")
        if len(name) > 253 or not all(_LABEL.match(label) for label in labels):
            raise ValueError(f"invalid domain {domain!r} (ASCII names; '*.' only as a prefix)")
        return name

    @field_validator("cidr")
    @classmethod
    def _valid_cidr(cls, cidr: str | None) -> str | None:
        if cidr is None:
            return None
        try:
            network = ipaddress.ip_network(cidr.strip(), strict=False)
        except ValueError:
            raise ValueError(f"invalid cidr {cidr!r}") from None
        if isinstance(network, ipaddress.IPv6Network) and network.subnet_of(_IPV4_MAPPED):
            # ::ffff:a.b.c.d is a.b.c.d on the wire: decided, checked and stored as IPv4.
            network = ipaddress.IPv4Network(
                (int(network.network_address) & 0xFFFFFFFF, network.prefixlen - 96)
            )
        if network.prefixlen < _MIN_PREFIX[network.version]:
            raise ValueError(f"cidr {cidr!r} is too broad")
        return str(network)

    @field_validator("ports")
    @classmethod
    def _valid_ports(cls, ports: list[int]) -> list[int]:
        return sorted(set(ports))

    @field_validator("headers")
    @classmethod
    def _valid_headers(cls, headers: dict[str, str]) -> dict[str, str]:
        if len(headers) > 16:
            raise ValueError("at most 16 headers per rule")
        for name, value in headers.items():
            if not _HEADER_NAME.match(name) or name.lower() in _RESERVED_HEADERS:
                raise ValueError(f"header {name!r} cannot be set by a rule")
            if any(c in value for c in "\r\n\0") or len(value) > 8192:
                raise ValueError(f"header {name}: no CR, LF or NUL, at most 8192 characters")
        return headers

    @model_validator(mode="after")
    def _consistent(self) -> EgressRule:
        if self.domain is None and self.cidr is None:
            raise ValueError("a rule needs a domain, a cidr, or both")
        if self.headers and self.action is not EgressAction.ALLOW:
            raise ValueError("only allow rules can add headers")
        return self


class NetworkMode(StrEnum):
    NONE = "none"  # loopback only: no proxy, no resolver (the default)
    RULES = "rules"  # the proxy and the resolver, deciding by ``rules``


class NetworkPolicy(BaseModel):
    """Where a sandbox may connect. Deny wins; an empty rule list allows nothing."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    mode: NetworkMode = Field(
        NetworkMode.NONE,
        description="none: loopback only. rules: through Ringfence's proxy, by the rules "
        "(given rules imply it).",
    )
    rules: list[EgressRule] = Field(
        default_factory=list, max_length=256, description="Checked all together; deny wins."
    )

    @model_validator(mode="before")
    @classmethod
    def _rules_imply_mode(cls, data: object) -> object:
        if isinstance(data, dict) and "mode" not in data and data.get("rules"):
            return {**data, "mode": NetworkMode.RULES}
        return data

    @model_validator(mode="after")
    def _no_rules_without_mode(self) -> NetworkPolicy:
        if self.mode is NetworkMode.NONE and self.rules:
            raise ValueError("mode none takes no rules")
        return self

    def redacted(self) -> NetworkPolicy:
        """This policy with every header value hidden (what the API shows and stores)."""
        rules = [
            rule.model_copy(update={"headers": dict.fromkeys(rule.headers, REDACTED)})
            for rule in self.rules
        ]
        return self.model_copy(update={"rules": rules})


class ExecutionRequest(BaseModel):
    """One command to run once in a fresh sandbox (the founding design's request)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str = Field(
        default_factory=lambda: uuid.uuid4().hex,
        pattern=_ID,
        description="Execution id, unique; generated when left out.",
    )
    session_id: str | None = Field(None, max_length=256, description="Agent session id.")
    task_id: str | None = Field(None, max_length=256, description="Task id within the session.")
    checkpoint_id: str | None = Field(
        None, max_length=256, description="Approval checkpoint this execution was approved at."
    )
    namespace: str | None = Field(
        None, max_length=63, description="Sandbox namespace (Kubernetes); default from Config."
    )
    target_namespace: str | None = Field(
        None, max_length=63, description="Namespace the remediation acts on (Kubernetes)."
    )
    image: str | None = Field(
        None,
        description="What the root filesystem is: 'host' (a read-only view of the host's system "
        "directories) or an absolute path to a directory root filesystem; default from Config.",
    )
    command: Annotated[list[Word], Field(json_schema_extra=_PROGRAM_FIRST)] = Field(
        min_length=1,
        max_length=1024,
        description="Program (not empty) and leading arguments." + _ARGV_BOUNDS,
    )
    args: list[Word] = Field(
        default_factory=list, max_length=3072, description="Further arguments."
    )
    env: Env = Field(
        default_factory=dict,
        description="The only environment variables set in the sandbox, besides PATH, HOME, "
        "USER, LOGNAME, LANG and TERM defaults that these override." + _ENV_BOUNDS,
    )
    cwd: str | None = Field(
        None,
        max_length=4095,
        pattern=r"^/[^\x00]*$",
        description="Working directory inside the sandbox (absolute); default the workspace.",
    )
    timeout: float | None = Field(
        None,
        gt=0,
        le=MAX_TIMEOUT_SECONDS,
        description="Wall-clock limit in seconds; default from Config.",
    )
    approved_by: str | None = Field(None, max_length=256, description="Who approved it.")
    remediation_action: str | None = Field(
        None, max_length=1024, description="Name of the remediation this carries out."
    )
    limits: ResourceLimits = Field(
        default_factory=ResourceLimits, description="Resource limits; unset fields default."
    )
    mounts: list[Mount] = Field(
        default_factory=list, max_length=64, description="Host paths granted to the sandbox."
    )
    network: NetworkPolicy | None = Field(
        None,
        description="Egress policy; default the tenant's default, else none.",
        # Left out when unset, so a request serializes (and hashes: proposals' digests) as
        # it did before policies existed.
        exclude_if=lambda network: network is None,
    )

    @field_validator("command")
    @classmethod
    def _a_program(cls, words: list[str]) -> list[str]:
        if words and words[0] == "":
            raise ValueError("the program (the command's first word) must not be empty")
        return words

    @model_validator(mode="after")
    def _argv_fits(self) -> ExecutionRequest:
        size = sum(len(word) + 1 for word in self.argv)
        if size > MAX_ARGV_BYTES:
            raise ValueError(f"command and args are {size} characters, more than {MAX_ARGV_BYTES}")
        return self

    @field_validator("env")
    @classmethod
    def _valid_env(cls, env: dict[str, str]) -> dict[str, str]:
        return _checked_env(env)

    @model_validator(mode="after")
    def _valid_unicode(self) -> ExecutionRequest:
        try:
            self.model_dump_json()
        except PydanticSerializationError:
            raise ValueError("text must be valid Unicode (no lone surrogates)") from None
        return self

    @model_validator(mode="after")
    def _distinct_targets(self) -> ExecutionRequest:
        targets = [m.target for m in self.mounts]
        if len(set(targets)) != len(targets):
            raise ValueError("two mounts share a sandbox path")
        return self

    @property
    def argv(self) -> list[str]:
        return [*self.command, *self.args]


class ExecutionResult(BaseModel):
    """What became of an execution; ``get_status`` returns it while running too."""

    model_config = ConfigDict(frozen=True)

    execution_id: str
    status: Status
    exit_code: int | None = Field(
        None,
        description="The command's exit status; None while running, or when it was "
        "killed for its deadline or a cancel, or never started.",
    )
    logs: str = Field("", description="stdout and stderr interleaved in order, bounded.")
    logs_truncated: bool = Field(
        False, description="True when the middle of the output was cut (a marker says where)."
    )
    job_name: str | None = Field(None, description="Name of the sandbox or Job that ran it.")
    backend: str | None = Field(None, description="The backend that ran it.")
    started_at: datetime | None = None
    finished_at: datetime | None = None
    error: str | None = Field(
        None, description="A system failure or cause of death in plain words, e.g. 'out of memory'."
    )


class SandboxState(StrEnum):
    """The lifecycle of an interactive sandbox. The strings are API: they never change."""

    RUNNING = "running"  # its daemon serves commands and files
    KILLED = "killed"  # kill() was called; nothing of it remains
    EXPIRED = "expired"  # its timeout passed; nothing of it remains
    FAILED = "failed"  # it died by itself, or with a server restart (see error)

    @property
    def is_terminal(self) -> bool:
        return self is not SandboxState.RUNNING


_TEMPLATE = r"^[a-z0-9][a-z0-9_.-]{0,62}$"
_MAX_METADATA = 64


class SandboxSpec(BaseModel):
    """What to create: an interactive sandbox, alive until its timeout or a kill."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    template: str = Field(
        "base",
        pattern=_TEMPLATE,
        description="Root filesystem of the sandbox. 'base': a read-only view of the host's "
        "system directories (python3, a shell and the usual tools).",
    )
    timeout: float | None = Field(
        None,
        ge=1,
        le=MAX_TIMEOUT_SECONDS,
        description="Seconds until the sandbox is killed, from now (at least 1: it must "
        "outlive its own start); default 300. set_timeout moves it.",
    )
    env: Env = Field(
        default_factory=dict,
        description="Environment variables of every command in the sandbox (over PATH, HOME, "
        "USER, LOGNAME, LANG and TERM defaults). Never returned by the API." + _ENV_BOUNDS,
    )
    metadata: Annotated[
        dict[
            Annotated[str, Field(min_length=1, max_length=128)],
            Annotated[str, Field(max_length=1024)],
        ],
        Field(max_length=_MAX_METADATA),
    ] = Field(
        default_factory=dict,
        description="Your own labels, returned with the sandbox and usable as list filters "
        "(at most 64; keys of 1-128 characters, values of at most 1024).",
    )
    limits: Annotated[SandboxLimits, BeforeValidator(_sandbox_limits)] = Field(
        default_factory=SandboxLimits,
        description="Limits on the whole sandbox (every command together); unset fields default.",
    )
    network: NetworkPolicy | None = Field(
        None,
        description="Egress policy; default the tenant's default, else none (loopback only). "
        "Changed later only through the API.",
    )

    @field_validator("env")
    @classmethod
    def _valid_env(cls, env: dict[str, str]) -> dict[str, str]:
        return _checked_env(env)

    @model_validator(mode="after")
    def _valid_unicode(self) -> SandboxSpec:
        try:
            self.model_dump_json()
        except PydanticSerializationError:
            raise ValueError("text must be valid Unicode (no lone surrogates)") from None
        return self


class Sandbox(BaseModel):
    """An interactive sandbox as the API shows it (its environment is never shown)."""

    model_config = ConfigDict(frozen=True)

    id: str = Field(description="Unique among every tenant's sandboxes.")
    template: str
    state: SandboxState
    metadata: dict[str, str] = Field(default_factory=dict)
    limits: ResourceLimits = Field(description="The limits in force (defaults filled in).")
    network: NetworkPolicy = Field(
        default_factory=NetworkPolicy,
        description="The egress policy in force (header values hidden).",
    )
    created_at: datetime
    expires_at: datetime | None = Field(
        description="When it will be killed unless set_timeout moves it; None once ended."
    )
    ended_at: datetime | None = None
    error: str | None = Field(
        None, description="Why it failed, in plain words (for the failed state)."
    )

    def ended(self, state: SandboxState, error: str | None = None) -> Sandbox:
        """This sandbox, ended now in ``state`` (a terminal one)."""
        assert state.is_terminal, state
        update = {"state": state, "error": error, "ended_at": datetime.now(UTC), "expires_at": None}
        return self.model_copy(update=update)
