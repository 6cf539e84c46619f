"""The packages' boundaries, read from the source (docs/architecture.md, "Import rules").

formats/ is the ground floor (the engine directory's contract, and the files several stages read); hardware/
stands on it (what this machine has). The stages above share only those two: builder/, plugins/ and train/ import
nothing of runtime/, runtime/ imports nothing of theirs, and nothing but cli/ itself imports cli/. A second check
imports the modules for real and looks at what got loaded: reading a Hugging Face config loads no runtime module.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from import_graph import ROOT, imported_modules, package_modules

PACKAGES = ("builder", "train", "formats", "hardware", "runtime", "plugins", "serve", "bench", "cli")


def imports_between(importer: str, imported: str) -> list[str]:
    """'a.py imports b' for every module of folder ``importer`` that imports one of folder ``imported``."""
    modules = package_modules(*PACKAGES)
    inside = lambda module, folder: module == f"specdec.{folder}" or module.startswith(f"specdec.{folder}.")  # noqa: E731
    found = []
    for name, path in modules.items():
        if inside(name, importer):
            hits = sorted(m for m in imported_modules(path, modules) if inside(m, imported))
            found += [f"{path.relative_to(ROOT)} imports {m}" for m in hits]
    return found


def test_the_check_sees_imports_across_packages():
    # the builder reads head checkpoints and the trainer writes them: both import formats/ (relative imports resolved)
    assert any("builder/build.py imports specdec.formats.heads" in f for f in imports_between("builder", "formats"))
    assert any("train/export.py imports specdec.formats.heads" in f for f in imports_between("train", "formats"))
    assert any("runtime/devices.py imports specdec.hardware.cpu" in f for f in imports_between("runtime", "hardware"))
    assert any("cli/train.py imports specdec.runtime" in f for f in imports_between("cli", "runtime"))


@pytest.mark.parametrize("importer, imported", [
    ("builder", "train"), ("train", "builder"),
    ("builder", "runtime"), ("plugins", "runtime"), ("train", "runtime"), ("formats", "runtime"), ("hardware", "runtime"),
    ("runtime", "builder"), ("runtime", "plugins"), ("runtime", "train"),
    ("runtime", "serve"), ("runtime", "bench"), ("builder", "serve"), ("builder", "bench"),
])
def test_stages_do_not_reach_into_each_other(importer, imported):
    assert imports_between(importer, imported) == []


@pytest.mark.parametrize("floor, allowed", [("formats", set()), ("hardware", {"formats"})])
def test_the_ground_floor_stands_on_nothing_above_it(floor, allowed):
    above = [p for p in PACKAGES if p != floor and p not in allowed]
    assert [f for p in above for f in imports_between(floor, p)] == []


@pytest.mark.parametrize("importer", [p for p in PACKAGES if p != "cli"])
def test_nothing_imports_the_cli(importer):
    assert imports_between(importer, "cli") == []


def loaded_after(code: str) -> list[str]:
    """The specdec modules loaded by running ``code`` in a fresh interpreter."""
    probe = code + "\nimport sys\nprint('\\n'.join(sorted(m for m in sys.modules if m.startswith('specdec'))))\n"
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout.split()


def test_reading_a_hugging_face_config_loads_no_runtime_module():
    loaded = loaded_after("import specdec.formats.hf_config, specdec.formats.engine_format")
    assert "specdec.formats.hf_config" in loaded  # the probe saw the import
    assert [m for m in loaded if m.startswith("specdec.runtime")] == []


def test_importing_the_runtime_package_loads_only_its_front_door():
    loaded = loaded_after("import specdec.runtime")
    assert [m for m in loaded if m.startswith("specdec.runtime")] == ["specdec.runtime"]
    loaded = loaded_after("from specdec.runtime import load_engine")  # a public name loads its module on first use
    assert "specdec.runtime.loading" in loaded
