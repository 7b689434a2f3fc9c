"""E2B classes Ringfence does not offer through this door (``Template``): each call is
refused with an error naming what is not supported, never a silent success. (``Volume`` is
offered: tests/e2b/test_volumes.py.)"""

from __future__ import annotations

import pytest
from e2b.exceptions import BuildException

from e2b import Template, TemplateException
from tests.e2b.conftest import E2bServer


@pytest.mark.parametrize(
    "call",
    [
        lambda: Template.build(Template().from_python_image("3.12").run_cmd("true"), "mine"),
        lambda: Template.exists("mine"),
        lambda: Template.get_tags("mine"),
    ],
    ids=["build", "exists", "get_tags"],
)
def test_templates_are_refused(e2b_server: E2bServer, call: object) -> None:
    """``BuildException`` (a build) and ``TemplateException`` (the rest), E2B's own."""
    with pytest.raises((BuildException, TemplateException), match="templates: not supported"):
        call()  # type: ignore[operator]
