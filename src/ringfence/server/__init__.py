"""The HTTP server (``ringfence[server]``): the native REST API over the service layer."""

from ringfence.server.app import create_app

__all__ = ["create_app"]
