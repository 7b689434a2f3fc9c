"""E2B's door names no host path of the server to a tenant either."""

from __future__ import annotations

import pytest

from e2b import Sandbox, SandboxException
from tests.e2b.conftest import E2bServer


def test_an_unknown_template_names_no_host_path(e2b_server: E2bServer) -> None:
    with pytest.raises(SandboxException, match="no-such-template") as caught:
        Sandbox.create("no-such-template")
    message = str(caught.value)
    assert "ringfence-templates" not in message and str(e2b_server.data_dir.parent) not in message
