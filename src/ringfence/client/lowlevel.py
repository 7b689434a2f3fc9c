"""The seam beneath the SDK, for code that brings its own HTTP client (the MCP server does).

``AsyncSandbox`` and ``AsyncRingfence`` are built on these; a caller that already holds an
``httpx.AsyncClient`` (an in-process transport, its own base URL and key) drives sandboxes
through them without a second connection pool:

- ``Settings``: where the server is and how to sign in (arguments, else ``RINGFENCE_URL``
  and ``RINGFENCE_API_KEY``); ``DEFAULT_URL`` when neither says.
- ``Link``: the calls about one sandbox (REST, daemon RPCs, file transfers) over a given
  client; ``AsyncSandbox(info, link)`` wraps one.
- ``checked``: the JSON body of a successful answer, else the typed ``RingfenceError``.
- ``translate``: an ``httpx.HTTPError`` as ``ServerUnreachable`` (raise it ``from`` the
  original).
- ``list_params``: the query of a sandbox listing (``GET /v1/sandboxes``).

Users of the SDK need none of this: it is public so that no other package imports the SDK's
private modules.
"""

from ringfence.client._base import DEFAULT_URL, Settings, checked, translate
from ringfence.client._link import Link
from ringfence.client._sandbox import list_params

__all__ = ["DEFAULT_URL", "Link", "Settings", "checked", "list_params", "translate"]
