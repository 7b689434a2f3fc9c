"""Policy: what may run, where, with what, and what it may reach, as data and pure functions.

Every decision the layers above enforce is made here, without I/O (no socket, no process;
the one file read is the operator's risk policy, by ``risk.load_risk_policy`` at start-up),
so each is tested without privileges:

- ``limits``: limits and timeouts a tenant may ask for, within the operator's ceilings.
- ``network``: which egress policy a sandbox gets (the tenant's default, under the
  operator's floor of deny and ask rules) and what an API client may put in one.
- ``egress``: the decision on one destination (by name and port, then by the addresses it
  resolved to); the proxy and resolver in ``ringfence.network`` enforce it.
- ``placement``: where an execution would run, every default filled in.
- ``risk``: the operator's Cedar risk policy over a proposal.
- ``seccomp``: the system-call filter of sandboxed processes (compiled with libseccomp).

It imports the models, the errors and ``Config``; never a backend, the store, the service
layer or an entry point.
"""
