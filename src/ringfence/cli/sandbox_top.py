"""``ringfence sandbox top``: what your running sandboxes use (CPU, memory, disk,
processes), a table refreshed in place, or printed once (``--once``, for scripts and
pipes). Each sandbox is read through the SDK (``AsyncSandbox.metrics``); a paused one is
read as it is, never resumed."""

from __future__ import annotations

import asyncio
import json
import math
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

import click

from ringfence.cli.sandbox import api_options, client_errors

if TYPE_CHECKING:
    from ringfence.client import AsyncSandbox
    from ringfence.models import Sandbox, SandboxMetrics

__all__ = ["top"]

_AT_ONCE = 8  # sandboxes read concurrently
_CLEAR = "\x1b[H\x1b[2J"  # cursor home, clear the screen


@click.command("top")
@click.option("--once", is_flag=True, help="Print the table once and exit (no refresh).")
@click.option(
    "--interval", type=click.FloatRange(0.5, 3600), default=2.0, show_default=True,
    help="Seconds between refreshes.",
)  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="With --once: print the samples as JSON.")
@api_options
def top(once: bool, interval: float, as_json: bool, url: str | None, api_key: str | None) -> None:
    """What your sandboxes use now: CPU in percent of each one's limit, memory and disk
    against their limits, processes; busiest first. Refreshes until Ctrl-C, or prints
    once with --once."""
    if as_json and not once:
        raise click.UsageError("--json needs --once")
    with client_errors():
        if once:
            rows = asyncio.run(_sample(url, api_key))
            if as_json:
                click.echo(json.dumps([m.model_dump(mode="json") for _, m in rows if m], indent=2))
            else:
                click.echo(render(rows))
            return
        try:
            asyncio.run(_refresh(url, api_key, interval))
        except KeyboardInterrupt:
            return


async def _refresh(url: str | None, api_key: str | None, interval: float) -> None:
    while True:
        table = render(await _sample(url, api_key))
        sys.stdout.write(_CLEAR + table + "\n")
        sys.stdout.flush()
        await asyncio.sleep(interval)


async def _sample(
    url: str | None, api_key: str | None
) -> list[tuple[Sandbox, SandboxMetrics | None]]:
    """Each running or paused sandbox of the tenant with its metrics (None: it could
    not be read, e.g. it ended or is paused to disk meanwhile)."""
    from ringfence.client import AsyncSandbox

    found = await AsyncSandbox.list(state=["running", "paused"], limit=1000, url=url,
                                    api_key=api_key)  # fmt: skip
    gate = asyncio.Semaphore(_AT_ONCE)

    async def read(info: Sandbox) -> SandboxMetrics | None:
        from ringfence.errors import RingfenceError

        async with gate:
            sbx: AsyncSandbox | None = None
            try:
                sbx = await AsyncSandbox.connect(info.id, resume=False, url=url, api_key=api_key)
                return await sbx.metrics()
            except RingfenceError:
                return None
            finally:
                if sbx is not None:
                    await sbx.aclose()

    samples = await asyncio.gather(*(read(info) for info in found))
    rows = list(zip(found, samples, strict=True))
    rows.sort(key=lambda row: -(row[1].cpu_percent if row[1] else -1.0))
    return rows


def render(rows: Sequence[tuple[Sandbox, SandboxMetrics | None]]) -> str:
    """The table (pure): one line per sandbox, "-" where it could not be read."""
    table = [("ID", "STATE", "CPU%", "CPUS", "MEMORY", "DISK", "PIDS")]
    for info, m in rows:
        if m is None:
            table.append((info.id, info.state.value, "-", "-", "-", "-", "-"))
            continue
        table.append((
            info.id, info.state.value, f"{m.cpu_percent:.1f}", f"{m.cpus:g}",
            _of(m.memory_bytes, m.memory_limit), _of(m.disk_bytes, m.disk_limit), str(m.pids),
        ))  # fmt: skip
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
             for row in table]  # fmt: skip
    if len(table) == 1:
        lines.append("(no running sandboxes)")
    return "\n".join(lines)


def _of(used: int, limit: int) -> str:
    """``used`` of ``limit``, human: "12.5M/512M (2%)"; no limit: just "12.5M"."""
    if limit <= 0:
        return _human(used)
    return f"{_human(used)}/{_human(limit)} ({math.floor(100 * used / limit)}%)"


def _human(n: int) -> str:
    for suffix, factor in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= factor:
            value = n / factor
            return f"{value:.1f}{suffix}" if value < 100 else f"{value:.0f}{suffix}"
    return f"{n}B"
