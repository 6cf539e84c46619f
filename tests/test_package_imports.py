"""The packages' boundaries, read from the source: builder/ and train/ never import each other (what they both
read, safetensors files and the ModelOpt layout of heads, is formats/), and formats/ imports neither."""

from __future__ import annotations

from import_graph import ROOT, imported_modules, package_modules

PACKAGES = ("builder", "train", "formats", "runtime", "plugins")


def imports_between(importer: str, imported: str) -> list[str]:
    """'a.py imports b' for every module of folder ``importer`` that imports one of folder ``imported``."""
    modules = package_modules(*PACKAGES)
    found = []
    for name, path in modules.items():
        if name.startswith(f"specdec.{importer}"):
            hits = sorted(m for m in imported_modules(path, modules) if m.startswith(f"specdec.{imported}"))
            found += [f"{path.relative_to(ROOT)} imports {m}" for m in hits]
    return found


def test_the_check_sees_imports_across_packages():
    # the builder reads head checkpoints and the trainer writes them: both import formats/ (relative imports resolved)
    assert any("builder/build.py imports specdec.formats.heads" in f for f in imports_between("builder", "formats"))
    assert any("train/export.py imports specdec.formats.heads" in f for f in imports_between("train", "formats"))


def test_builder_imports_nothing_of_train():
    assert imports_between("builder", "train") == []


def test_train_imports_nothing_of_builder():
    assert imports_between("train", "builder") == []


def test_formats_imports_neither_builder_nor_train():
    assert imports_between("formats", "builder") + imports_between("formats", "train") == []
