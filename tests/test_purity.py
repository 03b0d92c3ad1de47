"""miles_core stays pure: no heavy frameworks, no wall clock, no global randomness, no I/O."""

from __future__ import annotations

import ast
import pkgutil
import subprocess
import sys
from pathlib import Path

import miles_core

FORBIDDEN = {
    "simpy", "ray", "torch", "sglang", "sglang_router", "megatron", "transformers",
    "time", "datetime", "random", "socket", "subprocess", "threading", "asyncio.subprocess",
}  # fmt: skip
CORE = Path(miles_core.__file__).parent


def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return names


def test_no_core_module_imports_a_forbidden_module() -> None:
    offenders = {
        f"{path.name}: {name}"
        for path in CORE.rglob("*.py")
        for name in _imports(path)
        if name.split(".")[0] in FORBIDDEN or name in FORBIDDEN
    }
    assert offenders == set()


def test_every_core_module_imports_with_forbidden_modules_blocked() -> None:
    """Transitive imports too: a fresh interpreter refuses the forbidden names."""
    modules = sorted(m.name for m in pkgutil.walk_packages([str(CORE)], "miles_core."))
    assert len(modules) >= 8
    script = f"""
import importlib, importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {sorted(FORBIDDEN)!r}:
            raise ImportError("miles_core must not import " + name)
sys.meta_path.insert(0, Block())
for name in {modules!r}:
    importlib.import_module(name)
print("imported", len({modules!r}))
"""
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"imported {len(modules)}"


def test_backends_import_nothing_from_the_simulator() -> None:
    """The real worlds share the scenario layer with the simulator through miles_core, never
    through sim/ (which brings SimPy and the simulator's decisions about time)."""
    backends = CORE.parent / "backends"
    offenders = {
        f"{path.relative_to(backends.parent)}: {name}"
        for path in backends.rglob("*.py")
        for name in _imports(path)
        if name.split(".")[0] == "sim"
    }
    assert offenders == set()
    assert len(list(backends.rglob("*.py"))) >= 10  # the scan saw the backends
