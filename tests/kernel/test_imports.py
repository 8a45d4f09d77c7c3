"""No import circle anywhere in the kernel or the components: the import graph is a hierarchy."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("sfbus", "sfbus_components")


def package_modules(packages: tuple[str, ...] = PACKAGES) -> dict[str, Path]:
    """Every module of ``packages`` by dotted name (a package by its own name)."""
    modules = {}
    for package in packages:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """Modules among ``modules`` that importing ``name`` runs, from every import in the file.

    Imports under TYPE_CHECKING and inside functions count: the first is a circle the type
    checker walks, the second one that only waits for its first call. Importing ``a.b.c`` runs
    the package ``a.b`` too, unless ``name`` lives in it (then it is already running); the roots
    ``sfbus`` and ``sfbus_components`` are left out (the first is the public facade over
    everything, the second holds no code).
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


def import_graph(packages: tuple[str, ...] = PACKAGES) -> dict[str, set[str]]:
    """Each module of ``packages`` -> the modules of ``packages`` that importing it runs."""
    modules = package_modules(packages)
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


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


def import_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every import circle of ``graph``, one per group of modules that import one another
    (a strongly connected component of two or more; Tarjan's algorithm), each as a path back
    to its start."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[set[str]] = []

    def connect(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for imported in sorted(graph[module]):
            if imported not in index:
                connect(imported)
                low[module] = min(low[module], low[imported])
            elif imported in stack:
                low[module] = min(low[module], index[imported])
        if low[module] == index[module]:
            group = set()
            while not group or module not in group:
                group.add(stack.pop())
            if len(group) > 1:
                groups.append(group)

    for module in sorted(graph):
        if module not in index:
            connect(module)
    return sorted(find_circle({m: graph[m] & group for m in group}) for group in groups)


def test_find_circle_reports_one() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert find_circle(graph) == ["a", "b", "c", "a"]
    assert find_circle({"a": {"b"}, "b": set()}) == []


def test_import_circles_names_every_circle_once() -> None:
    graph = {"a": {"b"}, "b": {"a", "c"}, "c": {"d"}, "d": {"e"}, "e": {"c"}, "f": {"a", "e"}}
    assert import_circles(graph) == [["a", "b", "a"], ["c", "d", "e", "c"]]
    assert import_circles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_no_import_circle_in_the_kernel_or_the_components() -> None:
    graph = import_graph()
    # the graph sees real imports, in the kernel and in the components
    assert "sfbus.topology" in graph["sfbus.routing"]
    assert "sfbus_components.models.actor_critic" in graph["sfbus_components.algo.appo"]
    circles = import_circles(graph)
    assert circles == [], "import circles:\n" + "\n".join(" -> ".join(c) for c in circles)
