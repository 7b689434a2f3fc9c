"""The ``job`` backend: one-shot executions as Kubernetes Jobs, interactive sandboxes as
Pods. The builders (``manifests``, ``cluster``) are pure and need no client; the executor
and the runtime import the official ``kubernetes`` client (the ``[kubernetes]`` extra) when
they are constructed, never when this package is imported."""
