"""What any tenant may ask for, whatever the object: limits and timeouts within the
operator's ceilings; and the defaults a sandbox's template gives the limits it leaves out."""

from __future__ import annotations

from ringfence.config import Config
from ringfence.errors import InvalidRequest
from ringfence.models import ResourceLimits, SandboxLimits

__all__ = [
    "browser_defaults",
    "check_limits",
    "check_timeout",
    "clamped_browser_defaults",
    "defaults_for",
    "template_limits",
]


def template_limits(template: str, config: Config) -> SandboxLimits | None:
    """A template's own defaults, over the server's (None: it has none).

    The browser template (``config.browser_template``) has ``browser_memory`` and
    ``browser_pids`` (each held to ``max_limits``: ``browser_defaults``): Chromium runs
    about 115 threads with one page and 11-30 more per page, so the general defaults (256
    pids, 512 MiB) hold a page or a few, and a heavy or cross-site one (a renderer of its
    own) exhausts them; under 128 pids Chromium hangs at start, under 64 it aborts
    (docs/templates.md has the measurements)."""
    if template == config.browser_template:
        memory, pids = browser_defaults(config)
        return SandboxLimits(memory=memory, pids=pids)
    return None


def browser_defaults(config: Config) -> tuple[int, int]:
    """The browser template's default memory and pids: ``browser_memory`` and
    ``browser_pids``, each clamped to the operator's ceiling (``max_limits``), which no
    default may pass, any more than what a create asks for (the server's startup log says
    so when it clamps: ``clamped_browser_defaults``)."""
    ceilings = config.max_limits
    memory, pids = config.browser_memory, config.browser_pids
    if ceilings.memory is not None:
        memory = min(memory, ceilings.memory)
    if ceilings.pids is not None:
        pids = min(pids, ceilings.pids)
    return memory, pids


def clamped_browser_defaults(config: Config) -> str | None:
    """What the startup log says when ``browser_defaults`` clamps (None: it does not)."""
    memory, pids = browser_defaults(config)
    clamped = [
        f"{name} {given} to max_limits.{field} {held}"
        for name, field, given, held in (
            ("browser_memory", "memory", config.browser_memory, memory),
            ("browser_pids", "pids", config.browser_pids, pids),
        )
        if held != given
    ]
    if not clamped:
        return None
    return (
        f"the {config.browser_template!r} template's default limits are clamped to the "
        f"server's ceilings: {', '.join(clamped)} (Chromium needs about 450 MiB and 130 "
        "threads with one tab: docs/templates.md)"
    )


def defaults_for(template: str, config: Config) -> ResourceLimits:
    """The limits a sandbox of ``template`` gets for every field its create leaves out."""
    own = template_limits(template, config)
    return config.default_limits if own is None else own.merged_over(config.default_limits)


def check_limits(limits: ResourceLimits, config: Config) -> None:
    """Raises ``InvalidRequest`` for a limit above the operator's ceiling."""
    ceilings = config.max_limits
    for name in ("memory", "pids", "cpus", "disk"):
        asked, most = getattr(limits, name), getattr(ceilings, name)
        if asked is not None and most is not None and asked > most:
            raise InvalidRequest(f"limits.{name}: {asked} is above this server's {most}")


def check_timeout(timeout: float | None, config: Config) -> None:
    """Raises ``InvalidRequest`` for a timeout above the operator's ceiling."""
    if timeout is not None and timeout > config.max_timeout:
        raise InvalidRequest(
            f"timeout: {timeout:g} s is above this server's {config.max_timeout:g} s"
        )
