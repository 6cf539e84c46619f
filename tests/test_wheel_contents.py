"""The installed package is the source tree: every folder of Python files installs as ``specdec.<folder>`` with
every module in it, and every module imports. The README's test command installs specdec the way users do
(``pip install ".[dev]"``, a wheel, not editable), so this runs against what users get; a folder that
setup.py's discovery misses (one without an ``__init__.py``) fails here by name."""

from __future__ import annotations

import importlib
import importlib.util
from pathlib import Path

import pytest
from import_graph import ROOT

# top-level folders of Python files that are not part of the package: they run from a checkout
NOT_PACKAGED = {"tests", "benchmarks", "examples", "docs", "build", "dist"}


def source_modules() -> list[str]:
    """specdec.<folder>.<module> for every .py file of the package folders, as the source tree has them."""
    names = []
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT)
        if len(rel.parts) < 2 or rel.parts[0] in NOT_PACKAGED or rel.parts[0].startswith("."):
            continue  # setup.py, hidden folders (.venv, .ci), and the folders above
        parts = list(rel.with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        names.append(".".join(["specdec", *parts]))
    return names


def test_the_source_tree_is_read():
    names = source_modules()
    assert "specdec.runtime.backends.tensorrt_rtx.executor" in names  # the subpackage an earlier hand-written list left out
    assert "specdec.formats.engine_format" in names and len(names) > 120


def test_every_source_folder_has_an_init_so_setuptools_finds_it():
    folders = {Path(*name.split(".")[1:-1]) for name in source_modules()} - {Path()}
    missing = sorted(str(f) for f in folders if not (ROOT / f / "__init__.py").is_file())
    assert missing == [], f"folders of Python files without __init__.py (setup.py would leave them out of the wheel): {missing}"


@pytest.mark.parametrize("name", source_modules())
def test_every_module_is_installed_and_imports(name):
    spec = importlib.util.find_spec(name)
    assert spec is not None, f"{name} is not in the installed package: is its folder missing from the wheel?"
    importlib.import_module(name)


def test_the_kernel_sources_are_installed():
    from specdec.hardware import cpu_kernels

    shipped = {p.name for p in cpu_kernels.KERNEL_DIR.iterdir()}
    assert {*cpu_kernels.SOURCES, *cpu_kernels.HEADERS} <= shipped
