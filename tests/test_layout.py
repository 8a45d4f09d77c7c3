"""The package layout shows the data path: sampling and learning meet only in the datapath."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

COMPONENTS = Path(__file__).resolve().parents[1] / "sfbus_components"
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
