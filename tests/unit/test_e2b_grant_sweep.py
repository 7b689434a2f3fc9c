"""The E2B door's sweep of remembered grants: ended sandboxes' are forgotten, paused ones'
kept without waking them, and the store is read per grant only once the grants have
doubled since the last sweep (paused sandboxes would otherwise make every create sweep)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, cast

from ringfence.errors import SandboxNotFound
from ringfence.models import ResourceLimits, Sandbox, SandboxState
from ringfence.server.e2b.context import E2bContext
from ringfence.server.e2b.control import _forget_ended_when_many
from ringfence.server.e2b.tokens import Grant, Grants, Purpose


class _Sandboxes:
    """As much of ``SandboxService`` as the sweep uses; nothing runs."""

    def __init__(self) -> None:
        self.states: dict[str, SandboxState] = {}
        self.reads = 0

    def running_count(self) -> int:
        return 0

    async def get(self, tenant: str, sandbox_id: str) -> Sandbox:
        self.reads += 1
        if sandbox_id not in self.states:
            raise SandboxNotFound(sandbox_id)
        now = datetime.now(UTC)
        return Sandbox(id=sandbox_id, template="base", state=self.states[sandbox_id],
                       limits=ResourceLimits(), created_at=now, expires_at=None)  # fmt: skip

    async def daemon(self, tenant: str, sandbox_id: str) -> Any:
        raise AssertionError("a sweep must not ask for a daemon: that resumes a paused sandbox")


def _grant(grants: Grants, sandbox_id: str) -> None:
    grants.token(Grant("acme", "key", "gen", sandbox_id), Purpose.ENVD)


async def test_a_sweep_forgets_ended_grants_keeps_paused_ones_and_is_amortized() -> None:
    sandboxes, grants = _Sandboxes(), Grants()
    context = E2bContext(cast(Any, None), cast(Any, sandboxes), grants)
    for n in range(300):
        sandboxes.states[f"paused{n}"] = SandboxState.PAUSED
        _grant(grants, f"paused{n}")
    for n in range(20):
        sandboxes.states[f"ended{n}"] = SandboxState.EXPIRED
        _grant(grants, f"ended{n}")
        _grant(grants, f"unknown{n}")

    await _forget_ended_when_many(context)
    assert {g.sandbox_id for g in grants.issued()} == {f"paused{n}" for n in range(300)}
    assert sandboxes.reads == 340

    for _ in range(50):  # every token-handing call asks; none sweeps again yet
        await _forget_ended_when_many(context)
    assert sandboxes.reads == 340

    for n in range(301):
        sandboxes.states[f"more{n}"] = SandboxState.EXPIRED
        _grant(grants, f"more{n}")
    await _forget_ended_when_many(context)  # doubled since: swept again
    assert len(grants) == 300 and sandboxes.reads == 340 + 601
