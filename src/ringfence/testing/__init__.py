"""What tests of Ringfence and of its extensions build on.

``store_checks`` and ``backend_checks``: the conformance checks that every store, executor
and sandbox runtime must pass. ``fakes``: an executor and a sandbox runtime for tests of
logic (they pass the same checks, and isolate nothing: never evidence for a claim).
"""
