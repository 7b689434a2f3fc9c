"""Fixtures for the template tests: image archives built here from real files."""

from __future__ import annotations

import pytest

from tests.templates._images import Entry

__all__ = ["Entry"]


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "debootstrap: builds a Debian template (downloads packages; minutes the first time, "
        "cached under /var/cache/ringfence); never skipped in CI",
    )
