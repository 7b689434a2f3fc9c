"""Helpers for the Kubernetes tests: every generated object is checked against the
official OpenAPI schemas (kubernetes-validate, strict: unknown fields are errors)."""

from __future__ import annotations

from typing import Any

import kubernetes_validate
import pytest

from ringfence.config import Config

# The newest release whose schemas kubernetes-validate ships (see test_schema_version).
SCHEMA_VERSION = "1.37"


def assert_valid(manifest: dict[str, Any]) -> None:
    """Raises kubernetes_validate.ValidationError naming the first problem."""
    kubernetes_validate.validate(manifest, SCHEMA_VERSION, strict=True)


@pytest.fixture
def config() -> Config:
    return Config(backend="job")
