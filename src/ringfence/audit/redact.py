"""What the server keeps of text that may carry secrets, in its audit records and its log.

A URL keeps its scheme, host, port and path; its userinfo (``user:password@``) is removed,
its query keeps each parameter's name with the value replaced by ``REDACTED`` (a name says
what was asked, as a header's does; a value is often a key or a token), and its fragment
is dropped (``#access_token=…``). A path that embeds a secret (``/reset/<token>``) is kept:
it is what names the page.

Text for the log (``loggable``) also has its URLs redacted so, its control characters
escaped (no forged lines, no terminal escapes: ``\\n`` becomes the two characters ``\\n``),
and is clipped."""

from __future__ import annotations

import re
from urllib.parse import SplitResult, urlsplit, urlunsplit

__all__ = ["REDACTED", "loggable", "redacted_url"]

REDACTED = "REDACTED"
_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s\"'<>`]+")
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def redacted_url(url: str) -> str:
    """``url`` without its userinfo, its query's values and its fragment (the module's
    contract); what does not parse as a URL becomes its scheme alone."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = parts.port
    except ValueError:
        return url.split(":", 1)[0] + "://" + REDACTED if "://" in url else REDACTED
    netloc = f"[{host}]" if ":" in host else host
    if port is not None:
        netloc += f":{port}"
    query = "&".join(
        f"{field.split('=', 1)[0]}={REDACTED}" if "=" in field else field
        for field in parts.query.split("&")
        if field
    )
    return urlunsplit(SplitResult(parts.scheme, netloc, parts.path, query, ""))


def loggable(text: str, limit: int = 500) -> str:
    """``text`` fit for one log line: URLs redacted, control characters escaped, clipped
    at ``limit`` characters."""
    text = _URL.sub(lambda match: redacted_url(match[0]), text)
    text = _CONTROL.sub(lambda match: match[0].encode("unicode_escape").decode("ascii"), text)
    return text if len(text) <= limit else text[:limit] + "…"
