"""E2B classes Ringfence does not offer through this door (``Volume``, ``Template``): each
call is refused with an error naming what is not supported, never a silent success."""

from __future__ import annotations

import pytest
from e2b.exceptions import BuildException

from e2b import Template, TemplateException, Volume, VolumeException
from tests.e2b.conftest import E2bServer


@pytest.mark.parametrize(
    "call",
    [
        lambda: Volume.create("data"),
        lambda: Volume.list(),
        lambda: Volume.get_info("data"),
        lambda: Volume.destroy("data"),
    ],
    ids=["create", "list", "get_info", "destroy"],
)
def test_volumes_are_refused(e2b_server: E2bServer, call: object) -> None:
    with pytest.raises(VolumeException, match="volumes: not supported"):
        call()  # type: ignore[operator]


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
