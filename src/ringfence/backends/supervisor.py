"""The supervising executor, for executors built outside this package (the fakes in
``ringfence.testing``): subclass ``SupervisingExecutor`` and return a ``Launched`` from its
``_launch``; the supervision itself lives in ``_supervisor``.

Its own module, not a name of ``ringfence.backends``: importing ``ringfence`` (which imports
``ringfence.backends`` for the ``Executor`` protocol) does not load the supervisor, its run
table and its output buffers.
"""

from __future__ import annotations

from ringfence.backends._supervisor import Launched, SupervisedProcess, SupervisingExecutor

__all__ = ["Launched", "SupervisedProcess", "SupervisingExecutor"]
