import pytest

from ringfence.store import MemoryStore
from ringfence.testing.store_checks import STORE_CHECKS, StoreCheck


@pytest.mark.parametrize("check", STORE_CHECKS, ids=lambda c: c.__name__)
async def test_memory_store_meets_the_contract(check: StoreCheck) -> None:
    await check(MemoryStore())
