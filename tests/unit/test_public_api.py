import ast
import subprocess
import sys
from pathlib import Path

import pytest

import ringfence

SRC = Path(ringfence.__file__).parent


def test_the_public_api_is_pinned() -> None:
    assert sorted(ringfence.__all__) == sorted(
        [
            "AsyncRingfence",
            "AsyncSandbox",
            "BackendUnavailable",
            "CommandExitError",
            "CommandResult",
            "CommandTimeout",
            "Config",
            "DuplicateExecution",
            "ExecutionNotFound",
            "ExecutionRequest",
            "ExecutionResult",
            "Executor",
            "FileNotFound",
            "InvalidRequest",
            "Mount",
            "ResourceLimits",
            "Ringfence",
            "RingfenceError",
            "Sandbox",
            "SandboxError",
            "SandboxNotFound",
            "SandboxNotRunning",
            "Status",
            "UnknownBackend",
            "__version__",
            "create_executor",
        ]
    )
    for name in ringfence.__all__:
        assert hasattr(ringfence, name)
    assert set(ringfence.__all__) <= set(dir(ringfence))


def test_the_root_package_offers_the_sdk_as_e2b_does() -> None:
    import ringfence.client
    import ringfence.models
    from ringfence import AsyncSandbox, Sandbox

    assert Sandbox is ringfence.client.Sandbox and AsyncSandbox is ringfence.client.AsyncSandbox
    assert Sandbox is not ringfence.models.Sandbox  # the record is SandboxInfo in the SDK
    with pytest.raises(AttributeError):
        ringfence.Sandboxes  # noqa: B018


def test_the_sdk_names_are_imported_only_when_touched() -> None:
    code = (
        "import sys, ringfence; "
        "before = sorted(m for m in sys.modules if m.startswith(('httpx', 'ringfence.client'))); "
        "ringfence.Sandbox; "
        "print(before, 'httpx' in sys.modules, 'ringfence.client' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[] True True"


def test_importing_ringfence_loads_no_backend_and_no_cli() -> None:
    code = (
        "import sys, ringfence; "
        "print(sorted(m for m in sys.modules if m.startswith(('ringfence.backends.local', "
        "'ringfence.backends.process', 'ringfence.cli', 'pyseccomp', 'click', "
        "'ringfence.server', 'fastapi', 'sqlalchemy', 'ringfence.client', 'httpx', "
        # The supervisor (and its run table and output buffers) only with an executor.
        "'ringfence.backends._supervisor', 'ringfence.backends.supervisor', "
        "'ringfence.backends._runs', 'ringfence.backends._output'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# The daemon's method table (its services, methods and one user): stdlib only, no I/O, and
# the one module of ``sandboxd`` the host may import; the rest of the daemon stays out.
_SDK_MAY_LOAD = ("ringfence.sandboxd", "ringfence.sandboxd.methods")


def test_importing_the_sdk_loads_no_server_store_or_backend() -> None:
    code = (
        "import sys, ringfence.client, ringfence.client.lowlevel; from ringfence import *; "
        "print(sorted(m for m in sys.modules if m.startswith(('ringfence.backends.local', "
        "'ringfence.backends.process', 'ringfence.server', 'ringfence.store', "
        "'ringfence.service', 'ringfence.cli.', 'ringfence.sandboxd', 'fastapi', 'sqlalchemy', "
        f"'uvicorn', 'pyseccomp')) and m not in {_SDK_MAY_LOAD!r}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_the_sdk_api_is_pinned() -> None:
    import ringfence.client

    assert {"AsyncSandbox", "Sandbox", "CommandResult", "CommandExitError", "CommandTimeout",
            "FileNotFound", "EntryInfo", "FilesystemEvent", "SandboxNotFound"} <= set(
        ringfence.client.__all__
    )  # fmt: skip
    for name in ringfence.client.__all__:
        assert hasattr(ringfence.client, name)


def test_the_sdk_seam_beneath_it_is_public_and_pinned() -> None:
    import ringfence.client.lowlevel as lowlevel

    assert sorted(lowlevel.__all__) == [
        "DEFAULT_URL", "Link", "Settings", "checked", "list_params", "translate"
    ]  # fmt: skip
    for name in lowlevel.__all__:
        assert hasattr(lowlevel, name)


def _imports(module: Path) -> set[str]:
    tree = ast.parse(module.read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return {n for n in names if n.startswith("ringfence")}


def _layer_imports(*parts: str) -> set[str]:
    paths = [SRC.joinpath(*parts)]
    paths = list(paths[0].rglob("*.py")) if paths[0].is_dir() else [paths[0].with_suffix(".py")]
    return set().union(*(_imports(p) for p in paths))


def test_the_layers_only_import_downwards() -> None:
    assert _layer_imports("errors") == set()
    assert {m for m in _layer_imports("models") if not m.startswith("ringfence.models")} <= {
        "ringfence._units"
    }
    assert _layer_imports("config") <= {"ringfence.models", "ringfence._units"}
    assert not any(
        m.startswith(("ringfence.backends", "ringfence.cli")) for m in _layer_imports("policy")
    )
    assert not any(m.startswith("ringfence.cli") for m in _layer_imports("backends"))
    below_entry_points = ("ringfence.server", "ringfence.cli")
    for layer in ("store", "service", "backends", "policy"):
        assert not any(m.startswith(below_entry_points) for m in _layer_imports(layer)), layer
    assert not any(m.startswith("ringfence.backends") for m in _layer_imports("server")), (
        "the server reaches backends through the service layer only"
    )
