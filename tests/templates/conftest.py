"""Fixtures for the template tests: image archives built here from real files."""

from __future__ import annotations

import pytest

from tests.templates._images import Entry
from tests.templates._shared import release

__all__ = ["Entry"]


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "debootstrap: builds a Debian template (downloads packages; minutes the first time, "
        "cached under /var/cache/ringfence); never skipped in CI",
    )


def pytest_sessionfinish(session: pytest.Session) -> None:
    """The last worker of a run removes the templates its tests shared (``_shared``)."""
    release()
