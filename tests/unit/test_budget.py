"""The aggregate budget: reserve and release, without privileges or sandboxes."""

from __future__ import annotations

import pytest

from ringfence.config import Config
from ringfence.errors import InvalidRequest, ServerAtCapacity, TooManyRequests
from ringfence.models import ResourceLimits
from ringfence.service.budget import Amount, Budget, host_capacity, mem_total

G = 1 << 30


def test_sandboxes_and_executions_share_one_count_per_tenant() -> None:
    budget = Budget(tenant_count=2)
    first = budget.reserve("acme", Amount(G, 1))
    budget.reserve("acme", Amount(G, 1))
    with pytest.raises(TooManyRequests) as refused:
        budget.reserve("acme", Amount(G, 1))
    assert refused.value.code == "too_many_requests"
    assert "RINGFENCE_MAX_SANDBOXES_PER_TENANT=2" in refused.value.message
    budget.reserve("globex", Amount(G, 1))  # another tenant's count is its own
    budget.release(first)
    budget.reserve("acme", Amount(G, 1))  # room again


def test_a_tenants_memory_and_cpus_are_summed() -> None:
    budget = Budget(tenant_memory=4 * G, tenant_cpus=2.0)
    budget.reserve("acme", Amount(3 * G, 0.5))
    with pytest.raises(TooManyRequests) as memory:
        budget.reserve("acme", Amount(2 * G, 0.5))
    assert "RINGFENCE_MAX_MEMORY_PER_TENANT" in memory.value.message
    budget.reserve("acme", Amount(G, 1.5))  # exactly at both budgets
    with pytest.raises(TooManyRequests) as cpus:
        budget.reserve("acme", Amount(0, 0.1))
    assert "RINGFENCE_MAX_CPUS_PER_TENANT" in cpus.value.message


def test_the_servers_totals_bind_every_tenant_and_the_pool() -> None:
    budget = Budget(total_memory=4 * G, total_cpus=4.0)
    pooled = budget.reserve(None, Amount(G, 1))  # the warm pool: the host only
    budget.reserve("acme", Amount(2 * G, 1))
    with pytest.raises(ServerAtCapacity) as refused:
        budget.reserve("globex", Amount(2 * G, 1))
    assert refused.value.code == "server_at_capacity"
    assert isinstance(refused.value, TooManyRequests)
    assert budget.held("globex") == (0, 0, 0.0), "a refusal holds nothing"
    budget.release(pooled)
    budget.reserve("globex", Amount(2 * G, 1))
    assert budget.held(None) == (2, 4 * G, 2.0)


def test_a_claim_of_a_pooled_sandbox_is_counted_once_on_the_host() -> None:
    budget = Budget(tenant_count=1, total_memory=2 * G)
    pooled = budget.reserve(None, Amount(G, 1))
    claim = budget.reserve("acme", Amount(G, 1), on_host=False)
    assert budget.held(None) == (1, G, 1.0) and budget.held("acme") == (1, G, 1.0)
    with pytest.raises(TooManyRequests):  # the tenant pays for what it claimed
        budget.reserve("acme", Amount(G, 1), on_host=False)
    budget.release(claim)
    budget.release(pooled)
    assert budget.held(None) == (0, 0, 0.0) and budget.held("acme") == (0, 0, 0.0)


def test_a_second_release_changes_nothing() -> None:
    budget = Budget(tenant_count=1)
    reservation = budget.reserve("acme", Amount(G, 1))
    budget.release(reservation)
    budget.release(reservation)
    budget.reserve("acme", Amount(G, 1))
    with pytest.raises(TooManyRequests):
        budget.reserve("acme", Amount(G, 1))


def test_more_than_a_whole_budget_is_a_bad_request_not_a_wait() -> None:
    budget = Budget(tenant_memory=8 * G, total_memory=4 * G, total_cpus=2.0)
    with pytest.raises(InvalidRequest) as memory:
        budget.reserve("acme", Amount(5 * G, 1))
    assert memory.value.message.startswith("limits.memory:")
    with pytest.raises(InvalidRequest) as cpus:
        budget.reserve("acme", Amount(G, 3))
    assert cpus.value.message.startswith("limits.cpus:")
    assert budget.held(None) == (0, 0, 0.0)


def test_an_unlimited_field_counts_as_all_there_is() -> None:
    budget = Budget(total_memory=4 * G, total_cpus=8.0, tenant_cpus=2.0)
    amount = Amount.of(ResourceLimits(memory=G), budget.unlimited)
    assert amount == Amount(G, 2.0)
    assert Amount.of(ResourceLimits(), budget.unlimited) == Amount(4 * G, 2.0)


def test_the_operators_totals_are_held_to_the_host() -> None:
    host = Amount(16 * G, 2.0)
    config = Config(max_total_memory=64 * G, max_sandboxes_per_tenant=3)
    budget = Budget.from_config(config, host)
    assert budget.total_memory == 16 * G, "never more than the host's memory"
    assert budget.tenant_count == 3
    assert Budget.from_config(Config(max_total_memory=4 * G), host).total_memory == 4 * G
    assert Budget.from_config(Config(), host).total_cpus == 64.0  # shares of 2 cores
    in_a_cluster = Budget.from_config(Config(), None)
    assert (in_a_cluster.total_memory, in_a_cluster.total_cpus) == (None, None)


def test_the_hosts_capacity_is_read_from_proc() -> None:
    assert mem_total("MemFree:  10 kB\nMemTotal:       24576000 kB\n") == 24576000 * 1024
    with pytest.raises(ValueError):
        mem_total("MemFree: 1 kB\n")
    host = host_capacity()
    assert host.memory > 0 and host.cpus >= 1
