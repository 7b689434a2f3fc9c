import ast
import subprocess
import sys
from pathlib import Path

import ringfence

SRC = Path(ringfence.__file__).parent


def test_the_public_api_is_pinned() -> None:
    assert sorted(ringfence.__all__) == sorted(
        [
            "BackendUnavailable",
            "Config",
            "DuplicateExecution",
            "ExecutionNotFound",
            "ExecutionRequest",
            "ExecutionResult",
            "Executor",
            "InvalidRequest",
            "Mount",
            "ResourceLimits",
            "RingfenceError",
            "SandboxError",
            "Status",
            "UnknownBackend",
            "__version__",
            "create_executor",
        ]
    )
    for name in ringfence.__all__:
        assert hasattr(ringfence, name)


def test_importing_ringfence_loads_no_backend_and_no_cli() -> None:
    code = (
        "import sys, ringfence; "
        "print(sorted(m for m in sys.modules if m.startswith(('ringfence.backends.local', "
        "'ringfence.backends.process', 'ringfence.cli', 'pyseccomp', 'click', "
        "'ringfence.server', 'fastapi', 'sqlalchemy'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_importing_the_sdk_loads_no_server_store_or_backend() -> None:
    code = (
        "import sys, ringfence.client; "
        "print(sorted(m for m in sys.modules if m.startswith(('ringfence.backends.local', "
        "'ringfence.backends.process', 'ringfence.server', 'ringfence.store', "
        "'ringfence.service', 'ringfence.cli.', 'ringfence.sandboxd', 'fastapi', 'sqlalchemy', "
        "'uvicorn'))))"
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
