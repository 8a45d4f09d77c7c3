"""The kernel's modules import one another without a circle."""

from __future__ import annotations

import ast
from pathlib import Path

SFBUS = Path(__file__).resolve().parents[2] / "sfbus"


def kernel_modules() -> dict[str, Path]:
    """Every module of the kernel by dotted name (a package by its own name)."""
    modules = {}
    for path in SFBUS.rglob("*.py"):
        parts = path.relative_to(SFBUS.parent).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """Kernel modules that importing ``name`` runs, from every import in the file.

    Imports under TYPE_CHECKING and inside functions count: the first is a circle the type
    checker walks, the second one that only waits for its first call. Importing ``a.b.c`` runs
    the package ``a.b`` too, unless ``name`` lives in it (then it is already running); the root
    ``sfbus`` is the public facade over everything, so it is left out.
    """
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parent, base] if base else parent)
            targets = [base, *(f"{base}.{alias.name}" for alias in node.names)]
        else:
            continue
        for target in targets:
            parts = target.split(".")
            for end in range(2, len(parts) + 1):
                module = ".".join(parts[:end])
                if module in modules and module != name and not name.startswith(module + "."):
                    found.add(module)
    return found


def find_circle(graph: dict[str, set[str]]) -> list[str]:
    """One import circle of ``graph`` as a path back to its start, or [] when there is none."""
    done: set[str] = set()

    def visit(module: str, trail: list[str]) -> list[str]:
        if module in trail:
            return [*trail[trail.index(module):], module]
        if module in done:
            return []
        for imported in sorted(graph[module]):
            circle = visit(imported, [*trail, module])
            if circle:
                return circle
        done.add(module)
        return []

    for module in sorted(graph):
        circle = visit(module, [])
        if circle:
            return circle
    return []


def test_find_circle_reports_one() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert find_circle(graph) == ["a", "b", "c", "a"]
    assert find_circle({"a": {"b"}, "b": set()}) == []


def test_the_kernel_has_no_import_circle() -> None:
    modules = kernel_modules()
    graph = {name: imports_of(name, path, modules) for name, path in modules.items()}
    assert "sfbus.topology" in graph["sfbus.routing"]  # the graph sees real imports
    assert find_circle(graph) == [], " -> ".join(find_circle(graph))
