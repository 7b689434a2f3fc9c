"""Conformance checks that every implementation of an extension point must pass."""
