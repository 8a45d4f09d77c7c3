"""Where a moved import path went: the most precise registered old name wins."""

from __future__ import annotations

from sfbus.topology.imports import moved_to

MOVES = {"old.": "new.", "old.flat": "new.wing.flat", "old.flat:Moved": "new.other:Moved",
         "old.pkg": "new.pkg.main"}


def test_an_object_then_its_module_then_its_package() -> None:
    assert moved_to("old.flat:Moved", MOVES) == "new.other:Moved"
    assert moved_to("old.flat:Stayed", MOVES) == "new.wing.flat:Stayed"
    assert moved_to("old.deep.mod:X.inner", MOVES) == "new.deep.mod:X.inner"


def test_a_module_that_became_a_package_keeps_both_meanings() -> None:
    assert moved_to("old.pkg:Actor", MOVES) == "new.pkg.main:Actor"  # the module as it was
    assert moved_to("old.pkg.part:Actor", MOVES) == "new.pkg.part:Actor"  # its package, later


def test_a_package_name_covers_only_its_own_modules() -> None:
    assert moved_to("older.mod:X", MOVES) is None
    assert moved_to("old:X", MOVES) is None  # the package's own module is no submodule of it
    assert moved_to("elsewhere:X", MOVES) is None
