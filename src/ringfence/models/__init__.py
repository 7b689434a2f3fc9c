"""The domain: what to run, with which limits, what came out, and who may ask.

These types cross every boundary (Python API, CLI ``--json``, HTTP, MCP, the store), so they
are validated, frozen and JSON-serialisable; their ``Field(description=...)`` is their
documentation. They sit at the bottom of the layers: this package imports nothing of
Ringfence's but ``ringfence._units``, and every other layer may import it.

One module per aggregate: ``executions`` (a request, its lifecycle, its result and record),
``sandboxes`` (an interactive sandbox), ``snapshots`` (its checkpoints, snapshots, pause and
fork), ``limits``, ``mounts`` and ``network`` (what a sandbox may use and reach), ``metrics``
(what it uses), ``proposals`` (a remediation and the decisions on it), ``keys`` (API keys
and roles) and ``audit`` (which audit records a reader asks for). ``problems`` words a
validation error for a client. Import from here: ``from ringfence.models import X``.
"""

from ringfence.models._fields import MAX_TIMEOUT_SECONDS, Env
from ringfence.models.audit import AuditQuery
from ringfence.models.executions import (
    ExecutionRecord,
    ExecutionRequest,
    ExecutionResult,
    Status,
    advance,
)
from ringfence.models.keys import ApiKey, Role
from ringfence.models.limits import (
    MIN_CPUS,
    MIN_PIDS,
    MIN_SANDBOX_MEMORY,
    MIN_SANDBOX_PIDS,
    ResourceLimits,
    SandboxLimits,
)
from ringfence.models.metrics import SandboxMetrics
from ringfence.models.mounts import Mount
from ringfence.models.network import (
    MAX_RULES,
    REDACTED,
    EgressAction,
    EgressRule,
    NetworkMode,
    NetworkPolicy,
)
from ringfence.models.problems import problems, said
from ringfence.models.projects import (
    ProjectChange,
    ProjectDiff,
    ProjectSyncReport,
    ProjectSyncRequest,
    SyncedChange,
    SyncRefusal,
    project_relative,
)
from ringfence.models.proposals import (
    Decision,
    Proposal,
    ProposalSpec,
    ProposalState,
    Risk,
    RiskSource,
    is_proposal_id,
    new_proposal_id,
    request_digest,
)
from ringfence.models.sandboxes import OnTimeout, Sandbox, SandboxSpec, SandboxState
from ringfence.models.snapshots import (
    CHECKPOINT_ID,
    MAX_FORK_CHILDREN,
    SNAPSHOT_ID,
    CheckpointInfo,
    Forked,
    Paused,
    Snapshot,
)
from ringfence.models.volumes import VOLUME_ID, Volume, VolumeEntry, VolumeSpec
from ringfence.models.workstation import ProjectMount, VolumeMount

__all__ = [
    "CHECKPOINT_ID",
    "MAX_FORK_CHILDREN",
    "MAX_RULES",
    "MAX_TIMEOUT_SECONDS",
    "MIN_CPUS",
    "MIN_PIDS",
    "MIN_SANDBOX_MEMORY",
    "MIN_SANDBOX_PIDS",
    "REDACTED",
    "SNAPSHOT_ID",
    "VOLUME_ID",
    "ApiKey",
    "AuditQuery",
    "CheckpointInfo",
    "Decision",
    "EgressAction",
    "EgressRule",
    "Env",
    "ExecutionRecord",
    "ExecutionRequest",
    "ExecutionResult",
    "Forked",
    "Mount",
    "NetworkMode",
    "NetworkPolicy",
    "OnTimeout",
    "Paused",
    "ProjectChange",
    "ProjectDiff",
    "ProjectMount",
    "ProjectSyncReport",
    "ProjectSyncRequest",
    "Proposal",
    "ProposalSpec",
    "ProposalState",
    "ResourceLimits",
    "Risk",
    "RiskSource",
    "Role",
    "Sandbox",
    "SandboxLimits",
    "SandboxMetrics",
    "SandboxSpec",
    "SandboxState",
    "Snapshot",
    "Status",
    "SyncRefusal",
    "SyncedChange",
    "Volume",
    "VolumeEntry",
    "VolumeMount",
    "VolumeSpec",
    "advance",
    "is_proposal_id",
    "new_proposal_id",
    "problems",
    "project_relative",
    "request_digest",
    "said",
]
