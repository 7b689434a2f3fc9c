"""Helpers: the ``ringfence`` command run as a user runs it, and appends to a real store."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ringfence.audit.chain import SEAL_ACTION, SYSTEM, AuditEvent
from ringfence.audit.signing import SealKey
from ringfence.store.sql import SqlStore, sqlite_url

RINGFENCE = Path(sys.executable).parent / "ringfence"


@dataclass(frozen=True)
class Run:
    code: int
    stdout: str
    stderr: str

    def json(self) -> Any:
        return json.loads(self.stdout)


def ringfence(*args: str | Path, stdin: str | None = None, timeout: float = 60) -> Run:
    """Run the installed ``ringfence`` command."""
    done = subprocess.run(
        [str(RINGFENCE), *map(str, args)],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    return Run(done.returncode, done.stdout, done.stderr)


def append(data_dir: Path, events: Sequence[AuditEvent], *, seal: bool = False) -> None:
    """Append ``events`` (and then a seal by the data directory's key) to the store."""

    async def go() -> None:
        store = await SqlStore.open(sqlite_url(data_dir))
        try:
            if events:
                await store.append_audit(list(events))
            if seal:
                key = SealKey.load_or_create(data_dir)
                await store.append_audit([AuditEvent("", SYSTEM, SEAL_ACTION, "audit")], key.sign)
        finally:
            await store.aclose()

    asyncio.run(go())


def events(
    tenant: str, count: int, start: int = 0, action: str = "sandbox.create"
) -> list[AuditEvent]:
    return [
        AuditEvent(tenant, f"key{n}", action, f"sandbox:sb{n}", "ok", {"n": n})
        for n in range(start, start + count)
    ]
