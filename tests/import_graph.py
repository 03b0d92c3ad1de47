"""The tree's import graph, read from the source (ast; no module of the tree is imported).

Every import counts: at the top of a module, inside a function (a lazy import is still a
dependency), under ``TYPE_CHECKING`` (a type a module names is a part it knows), and
``importlib.import_module("a.literal.name")``. tests/test_layout.py holds the tree to it.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("miles_core", "sim", "backends")


@dataclass(frozen=True)
class Module:
    name: str
    """Dotted, as imported: ``sim.world.cluster``; a package is its ``__init__``."""
    path: Path
    is_package: bool


def modules(root: Path = ROOT) -> dict[str, Module]:
    found: dict[str, Module] = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            is_package = parts[-1] == "__init__"
            if is_package:
                parts.pop()
            found[".".join(parts)] = Module(".".join(parts), path, is_package)
    return found


def _imported_names(module: Module) -> Iterator[tuple[str, tuple[str, ...]]]:
    """(module name, names taken from it) for every import in the module's source."""
    here = module.name if module.is_package else module.name.rpartition(".")[0]
    for node in ast.walk(ast.parse(module.path.read_text(), str(module.path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, ()
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = here.split(".")
                parts = parts[: len(parts) - node.level + 1]
                base = ".".join([*parts, *([node.module] if node.module else [])])
            yield base, tuple(alias.name for alias in node.names)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            yield node.args[0].value, ()


def _resolve(name: str, known: dict[str, Module]) -> str | None:
    """The tree's module that ``name`` names (its longest known prefix), or None."""
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def graph(known: dict[str, Module] | None = None) -> dict[str, set[str]]:
    """Module -> the tree's modules it imports (``from pkg import submodule`` names the
    submodule; ``from pkg import name`` names the package)."""
    known = modules() if known is None else known
    edges: dict[str, set[str]] = {}
    for name, module in known.items():
        targets: set[str] = set()
        for imported, names in _imported_names(module):
            whole = [f"{imported}.{n}" for n in names if f"{imported}.{n}" in known]
            if whole:
                targets.update(whole)
            if len(whole) < len(names) or not names:
                found = _resolve(imported, known)
                if found is not None:
                    targets.add(found)
        targets.discard(name)
        edges[name] = targets
    return edges


def external(known: dict[str, Module] | None = None) -> dict[str, set[str]]:
    """Module -> the top-level names it imports from outside the tree (``ray``, ``json``)."""
    known = modules() if known is None else known
    return {
        name: {
            imported.split(".")[0]
            for imported, _ in _imported_names(module)
            if imported and _resolve(imported, known) is None
        }
        for name, module in known.items()
    }


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected parts of more than one module (Tarjan's, iterative), each
    sorted, then sorted by their first module: every one is at least one import circle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(edges):
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                part = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    part.append(member)
                    if member == node:
                        break
                if len(part) > 1:
                    found.append(sorted(part))
    return sorted(found)


def one_circle(part: list[str], edges: dict[str, set[str]]) -> list[str]:
    """A shortest import circle through the first module of ``part``, as a path that ends
    where it began (what a reader follows to break it)."""
    start, members = part[0], set(part)
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for child in sorted(edges[node] & members):
                if child == start:
                    return [*paths[node], start]
                if child not in paths:
                    paths[child] = [*paths[node], child]
                    following.append(child)
        frontier = following
    return part


if __name__ == "__main__":
    edges = graph()
    parts = circles(edges)
    for part in parts:
        print(" -> ".join(one_circle(part, edges)))
    print(f"{len(parts)} circle(s) among {len(edges)} modules")
