"""Aggregate budgets: what each tenant, and the whole server, may hold at once.

Every interactive sandbox and every one-shot execution holds a ``Reservation`` from the
moment it is accepted until its end is stored: one place in its tenant's count, its memory
limit and its CPU limit. A reservation that would take its tenant past the tenant's budget is
refused with ``TooManyRequests`` (429); one that would take the server past its totals, with
``ServerAtCapacity`` (503). A request that alone exceeds a whole budget can never run and is
an ``InvalidRequest`` (400) naming the field. Nothing here awaits: a check and its reservation
happen in one step of the event loop, so concurrent requests cannot both squeeze through.

What is counted, and why:

- **Memory is held.** The sum of the memory limits granted never exceeds the server's total:
  the host's memory, or the operator's ``RINGFENCE_MAX_TOTAL_MEMORY`` below it. Limits, not
  use, are summed: a sandbox may grow to its limit at any time, and a host whose limits add
  up to more than its memory meets its OOM killer instead of a clear 503.
- **CPU time is shared, not held.** A CPU limit is a ceiling on a share of the cores; a host
  whose ceilings add up to more than its cores runs everything slower but breaks nothing (and
  the kernel never gives out more than the cores it has). The sum of CPU limits is bounded by
  ``RINGFENCE_MAX_TOTAL_CPUS`` (by default ``_CPU_SHARING`` times the cores), which bounds how
  thin each share can get; a tenant's own CPU budget keeps one tenant from taking the shares.
- **Warm-pool sandboxes** hold host reservations (no tenant) from their start, so the host
  total includes them. The tenant pays only once it claims one: the claim adds a tenant-only
  reservation beside the pool's host one, so nothing is counted twice.
- **Approved remediations** (a proposal's run) hold host reservations only, like the pool:
  an approval is the humans' decision, which an agent filling its tenant's budget must not
  be able to defeat.

Reservations are per server process: each replica bounds its own host (on the job backend the
cluster schedules Pods, so only the tenant budgets apply there).
"""

from __future__ import annotations

import collections
import os
from dataclasses import dataclass, field
from pathlib import Path

from ringfence.config import Config
from ringfence.errors import InvalidRequest, ServerAtCapacity, TooManyRequests
from ringfence.models import ResourceLimits

__all__ = ["Amount", "Budget", "Reservation", "host_capacity", "mem_total"]

# CPU limits the server may grant per core of the host (see the module docstring).
_CPU_SHARING = 32


@dataclass(frozen=True)
class Amount:
    """What one sandbox or execution holds: its memory limit (bytes) and CPU limit (cores)."""

    memory: int
    cpus: float

    @classmethod
    def of(cls, limits: ResourceLimits, unlimited: Amount) -> Amount:
        """The amount of ``limits`` (defaults already merged); a field left unlimited holds
        ``unlimited``'s (all of the server: it may take that much)."""
        memory = limits.memory if limits.memory is not None else unlimited.memory
        cpus = limits.cpus if limits.cpus is not None else unlimited.cpus
        return cls(memory, cpus)


@dataclass(eq=False)
class Reservation:
    """What one sandbox or execution holds; give it back with ``Budget.release``."""

    tenant: str | None  # None: a warm-pool sandbox, counted on the host only
    amount: Amount
    on_host: bool  # counted in the server's totals (False: a claim of a pooled sandbox)
    counted: bool = True  # counted as a running sandbox (False: a paused one's held memory)
    released: bool = False


@dataclass
class _Held:
    count: int = 0  # running sandboxes and executions
    reservations: int = 0  # those and paused sandboxes' held memory
    memory: int = 0
    cpus: float = 0.0


@dataclass
class Budget:
    """The tenant budget (the same for every tenant) and the server's totals.

    ``None`` for a field: no bound on it.
    """

    tenant_count: int | None = None
    tenant_memory: int | None = None
    tenant_cpus: float | None = None
    total_memory: int | None = None
    total_cpus: float | None = None
    _tenants: collections.defaultdict[str, _Held] = field(
        init=False, default_factory=lambda: collections.defaultdict(_Held)
    )
    _host: _Held = field(init=False, default_factory=_Held)

    @classmethod
    def from_config(cls, config: Config, host: Amount | None) -> Budget:
        """The budget ``config`` sets. ``host``: the capacity of the host the sandboxes run
        on (the operator's totals are held to it), or None when they run elsewhere (a
        cluster): then only tenant budgets apply."""
        total_memory = total_cpus = None
        if host is not None:
            total_memory = min(config.max_total_memory or host.memory, host.memory)
            total_cpus = config.max_total_cpus or host.cpus * _CPU_SHARING
        return cls(
            tenant_count=config.max_sandboxes_per_tenant,
            tenant_memory=config.max_memory_per_tenant,
            tenant_cpus=config.max_cpus_per_tenant,
            total_memory=total_memory,
            total_cpus=total_cpus,
        )

    @classmethod
    def for_server(cls, config: Config) -> Budget:
        """The budget of a server of ``config``'s backend: held to this host's capacity,
        unless its sandboxes run in a cluster (the job backend).

        Raises:
            OSError: the host's memory cannot be read.
        """
        return cls.from_config(config, None if config.backend == "job" else host_capacity())

    @property
    def unlimited(self) -> Amount:
        """What a sandbox without a memory or CPU limit is counted as: all there is."""
        memory = min(_bounds(self.tenant_memory, self.total_memory), default=1 << 62)
        cpus = min(_bounds(self.tenant_cpus, self.total_cpus), default=float(1 << 20))
        return Amount(int(memory), cpus)

    def amount(self, limits: ResourceLimits) -> Amount:
        """What a sandbox or execution of ``limits`` (defaults merged) holds."""
        return Amount.of(limits, self.unlimited)

    def held(self, tenant: str | None) -> tuple[int, int, float]:
        """(count, memory, cpus) held now by ``tenant``, or by the whole server (None)."""
        held = self._host if tenant is None else self._tenants.get(tenant, _Held())
        return held.count, held.memory, held.cpus

    def reserve(
        self, tenant: str | None, amount: Amount, *, on_host: bool = True, counted: bool = True
    ) -> Reservation:
        """Hold ``amount`` for a sandbox or execution of ``tenant`` (None: the warm pool's,
        counted on the host only; ``on_host`` False: the tenant's claim of a pooled sandbox,
        whose host share the pool already holds; ``counted`` False: not a running one, so
        outside the count of sandboxes and executions: a paused sandbox's held memory).

        Raises:
            InvalidRequest: ``amount`` alone is more than a whole budget (it could never run).
            TooManyRequests: the tenant's budget has no room for it now.
            ServerAtCapacity: the server's totals have no room for it now.
        """
        self._check_fits_at_all(amount, tenant is not None, on_host)
        if tenant is not None:
            self._check_tenant(tenant, amount, counted)
        if on_host:
            self._check_host(amount)
        reservation = Reservation(tenant, amount, on_host, counted)
        for held in self._counters(reservation):
            held.count += counted
            held.reservations += 1
            held.memory += amount.memory
            held.cpus += amount.cpus
        return reservation

    def release(self, reservation: Reservation) -> None:
        """Give ``reservation`` back (a second release does nothing)."""
        if reservation.released:
            return
        reservation.released = True
        amount = reservation.amount
        for held in self._counters(reservation):
            held.count -= reservation.counted
            held.reservations -= 1
            held.memory -= amount.memory
            held.cpus = max(0.0, held.cpus - amount.cpus)  # no float dust below zero
        if reservation.tenant is not None and self._tenants[reservation.tenant].reservations == 0:
            del self._tenants[reservation.tenant]  # no table of every tenant ever seen

    def _counters(self, reservation: Reservation) -> list[_Held]:
        counters = [self._host] if reservation.on_host else []
        if reservation.tenant is not None:
            counters.append(self._tenants[reservation.tenant])
        return counters

    def _check_fits_at_all(self, amount: Amount, for_tenant: bool, on_host: bool) -> None:
        memory = _bounds(self.tenant_memory if for_tenant else None,
                         self.total_memory if on_host else None)  # fmt: skip
        if memory and amount.memory > min(memory):
            raise InvalidRequest(
                f"limits.memory: {_gib(amount.memory)} is more than this server ever grants "
                f"at once ({_gib(min(memory))}; RINGFENCE_MAX_MEMORY_PER_TENANT, "
                "RINGFENCE_MAX_TOTAL_MEMORY)"
            )
        cpus = _bounds(self.tenant_cpus if for_tenant else None,
                       self.total_cpus if on_host else None)  # fmt: skip
        if cpus and amount.cpus > min(cpus):
            raise InvalidRequest(
                f"limits.cpus: {amount.cpus:g} is more than this server ever grants at once "
                f"({min(cpus):g}; RINGFENCE_MAX_CPUS_PER_TENANT, RINGFENCE_MAX_TOTAL_CPUS)"
            )

    def _check_tenant(self, tenant: str, amount: Amount, counted: bool = True) -> None:
        held = self._tenants.get(tenant, _Held())
        if counted and self.tenant_count is not None and held.count >= self.tenant_count:
            raise TooManyRequests(
                f"tenant {tenant!r} runs {held.count} sandboxes and executions, the most it "
                f"may at once (RINGFENCE_MAX_SANDBOXES_PER_TENANT={self.tenant_count}): wait "
                "for one to end, or kill one"
            )
        if self.tenant_memory is not None and held.memory + amount.memory > self.tenant_memory:
            raise TooManyRequests(
                f"tenant {tenant!r} holds {_gib(held.memory)} of memory limits; "
                f"{_gib(amount.memory)} more would pass its budget of "
                f"{_gib(self.tenant_memory)} (RINGFENCE_MAX_MEMORY_PER_TENANT): wait for a "
                "sandbox or execution to end, or ask for less memory"
            )
        if self.tenant_cpus is not None and held.cpus + amount.cpus > self.tenant_cpus + 1e-9:
            raise TooManyRequests(
                f"tenant {tenant!r} holds {held.cpus:g} CPUs of limits; {amount.cpus:g} more "
                f"would pass its budget of {self.tenant_cpus:g} "
                "(RINGFENCE_MAX_CPUS_PER_TENANT): wait for a sandbox or execution to end, "
                "or ask for fewer CPUs"
            )

    def _check_host(self, amount: Amount) -> None:
        held = self._host
        if self.total_memory is not None and held.memory + amount.memory > self.total_memory:
            raise ServerAtCapacity(
                f"this server has granted {_gib(held.memory)} of its {_gib(self.total_memory)} "
                f"of memory (the host's, or RINGFENCE_MAX_TOTAL_MEMORY below it); "
                f"{_gib(amount.memory)} more would overcommit it: retry when sandboxes or "
                "executions end"
            )
        if self.total_cpus is not None and held.cpus + amount.cpus > self.total_cpus + 1e-9:
            raise ServerAtCapacity(
                f"this server has granted {held.cpus:g} of its {self.total_cpus:g} CPUs of "
                f"limits (RINGFENCE_MAX_TOTAL_CPUS); {amount.cpus:g} more would pass it: retry "
                "when sandboxes or executions end"
            )


def host_capacity(meminfo: Path = Path("/proc/meminfo")) -> Amount:
    """This host's memory and the cores this process may run on.

    Raises:
        OSError: ``meminfo`` cannot be read.
    """
    return Amount(mem_total(meminfo.read_text()), float(len(os.sched_getaffinity(0))))


def mem_total(meminfo: str) -> int:
    """``MemTotal`` of a ``/proc/meminfo`` text, in bytes.

    Raises:
        ValueError: there is none.
    """
    for line in meminfo.splitlines():
        name, _, value = line.partition(":")
        if name == "MemTotal":
            number, _, unit = value.strip().partition(" ")
            return int(number) * (1024 if unit.strip().lower() == "kb" else 1)
    raise ValueError("no MemTotal in /proc/meminfo")


def _bounds(*values: float | None) -> list[float]:
    return [value for value in values if value is not None]


def _gib(n: float) -> str:
    return f"{n / (1 << 30):.2f} GiB".replace(".00 ", " ")
