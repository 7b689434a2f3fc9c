"""The ``local`` backend: bubblewrap namespaces, seccomp and cgroups on this host."""

from ringfence.backends.local.backend import LocalExecutor

__all__ = ["LocalExecutor"]
