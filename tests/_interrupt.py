"""For tests that interrupt a CLI with ^C (SIGINT): the process they start gets SIGINT at
its default, whatever this test run inherited. A run started as a shell's background job
has SIGINT ignored, an ignored signal stays ignored across exec, and a program started
that way rightly keeps ignoring ^C (nohup's contract), so such a test would hang."""

from __future__ import annotations

import signal

__all__ = ["interruptible"]


def interruptible() -> None:
    """``preexec_fn`` of a process a test will interrupt."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
