"""Every executor and sandbox runtime meets the contract of ``ringfence.backends``."""

import pytest

from ringfence.backends import Executor, SandboxRuntime
from ringfence.testing.backend_checks import (
    EXECUTOR_CHECKS,
    RUNTIME_CHECKS,
    ExecutorCheck,
    RuntimeCheck,
)


@pytest.mark.parametrize("check", EXECUTOR_CHECKS, ids=lambda c: c.__name__)
async def test_the_executor_meets_the_contract(executor: Executor, check: ExecutorCheck) -> None:
    await check(executor)


@pytest.mark.parametrize("check", RUNTIME_CHECKS, ids=lambda c: c.__name__)
async def test_the_runtime_meets_the_contract(runtime: SandboxRuntime, check: RuntimeCheck) -> None:
    await check(runtime)
