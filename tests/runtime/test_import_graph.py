"""runtime/ as a newcomer reads it: its modules import each other without a cycle, and a backend's code
loads only when an engine asks for that backend (docs/architecture.md#import-rules)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from import_graph import ROOT, find_cycle, imported_modules, package_modules

RUNTIME = ROOT / "runtime"


def runtime_modules() -> dict[str, Path]:
    return package_modules("runtime")


def test_the_cycle_finder_finds_a_cycle():
    # the circle issue 22 removed: the registry imported the executors, which imported the registry back
    graph = {"backend": {"executor", "engine_format"}, "executor": {"backend"}, "engine_format": set()}
    assert find_cycle(graph) == ["backend", "executor", "backend"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


def test_the_import_parser_resolves_relative_imports():
    modules = package_modules("runtime", "formats")
    got = imported_modules(RUNTIME / "backends" / "onnxruntime" / "cpu.py", modules)
    assert {"specdec.runtime.backends.base", "specdec.runtime.kv_cache", "specdec.formats.engine_format"} <= got


def test_runtime_modules_import_each_other_without_a_cycle():
    modules = runtime_modules()
    graph = {name: imported_modules(path, modules) for name, path in modules.items()}
    assert len(graph) > 30  # every runtime module was read
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph) or [])


def test_backends_import_no_loop_module_and_the_registry_no_backend():
    modules = runtime_modules()
    loop = {f"specdec.runtime.{m}" for m in ("engine", "round", "scheduler", "loading", "orchestrator", "proposers")}
    for name, path in modules.items():
        if name.startswith("specdec.runtime.backends"):
            assert not imported_modules(path, modules) & loop, f"{name} imports the loop above it"
    registry = imported_modules(RUNTIME / "backends" / "__init__.py", package_modules("runtime", "formats", "hardware"))
    assert registry <= {"specdec.runtime.backends.base", "specdec.formats.engine_format", "specdec.formats.errors"}, registry


def run_python(code: str) -> None:
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]


BACKEND_MODULES = ("specdec.runtime.backends.onnxruntime", "specdec.runtime.backends.tensorrt", "specdec.runtime.backends.tensorrt_rtx",
                   "specdec.hardware.tensorrt",
                   "specdec.runtime.backends.torch", "onnxruntime", "tensorrt", "tensorrt_rtx", "onnxruntime_ep_nv_tensorrt_rtx", "cuda", "torch",
                   "triton")


def test_importing_the_runtime_loads_no_backend():
    run_python(
        "import sys, specdec.runtime, specdec.runtime.loading, specdec.runtime.engine\n"
        f"loaded = [m for m in sys.modules if m.startswith({BACKEND_MODULES!r})]\n"
        "assert not loaded, loaded\n"
        "from specdec.runtime import OrtExecutor  # the public name still works, and loads its backend now\n"
        "assert 'specdec.runtime.backends.onnxruntime.cpu' in sys.modules\n"
    )


def test_a_cpu_engine_loads_only_its_own_backend(llama_engine):
    run_python(
        "import sys\n"
        "from specdec.runtime import load_engine\n"
        f"engine = load_engine({str(llama_engine)!r}, device='cpu')\n"
        "assert type(engine.target).__module__ == 'specdec.runtime.backends.onnxruntime.cpu'\n"
        "others = ('specdec.runtime.backends.onnxruntime.cuda', 'specdec.runtime.backends.tensorrt', 'specdec.runtime.backends.torch', 'tensorrt', "
        "'cuda',\n"
        "          'torch', 'triton')  # tensorrt_rtx too; no torch on an onnxruntime host\n"
        "loaded = [m for m in sys.modules if m.startswith(others)]\n"
        "assert not loaded, loaded\n"
    )


def test_a_torch_engine_on_the_cpu_loads_neither_onnxruntime_nor_triton(llama_ckpt, tmp_path):
    """The torch backend's CPU path is torch and the kernels' references: no onnxruntime, no Triton (bound at a kernel's first launch)."""
    from conftest import spec_build

    from specdec.builder.build import build_engine

    build_engine(llama_ckpt, tmp_path / "torch", spec_build(2, backend="torch"), say=lambda _: None)
    run_python(
        "import sys\n"
        "from specdec.runtime import load_engine\n"
        f"engine = load_engine({str(tmp_path / 'torch')!r}, device='cpu')\n"
        "assert type(engine.target).__module__ == 'specdec.runtime.backends.torch.executor'\n"
        "others = ('specdec.runtime.backends.onnxruntime', 'specdec.runtime.backends.tensorrt', 'onnxruntime', 'triton', 'tensorrt')\n"
        "loaded = [m for m in sys.modules if m.startswith(others)]\n"
        "assert not loaded, loaded\n"
    )
