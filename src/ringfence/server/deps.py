"""How the app's routes and middleware reach what they serve with: one typed accessor per
dependency, over the ``Services`` that ``create_app`` was given (``ringfence.compose``).

Routes call these (``deps.executions(request)``) or declare them as FastAPI dependencies
(``Depends(deps.keys)``); nothing else in ``server`` reads ``app.state``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from starlette.applications import Starlette
from starlette.requests import Request

from ringfence.config import Config
from ringfence.service.approvals import ApprovalService
from ringfence.service.audit import AuditLog
from ringfence.service.browser import BrowserService
from ringfence.service.egress_asks import EgressAsks
from ringfence.service.executions import ExecutionService
from ringfence.service.keys import Keys
from ringfence.service.sandboxes import SandboxService
from ringfence.service.volumes import VolumeService

if TYPE_CHECKING:
    from ringfence.compose import Services
    from ringfence.server.console.sessions import SessionTable
    from ringfence.server.e2b.context import E2bContext

__all__ = [
    "approvals",
    "asks",
    "attach",
    "attach_e2b",
    "audit",
    "browser",
    "config",
    "console_sessions",
    "e2b",
    "e2b_if_any",
    "executions",
    "keys",
    "sandboxes",
    "settings_if_any",
    "volumes",
]


def attach(app: Starlette, services: Services) -> None:
    """Serve ``app``'s requests with ``services`` (``create_app`` calls it once)."""
    from ringfence.server.console.sessions import SessionTable

    app.state.services = services
    app.state.console_sessions = SessionTable()


def attach_e2b(app: Starlette, context: E2bContext) -> None:
    """Serve one of the E2B layer's inner apps with ``context``."""
    app.state.e2b = context


def _services(request: Request) -> Services:
    """Private: the accessors hand out one service each, so no route reaches the store."""
    found: Services = request.app.state.services
    return found


def keys(request: Request) -> Keys:
    return _services(request).keys


def executions(request: Request) -> ExecutionService:
    return _services(request).executions


def sandboxes(request: Request) -> SandboxService:
    return _services(request).sandboxes


def browser(request: Request) -> BrowserService:
    return _services(request).browser


def volumes(request: Request) -> VolumeService:
    return _services(request).volumes


def approvals(request: Request) -> ApprovalService:
    return _services(request).approvals


def audit(request: Request) -> AuditLog:
    return _services(request).audit


def asks(request: Request) -> EgressAsks:
    return _services(request).asks


def config(request: Request) -> Config:
    return _services(request).config


def settings_if_any(request: Request) -> Config | None:
    """The app's settings; None on an app served without ``Services`` (error handlers of
    an app other than ``create_app``'s answer with the defaults' host paths)."""
    found: Services | None = getattr(request.app.state, "services", None)
    return found.config if found is not None else None


def console_sessions(request: Request) -> SessionTable:
    """The console's signed-in sessions (this process's: they die with it)."""
    table: SessionTable = request.app.state.console_sessions
    return table


def e2b_if_any(request: Request) -> E2bContext | None:
    """``e2b``, or None outside the E2B layer's inner apps (their error handlers' guard)."""
    context: E2bContext | None = getattr(request.app.state, "e2b", None)
    return context


def e2b(request: Request) -> E2bContext:
    """What an E2B route works with (the inner app it runs in was given it)."""
    context: E2bContext = request.app.state.e2b
    return context
