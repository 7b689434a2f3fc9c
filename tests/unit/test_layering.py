"""The layers, checked by walking every import of every module (lazy and type-only ones too).

    entry points      server (e2b, console)    cli    mcp        never import the store
                                  \\           |      /
    composition root            compose                           the only module importing
                                   |                              service, backends and store
    service layer               service
                              /    |     \\
    below          policy  backends  store  network  audit ...
                              \\    |     /
    bottom             models   errors   _units                  import nothing of ours

Besides: no module imports another package's underscore names (a private module, or a
private name of one of its modules); inside one package they are shared freely. And no
module outside ``ringfence.testing`` imports it: production never reaches the fakes.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import ringfence

SRC = Path(ringfence.__file__).parent

ENTRY_POINTS = ("ringfence.server", "ringfence.cli", "ringfence.mcp")
COMPOSITION_ROOT = "ringfence.compose"
WIRED_TOGETHER = ("ringfence.service", "ringfence.backends", "ringfence.store")
BOTTOM = ("ringfence.models", "ringfence.errors")
BOTTOM_MAY_IMPORT = ("ringfence._units", "ringfence.errors")
TESTING = "ringfence.testing"  # the fakes and checks: only tests (and itself) import it

# Known violations, each to be removed by the change that fixes it. Not for new code: a new
# entry needs a reason here and a plan to remove it. A stale entry fails the test too.
ALLOWED: dict[tuple[str, str, str], str] = {}


@dataclass(frozen=True)
class Import:
    """One import: ``importer`` imports ``target`` (a module, or ``module.name``)."""

    importer: str
    target: str
    line: int


@dataclass(frozen=True)
class Violation:
    rule: str  # "bottom", "store", "private", "testing" or "wiring"
    importer: str
    target: str

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.rule, self.importer, self.target)


def module_name(path: Path, root: Path = SRC) -> str:
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_in(source: str, importer: str, is_package: bool) -> list[Import]:
    """Every import in ``source`` of a ``ringfence`` module or name, anywhere in the file."""
    found = []
    package = importer if is_package else importer.rpartition(".")[0]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [Import(importer, alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            found += [Import(importer, f"{base}.{alias.name}", node.lineno) for alias in node.names]
    return [i for i in found if i.target == "ringfence" or i.target.startswith("ringfence.")]


def source_imports() -> tuple[list[Import], set[str]]:
    """The imports of every module of the installed ``ringfence``, and its packages' names."""
    found: list[Import] = []
    packages = set()
    for path in sorted(SRC.rglob("*.py")):
        name = module_name(path)
        if path.name == "__init__.py":
            packages.add(name)
        found += imports_in(path.read_text(), name, path.name == "__init__.py")
    return found, packages


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def _owner(target: str, packages: set[str]) -> str | None:
    """The package a private module or name in ``target`` belongs to, or None if none is."""
    parts = target.split(".")
    for index, part in enumerate(parts[1:], start=1):
        if part.startswith("_") and not part.startswith("__"):
            container = ".".join(parts[:index])
            # A private module of a package belongs to it; a private name of a module (or a
            # module of a module's name), to the package that module is in.
            while container not in packages:
                container = container.rpartition(".")[0]
            return container
    return None


def violations(found: Iterable[Import], packages: set[str]) -> set[Violation]:
    """What of ``found`` breaks a layering rule (see the module docstring)."""
    broken = set()
    wired: dict[str, set[str]] = {}
    for i in found:
        own_layer = ".".join(i.importer.split(".")[:2])  # ringfence.models.keys: ringfence.models
        if own_layer in BOTTOM and not (
            i.target.startswith(BOTTOM_MAY_IMPORT) or _within(i.target, own_layer)
        ):
            broken.add(Violation("bottom", i.importer, i.target))
        if i.importer.startswith(ENTRY_POINTS) and _within(i.target, "ringfence.store"):
            broken.add(Violation("store", i.importer, _module_part(i.target, packages)))
        if _within(i.target, TESTING) and not _within(i.importer, TESTING):
            broken.add(Violation("testing", i.importer, _module_part(i.target, packages)))
        owner = _owner(i.target, packages)
        if owner is not None and not _within(i.importer, owner):
            broken.add(Violation("private", i.importer, i.target))
        for layer in WIRED_TOGETHER:
            if _within(i.target, layer) and layer != own_layer:
                wired.setdefault(i.importer, set()).add(layer)
    for importer, layers in wired.items():
        if len(layers) == len(WIRED_TOGETHER) and importer != COMPOSITION_ROOT:
            broken.add(Violation("wiring", importer, " + ".join(sorted(layers))))
    return broken


def _module_part(target: str, packages: set[str]) -> str:
    """``ringfence.store.Store`` -> ``ringfence.store``; a module's path stays itself."""
    head, _, last = target.rpartition(".")
    if target in packages or (SRC.parent / Path(*target.split("."))).with_suffix(".py").exists():
        return target
    return head if last else target


def _described(found: Iterable[Violation]) -> str:
    return "\n".join(f"  {v.rule}: {v.importer} imports {v.target}" for v in sorted(
        found, key=lambda v: v.key
    ))  # fmt: skip


def test_the_layers_hold() -> None:
    found, packages = source_imports()
    broken = {v for v in violations(found, packages) if v.key not in ALLOWED}
    assert not broken, "layering broken (see tests/unit/test_layering.py):\n" + _described(broken)


def test_every_allowed_violation_still_exists() -> None:
    found, packages = source_imports()
    present = {v.key for v in violations(found, packages)}
    stale = [key for key in ALLOWED if key not in present]
    assert not stale, f"fixed: remove these from ALLOWED in tests/unit/test_layering.py: {stale}"


# -- the checker itself, on made-up imports ----------------------------------------------------

PACKAGES = {
    "ringfence", "ringfence.models", "ringfence.server", "ringfence.server.routes",
    "ringfence.server.e2b", "ringfence.store", "ringfence.store.sql", "ringfence.service",
    "ringfence.backends", "ringfence.cli", "ringfence.testing", "ringfence.testing.fakes",
}  # fmt: skip
R = "ringfence"


def _check(*pairs: tuple[str, str]) -> set[tuple[str, str, str]]:
    return {v.key for v in violations([Import(a, b, 1) for a, b in pairs], PACKAGES)}


def test_the_models_may_import_only_the_bottom() -> None:
    assert _check((f"{R}.models.keys", f"{R}.models.executions.Status")) == set()
    assert _check((f"{R}.models.limits", f"{R}._units.parse_size")) == set()
    assert _check((f"{R}.models", f"{R}.errors.InvalidRequest")) == set()
    config = (f"{R}.models.keys", f"{R}.config.Config")
    assert _check(config) == {("bottom", *config)}
    upwards = (f"{R}.errors", f"{R}.models.Status")
    assert _check(upwards) == {("bottom", *upwards)}


def test_an_entry_point_importing_the_store_is_caught() -> None:
    assert _check((f"{R}.server.routes.keys", f"{R}.store.Store")) == {
        ("store", f"{R}.server.routes.keys", f"{R}.store")
    }
    assert _check((f"{R}.cli.keys", f"{R}.store.memory.MemoryStore")) == {
        ("store", f"{R}.cli.keys", f"{R}.store.memory")
    }
    assert _check((f"{R}.service.keys", f"{R}.store.Store")) == set()
    assert _check((COMPOSITION_ROOT, f"{R}.store.Store")) == set()


def test_another_packages_underscore_names_are_caught() -> None:
    e2b_into_routes = (f"{R}.server.e2b.traffic", f"{R}.server.routes.sandboxes._clip")
    assert _check(e2b_into_routes) == {("private", *e2b_into_routes)}
    private_module = (f"{R}.server.app", f"{R}.store._replica.Lease")
    assert ("private", *private_module) in _check(private_module)
    # Inside one package (and its subpackages) private names are shared.
    assert _check((f"{R}.server.routes.files", f"{R}.server.routes.sandboxes._clip")) == set()
    assert _check((f"{R}.store.sql._base", f"{R}.store._replica.Lease")) == set()
    assert _check((f"{R}.store.sql", f"{R}.store.sql._keys.SqlKeys")) == set()
    # A private module of the root package is the whole package's.
    assert _check((f"{R}.models.limits", f"{R}._units.parse_size")) == set()


def test_production_importing_the_fakes_is_caught() -> None:
    fake = (f"{R}.compose", f"{R}.testing.fakes.FakeExecutor")
    assert _check(fake) == {("testing", f"{R}.compose", f"{R}.testing.fakes")}
    checks = (f"{R}.backends.process", f"{R}.testing.check_backend")
    assert _check(checks) == {("testing", f"{R}.backends.process", f"{R}.testing")}
    # The fakes and the checks import each other, and whatever they fake.
    assert _check((f"{R}.testing.backend_checks", f"{R}.testing.fakes.FakeExecutor")) == set()
    assert _check((f"{R}.testing.fakes.executor", f"{R}.backends.supervisor.Launched")) == set()


def test_only_the_composition_root_wires_service_backends_and_store() -> None:
    three = (f"{R}.service.executions", f"{R}.backends.create_executor", f"{R}.store.Store")
    all_three = f"{R}.backends + {R}.service + {R}.store"
    serve = f"{R}.cli.serve"
    assert ("wiring", serve, all_three) in _check(*[(serve, t) for t in three])
    assert _check(*[(COMPOSITION_ROOT, t) for t in three]) == set()
    # The service layer calls backends and the store: two layers besides its own.
    assert _check(*[(f"{R}.service.executions", t) for t in three]) == set()
    assert _check(*[(serve, t) for t in three[:2]]) == set()


def test_relative_imports_are_resolved() -> None:
    source = "from . import _x\nfrom ..store import Store\n"
    found = imports_in(source, f"{R}.server.app", is_package=False)
    assert [i.target for i in found] == [f"{R}.server._x", f"{R}.store.Store"]
