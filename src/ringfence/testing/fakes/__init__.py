"""Fakes of the backends, for tests of logic: never evidence for a claim about sandboxes.

``FakeExecutor`` runs no process (its commands are the coroutines of ``shell``) under the
real supervision every subprocess backend shares; ``FakeSandboxRuntime`` serves each
sandbox with the real daemon as a plain, unisolated subprocess. Both pass the conformance
check that every backend passes (``ringfence.testing.backend_checks``).
"""

from ringfence.testing.fakes.executor import FAKE_HOME, FakeExecutor
from ringfence.testing.fakes.runtime import FakeSandboxRuntime
from ringfence.testing.fakes.shell import BUILTINS, FakeProcess, Program

__all__ = ["BUILTINS", "FAKE_HOME", "FakeExecutor", "FakeProcess", "FakeSandboxRuntime", "Program"]
