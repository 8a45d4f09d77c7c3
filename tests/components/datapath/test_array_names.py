"""The data path's shared arrays are named in one module: sfbus_components/datapath/buffers.py."""

from __future__ import annotations

import ast
from pathlib import Path

COMPONENTS = Path(__file__).resolve().parents[3] / "sfbus_components"
NAMER = COMPONENTS / "datapath" / "buffers.py"


def spelled_names(path: Path, root: Path = COMPONENTS) -> list[str]:
    """Where ``path`` spells a shared array's name itself: a string or f-string handed to
    ``context.shared``, ``slot_pool``, ``ArraySpec``, ``SlotPool.array_specs`` or tested
    ``in ... array_specs``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name in ("shared", "slot_pool", "ArraySpec", "array_specs") and node.args:
                argument = node.args[0]
            else:
                continue
        elif isinstance(node, ast.Compare) and isinstance(node.ops[0], ast.In | ast.NotIn):
            target = node.comparators[0]
            if not (isinstance(target, ast.Attribute) and target.attr == "array_specs"):
                continue
            argument = node.left
        else:
            continue
        if isinstance(argument, ast.JoinedStr | ast.Constant):
            found.append(f"{path.relative_to(root)}:{node.lineno}")
    return found


def test_only_buffers_spells_a_shared_arrays_name() -> None:
    spelled = [where for path in sorted(COMPONENTS.rglob("*.py")) if path != NAMER
               for where in spelled_names(path)]
    assert not spelled, f"shared-array names spelled outside datapath/buffers.py: {spelled}"


def test_the_scan_sees_each_way_of_spelling_one(tmp_path: Path) -> None:
    module = tmp_path / "spelling.py"
    source = ('pool = context.slot_pool(f"{name}.pool", owner=name)\n'
              'weights = context.shared("policy.0.weights")\n'
              'spec = ArraySpec(f"{name}.totals", (2,), "int64")\n'
              'published = f"policy.{i}.weights" in self.context.array_specs\n'
              'fine = context.shared(weights_name(0))\n')
    module.write_text(source)
    assert spelled_names(module, tmp_path) == [f"spelling.py:{line}" for line in (1, 2, 3, 4)]
