"""The approval console: server-rendered pages under ``/console`` where approvers sign in
with their key, review pending proposals, approve or reject them, and read the history and
the audit log. No JavaScript; see docs/console.md for the security model."""

from ringfence.server.console.routes import router

__all__ = ["router"]
