"""The package layout shows the architecture: wings in order, sampling and learning meeting only
in the data path, and no module or function too long to read."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from tests.kernel.test_imports import PACKAGES, ROOT, import_graph

COMPONENTS = ROOT / "sfbus_components"
ARCHITECTURE = ROOT / "docs" / "ARCHITECTURE.md"
# The wings from the bottom up (docs/ARCHITECTURE.md, "The folders"): a module imports only its
# own wing and the wings of lower rows; wings of one row do not import each other. The kernel
# knows nothing of RL; envs and models know no training; the data path (what sampling and
# learning share) and APPO's math build on the models; sampling acts; monitoring reports what
# the data path carries; learning and evaluation report through it; the league serves frozen
# snapshots back to sampling through the data path; PBT drives the learners from above; the
# CLI's commands use everything. Sampling and learning, in different rows, still
# never import each other (APART).
WING_ORDER = (
    ("kernel",),
    ("envs",),
    ("models",),
    ("algo", "datapath"),
    ("sampling",),
    ("monitoring",),
    ("learning", "evaluation"),
    ("league",),
    ("pbt",),
    ("commands",),
)
RANK = {wing: rank for rank, row in enumerate(WING_ORDER) for wing in row}
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 80
# role -> the roles it must never import (the processes meet in shared memory, not in code)
APART = {"sampling": ("learning",), "learning": ("sampling",),
         "datapath": ("sampling", "learning", "pbt", "monitoring", "evaluation")}


def imported_modules(path: Path) -> set[str]:
    """Every module ``path`` imports (absolute names), at any depth of the file."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


@pytest.mark.parametrize("role", sorted(APART))
def test_roles_stay_apart(role: str) -> None:
    modules = sorted((COMPONENTS / role).glob("*.py"))
    assert modules, f"sfbus_components/{role}/ is empty"
    crossings = [(m.name, name) for m in modules for name in imported_modules(m)
                 for other in APART[role] if name.startswith(f"sfbus_components.{other}")]
    assert not crossings, f"sfbus_components/{role} imports what it must not: {crossings}"


def names_from_the_kernel(path: Path) -> set[str]:
    """What ``path`` takes with ``from sfbus import ...`` (a submodule would be among them)."""
    return {alias.name for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.ImportFrom) and node.module == "sfbus" and node.level == 0
            for alias in node.names}


def test_components_use_only_the_kernels_public_api() -> None:
    import sfbus

    modules = sorted(COMPONENTS.rglob("*.py"))
    private = [(str(m.relative_to(COMPONENTS)), name) for m in modules
               for name in imported_modules(m) if name.startswith("sfbus.")]
    private += [(str(m.relative_to(COMPONENTS)), f"sfbus.{name}") for m in modules
                for name in names_from_the_kernel(m) if name not in sfbus.__all__]
    assert not private, f"kernel modules or names imported past sfbus.__all__: {private}"


def wing_of(module: str) -> str | None:
    """The wing of a module: ``kernel`` for ``sfbus``, the folder under ``sfbus_components``
    (None for the components' root modules, which belong to no wing)."""
    parts = module.split(".")
    if parts[0] == "sfbus":
        return "kernel"
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and parts[1] in RANK) else None


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """Each import of ``graph`` from a wing to a higher wing or to another wing of its row."""
    found = []
    for module, imported in sorted(graph.items()):
        wing = wing_of(module)
        for target in sorted(imported):
            other = wing_of(target)
            if wing is None or other is None or other == wing:
                continue
            if RANK[other] >= RANK[wing]:
                found.append(f"{module} ({wing}) -> {target} ({other})")
    return found


def test_every_wing_has_its_place() -> None:
    folders = {p.name for p in COMPONENTS.iterdir() if (p / "__init__.py").exists()}
    assert folders | {"kernel"} == set(RANK), "a wing of sfbus_components is not in WING_ORDER"


def test_upward_imports_are_found() -> None:
    graph = {"sfbus_components.learning.learner": {"sfbus_components.pbt.trainer",
                                                   "sfbus_components.models.policy"},
             "sfbus_components.algo.appo": {"sfbus_components.datapath.messages"},
             "sfbus.routing": {"sfbus_components.envs.spec"},
             "sfbus_components.moved": set()}
    assert upward_imports(graph) == [
        "sfbus.routing (kernel) -> sfbus_components.envs.spec (envs)",
        "sfbus_components.algo.appo (algo) -> sfbus_components.datapath.messages (datapath)",
        "sfbus_components.learning.learner (learning) -> sfbus_components.pbt.trainer (pbt)"]


def test_no_wing_imports_a_higher_one() -> None:
    graph = import_graph()
    assert "sfbus_components.datapath.messages" in graph["sfbus_components.learning.batcher"]
    upward = upward_imports(graph)
    assert not upward, "imports against the wing order:\n" + "\n".join(upward)


def python_files() -> list[Path]:
    """Every module of the kernel and the components."""
    return sorted(path for package in PACKAGES for path in (ROOT / package).rglob("*.py"))


def test_no_module_over_400_lines() -> None:
    long = [f"{path.relative_to(ROOT)}: {n} lines" for path in python_files()
            if (n := len(path.read_text().splitlines())) > MAX_MODULE_LINES]
    assert not long, f"modules over {MAX_MODULE_LINES} lines:\n" + "\n".join(long)


def long_functions(source: str) -> list[tuple[str, int, int]]:
    """(name, line, length) of each function of ``source`` (methods and nested ones too) over
    the limit, counted from its first decorator or its ``def`` to its last line, docstring
    included."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            if (length := node.end_lineno - first + 1) > MAX_FUNCTION_LINES:
                found.append((node.name, node.lineno, length))
    return found


def test_long_functions_are_found() -> None:
    body = "".join(f"        x{i} = {i}\n" for i in range(MAX_FUNCTION_LINES - 2))
    fits = f"class A:\n    @staticmethod\n    def fits():\n{body}"
    assert long_functions(fits) == []
    over = f"class A:\n    @staticmethod\n    async def over():\n{body}        return 1\n"
    assert long_functions(over) == [("over", 3, MAX_FUNCTION_LINES + 1)]


def test_no_function_over_80_lines() -> None:
    long = [f"{path.relative_to(ROOT)}:{line}: {name}: {length} lines"
            for path in python_files() for name, line, length in long_functions(path.read_text())]
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines:\n" + "\n".join(long)


def folder_map(text: str) -> dict[str, set[str]]:
    """The module file names each wing's row of ARCHITECTURE's folder map names, by wing."""
    rows = {}
    for line in text.splitlines():
        if match := re.match(r"\| `sfbus_components/(\w+)/` \|", line):
            rows[match[1]] = set(re.findall(r"`(\w+\.py)`", line))
    return rows


def test_the_folder_map_is_true_to_the_folders() -> None:
    rows = folder_map(ARCHITECTURE.read_text())
    wrong = []
    for wing in sorted(RANK.keys() - {"kernel"}):
        there = {p.name for p in (COMPONENTS / wing).rglob("*.py") if p.name != "__init__.py"}
        named = rows.get(wing, set())
        wrong += [f"{wing}/: {name} is not in the map" for name in sorted(there - named)]
        wrong += [f"{wing}/: the map names {name}, which is not there"
                  for name in sorted(named - there)]
    assert not wrong, "docs/ARCHITECTURE.md's folder map:\n" + "\n".join(wrong)
