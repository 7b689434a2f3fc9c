"""The Python SDK.

- ``AsyncSandbox`` (source of truth) and its blocking twin ``Sandbox``: interactive sandboxes
  with ``commands``, ``files``, terminals (``pty``) and code contexts (``run_code``), shaped
  like E2B's SDK.
  ``Sandbox`` runs the async methods on one loop thread (``_sync_sandbox``).
- ``AsyncRingfence`` (source of truth) and its blocking twin ``Ringfence``: one-shot
  executions, and proposals (remediations that run once a human approves them).
  ``_sync.py`` is generated from ``_async.py`` by ``scripts/unasync.py``.
- ``sbx.browser`` (``AsyncBrowser``, ``Browser``): the sandbox's Chromium, a session
  across calls; ``rf.browser.scrape``: a one-shot scrape in a pooled browser sandbox;
  ``decode_png`` reads a screenshot (docs/browser.md).
- ``lowlevel``: the seam beneath them, for code with its own HTTP client (the MCP server).

The main names are also ``ringfence``'s own (``from ringfence import Sandbox``). Importing
the SDK loads neither the server, the store nor any backend.
"""

from ringfence.client._async import AsyncProposals, AsyncRingfence
from ringfence.client._browser import AsyncBrowser, CdpEndpoint, decode_png
from ringfence.client._code import (
    Context,
    ContextNotFound,
    Execution,
    ExecutionError,
    Logs,
    OutputMessage,
    Result,
)
from ringfence.client._commands import AsyncCommandHandle, AsyncCommands
from ringfence.client._errors import (
    CommandExitError,
    CommandTimeout,
    FileNotFound,
    ProcessNotFound,
    ResourceExhausted,
)
from ringfence.client._files import AsyncFiles, AsyncWatchHandle, WriteInfo
from ringfence.client._project import AsyncProject
from ringfence.client._proposals import ProposalNotFound, WaitTimeout
from ringfence.client._pty import AsyncPty, AsyncPtyHandle
from ringfence.client._sandbox import AsyncSandbox, SandboxInfo
from ringfence.client._sync import Proposals, Ringfence
from ringfence.client._sync_sandbox import (
    Browser,
    CommandHandle,
    Commands,
    Files,
    Project,
    Pty,
    PtyHandle,
    Sandbox,
    WatchHandle,
)
from ringfence.client._types import (
    CommandResult,
    EntryInfo,
    EventType,
    FilesystemEvent,
    FileType,
    OutputChunk,
    ProcessInfo,
)
from ringfence.errors import SandboxElsewhere, SandboxNotFound, SandboxNotRunning
from ringfence.models import Proposal, ProposalState, Risk

__all__ = [
    "AsyncBrowser",
    "AsyncCommandHandle",
    "AsyncCommands",
    "AsyncFiles",
    "AsyncProject",
    "AsyncProposals",
    "AsyncPty",
    "AsyncPtyHandle",
    "AsyncRingfence",
    "AsyncSandbox",
    "AsyncWatchHandle",
    "Browser",
    "CdpEndpoint",
    "CommandExitError",
    "CommandHandle",
    "CommandResult",
    "CommandTimeout",
    "Commands",
    "Context",
    "ContextNotFound",
    "EntryInfo",
    "EventType",
    "Execution",
    "ExecutionError",
    "FileNotFound",
    "FileType",
    "Files",
    "FilesystemEvent",
    "Logs",
    "OutputChunk",
    "OutputMessage",
    "ProcessInfo",
    "ProcessNotFound",
    "Project",
    "Proposal",
    "ProposalNotFound",
    "ProposalState",
    "Proposals",
    "Pty",
    "PtyHandle",
    "ResourceExhausted",
    "Result",
    "Ringfence",
    "Risk",
    "Sandbox",
    "SandboxElsewhere",
    "SandboxInfo",
    "SandboxNotFound",
    "SandboxNotRunning",
    "WaitTimeout",
    "WatchHandle",
    "WriteInfo",
    "decode_png",
]
