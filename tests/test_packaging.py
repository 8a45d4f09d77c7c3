"""The wheel a checkout builds: only sfbus-owned top-level names, the env families as extras
(each bringing the modules its registry entry needs), the torch requirement the README states.

The fresh-virtualenv install of the wheel with one extra, which trains doom_basic, is done by hand
(README, "Installing sfbus as a package"): it downloads and installs ~1 GB.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import zipfile
from email.parser import Parser
from importlib.metadata import packages_distributions
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from sfbus_components.envs.registry import FAMILIES

ROOT = Path(__file__).parents[1]
FAMILY_EXTRAS = {"doom", "atari", "mujoco", "multiagent", "envpool"}
EXTRAS = FAMILY_EXTRAS | {"tools", "test", "bench"}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> zipfile.ZipFile:
    """The wheel built from a copy of the checkout's package sources (nothing written here)."""
    src = tmp_path_factory.mktemp("src")
    for name in ("sfbus", "sfbus_components"):
        shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    out = tmp_path_factory.mktemp("wheel")
    build = f"import setuptools.build_meta as b; print(b.build_wheel({str(out)!r}))"
    result = subprocess.run([sys.executable, "-c", build], cwd=src, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    return zipfile.ZipFile(out / result.stdout.strip().splitlines()[-1])


def metadata(wheel: zipfile.ZipFile) -> tuple[list[Requirement], set[str]]:
    """The wheel's requirements and its extras."""
    name = next(n for n in wheel.namelist() if n.endswith(".dist-info/METADATA"))
    fields = Parser().parsestr(wheel.read(name).decode())
    return [Requirement(r) for r in fields.get_all("Requires-Dist")], \
        set(fields.get_all("Provides-Extra"))


def test_only_sfbus_names_land_in_site_packages(wheel: zipfile.ZipFile) -> None:
    top = {name.split("/")[0] for name in wheel.namelist()}
    assert top == {"sfbus", "sfbus_components", "sfbus-0.1.0.dist-info"}
    assert "sfbus_components/envs/atari/game.py" in wheel.namelist()
    scripts = wheel.read("sfbus-0.1.0.dist-info/entry_points.txt").decode()
    assert "sfbus = sfbus.cli:main" in scripts


def test_every_family_is_an_extra_that_brings_what_it_imports(wheel: zipfile.ZipFile) -> None:
    requirements, extras = metadata(wheel)
    assert extras == EXTRAS
    core = {canonicalize_name(r.name) for r in requirements if r.marker is None
            or "extra" not in str(r.marker)}
    # the engines are no core requirement: an install carries the families it asks for
    assert not core & {"vizdoom", "ale-py", "mujoco", "pettingzoo", "envpool", "opencv-python"}
    dists = packages_distributions()  # module -> the distributions (of this venv) that hold it
    for prefix, family in FAMILIES.items():
        extra = re.fullmatch(r"sfbus(?:\[(\w+)\])?", family.install)
        assert extra, (prefix, family.install)
        brought = core | {canonicalize_name(r.name) for r in requirements
                          if extra[1] and r.marker and r.marker.evaluate({"extra": extra[1]})}
        for module in family.requires:
            holders = {canonicalize_name(d) for d in dists[module]}
            assert holders & brought, f"{prefix}: {family.install} does not bring {module}"


def test_the_test_extra_pulls_every_family_and_the_readme_names_the_torch_requirement(
        wheel: zipfile.ZipFile) -> None:
    requirements, _ = metadata(wheel)
    test_deps = [r for r in requirements if r.marker and r.marker.evaluate({"extra": "test"})]
    assert any(r.name == "sfbus" and r.extras == FAMILY_EXTRAS | {"tools"} for r in test_deps)
    torch = next(r for r in requirements if r.name == "torch")
    readme, makefile = (ROOT / "README.md").read_text(), (ROOT / "Makefile").read_text()
    assert f"`{torch}`" in readme and "torch==2.13.0" in readme and "torch==2.13.0" in makefile
    assert torch.specifier.contains("2.13.0")
