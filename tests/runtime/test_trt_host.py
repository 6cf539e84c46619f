"""What a host can run with TensorRT, checked without a GPU.

The rules (which runtime runs which plan) are pure functions. The rest uses
the real ``tensorrt_dispatch`` / ``tensorrt_lean`` modules and cuda-python
where they are installed (the ``dev`` extra installs them on Linux x86-64):
they import without a GPU, so the executor's calls are checked against their
real API, and a host without a GPU is shown to be refused before TensorRT
touches the plan. No test here runs a TensorRT engine: those are the ``gpu``
tests in tests/builder/test_tensorrt_backend.py.
"""

import importlib
import importlib.util
import json
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from api_names import resolve, used_attributes

from specdec.formats.engine_format import CONFIG_FILE, STAMP_FILE, hash_directory, load_engine_dir
from specdec.formats.errors import DeviceError, EngineError
from specdec.hardware import tensorrt as trt_host
from specdec.hardware.tensorrt import RUNTIME_MODULES, build_metadata, check_gpu_arch, cuda_device_count, import_runtime, version_problem

ROOT = Path(__file__).resolve().parents[2]
INSTALLED = [m for m in RUNTIME_MODULES if importlib.util.find_spec(m) is not None]
HAS_CUDA_PYTHON = importlib.util.find_spec("cuda") is not None and importlib.util.find_spec("cuda.bindings") is not None
needs_runtimes = pytest.mark.skipif(
    not {"tensorrt_dispatch", "tensorrt_lean"} <= set(INSTALLED) or "tensorrt" in INSTALLED,
    reason="needs tensorrt_dispatch and tensorrt_lean without the full tensorrt (pip install -e '.[dev]' on Linux x86-64)",
)


def meta(version="10.15.1.29", compatible=False, excluded=False, sm="sm_90") -> dict:
    return {"tensorrt_version": version, "compute_capability": sm, "version_compatible": compatible, "exclude_lean_runtime": excluded}


# -- the rules -----------------------------------------------------------------------
@pytest.mark.parametrize(
    ("plan", "module", "host", "problem"),
    [
        # full TensorRT: its own version always; others only for version-compatible plans
        (meta(), "tensorrt", "10.15.1.29", None),
        (meta(excluded=True, compatible=True), "tensorrt", "10.15.1.29", None),
        (meta(), "tensorrt", "10.16.0.72", "specific to TensorRT 10.15.1.29"),
        (meta(compatible=True), "tensorrt", "10.16.0.72", None),
        (meta(compatible=True), "tensorrt", "11.0.0.114", None),  # 10 -> 11 is a supported pair
        (meta("9.3.0.1", compatible=True), "tensorrt", "11.0.0.114", "9 -> 11 is not a supported pair"),
        (meta(compatible=True), "tensorrt", "10.14.1.48", "same or a newer"),
        (meta(compatible=True, excluded=True), "tensorrt", "10.16.0.72", "EXCLUDE_LEAN_RUNTIME"),
        # dispatch: version-compatible plans that carry their lean runtime
        (meta(), "tensorrt_dispatch", "10.15.1.29", "only version-compatible"),
        (meta(compatible=True), "tensorrt_dispatch", "10.15.1.29", None),
        (meta(compatible=True), "tensorrt_dispatch", "10.16.0.72", None),
        (meta(compatible=True), "tensorrt_dispatch", "11.4.0.106",
         "across TensorRT majors (10 -> 11) a version-compatible plan runs only on the full tensorrt"),
        (meta(compatible=True), "tensorrt_dispatch", "10.14.1.48", "same or a newer"),
        (meta(compatible=True, excluded=True), "tensorrt_dispatch", "10.15.1.29", "tensorrt-lean==10.15.1.29"),
        # lean: version-compatible plans of exactly its version, with or without the embedded runtime
        (meta(), "tensorrt_lean", "10.15.1.29", "only version-compatible"),
        (meta(compatible=True), "tensorrt_lean", "10.15.1.29", None),
        (meta(compatible=True, excluded=True), "tensorrt_lean", "10.15.1.29", None),
        (meta(compatible=True), "tensorrt_lean", "10.16.0.72", "own version (pip install tensorrt-lean==10.15.1.29)"),
    ],
)
def test_which_runtime_runs_which_plan(plan, module, host, problem):
    got = version_problem(plan, module, host)
    assert got is None if problem is None else problem in got


def test_gpu_architecture_and_metadata_are_checked():
    check_gpu_arch(meta(), "sm_90", "e")
    with pytest.raises(EngineError, match=r"e was built with TensorRT 10.15.1.29 for sm_90, but this GPU is sm_89: rebuild on this host"):
        check_gpu_arch(meta(), "sm_89", "e")
    with pytest.raises(EngineError, match="records no TensorRT build metadata"):
        build_metadata({}, "e")
    with pytest.raises(EngineError, match="records no TensorRT build metadata"):
        import_runtime({"tensorrt_version": "10.15.1.29"}, "e")


def test_no_runtime_installed_names_the_packages(monkeypatch):
    real = importlib.import_module

    def without_tensorrt(name, *a, **kw):
        if name in RUNTIME_MODULES:
            raise ImportError(f"No module named '{name}'")
        return real(name, *a, **kw)

    monkeypatch.setattr(trt_host.importlib, "import_module", without_tensorrt)
    with pytest.raises(EngineError, match=r"no TensorRT runtime is importable here .*tensorrt==10.15.1.29 \(pip install \"specdec\[tensorrt\]\""):
        import_runtime(meta(), "e")
    with pytest.raises(EngineError, match=r"the small dispatch runtime \(pip install \"specdec\[tensorrt-dispatch\]\""):
        import_runtime(meta(compatible=True), "e")


# -- the real runtime modules ------------------------------------------------------------
@needs_runtimes
def test_runtime_choice_with_the_real_modules():
    lean = importlib.import_module("tensorrt_lean").__version__
    dispatch = importlib.import_module("tensorrt_dispatch").__version__
    assert import_runtime(meta(dispatch, compatible=True), "e").__name__ == "tensorrt_dispatch"
    assert import_runtime(meta(lean, compatible=True, excluded=True), "e").__name__ == "tensorrt_lean"
    with pytest.raises(EngineError) as err:
        import_runtime(meta("99.0.0.1", compatible=True), "e")  # a plan from a future TensorRT
    text = str(err.value)
    assert f"tensorrt_dispatch {dispatch}: a version-compatible plan runs only on the same or a newer" in text
    assert f"tensorrt_lean {lean}: the lean runtime runs only plans built by its own version" in text
    with pytest.raises(EngineError, match=f"tensorrt_dispatch {dispatch}: the dispatch runtime runs only version-compatible plans"):
        import_runtime(meta(dispatch), "e")


@pytest.mark.parametrize("module", [m for m in RUNTIME_MODULES if m in INSTALLED] or ["tensorrt_dispatch"])
def test_executor_calls_exist_in_the_real_runtime_api(module):
    """Every TensorRT call TrtExecutor makes names a real attribute of that runtime's classes."""
    if module not in INSTALLED:
        pytest.skip(f"{module} is not installed (pip install -e '.[dev]' on Linux x86-64)")
    trt = importlib.import_module(module)
    used = used_attributes(ROOT / "runtime" / "backends" / "tensorrt" / "executor.py", {
        "trt": "module", "self._trt": "module", "plan": "engine", "self._plan": "engine",
        "ctx": "context", "self._context": "context", "self._runtime": "runtime",
    })
    assert {("execute_async_v3",), ("set_tensor_address",), ("set_input_shape",)} <= used["context"]  # the walker sees the calls
    assert {("get_aliased_input_tensor",), ("get_tensor_profile_shape",)} <= used["engine"]
    assert ("engine_host_code_allowed",) in used["runtime"] and ("Logger", "WARNING") in used["module"]
    classes = {"module": trt, "engine": trt.ICudaEngine, "context": trt.IExecutionContext, "runtime": trt.Runtime}
    missing = {kind: sorted(".".join(c) for c in chains if not resolve(classes[kind], c)) for kind, chains in used.items()}
    assert not any(missing.values()), f"{module} {trt.__version__} lacks {missing}"


@pytest.mark.skipif(not HAS_CUDA_PYTHON, reason="cuda-python is not installed (pip install -e '.[dev]' on Linux x86-64)")
def test_cuda_calls_exist_in_the_real_cuda_python():
    from cuda.bindings import runtime as cudart

    files = [ROOT / "runtime" / "backends" / "tensorrt" / "executor.py", ROOT / "hardware" / "tensorrt.py",
             ROOT / "builder" / "backends" / "tensorrt.py"]
    roots = {"rt": "cudart", "self._rt": "cudart", "cudart_module()": "cudart"}
    used = set().union(*(used_attributes(f, roots)["cudart"] for f in files))
    assert {("cudaMalloc",), ("cudaMemcpyAsync",), ("cudaMemGetInfo",), ("cudaGetDeviceProperties",)} <= used
    missing = sorted(".".join(c) for c in used if not resolve(cudart, c))
    assert not missing, f"cuda.bindings.runtime lacks {missing}"


# -- a host without a GPU ---------------------------------------------------------------
def placeholder_plan_engine(onnx_engine: Path, out: Path, version: str) -> Path:
    """An engine directory as a --trt_version_compatible build would lay it out, except that
    rank0.engine is not a plan: these tests must stop before anything reads it."""
    shutil.copytree(onnx_engine, out)
    (out / "rank0.engine").write_bytes(b"not a TensorRT plan")
    data = json.loads((out / CONFIG_FILE).read_text())
    data["build"] = {**data["build"], "backend": "tensorrt"}
    data["network_file"] = "rank0.engine"
    data["extra"]["tensorrt"] = meta(version, compatible=True)
    (out / STAMP_FILE).write_text(json.dumps({"model": data["model"], "build": data["build"]}))  # as such a build stamps it
    data["files"] = hash_directory(out)
    (out / CONFIG_FILE).write_text(json.dumps(data))
    return out


@pytest.fixture(scope="module")
def no_gpu_engine(tmp_path_factory):
    if "tensorrt_dispatch" not in INSTALLED or not HAS_CUDA_PYTHON:
        pytest.skip("needs tensorrt_dispatch and cuda-python (pip install -e '.[dev]' on Linux x86-64)")
    if cuda_device_count() > 0:
        pytest.skip("this host has a GPU: the gpu tests cover it")
    from checkpoints import make_checkpoint
    from conftest import spec_build

    from specdec.builder.build import build_engine

    d = tmp_path_factory.mktemp("nogpu")
    build_engine(make_checkpoint(d / "ckpt"), d / "onnx", replace(spec_build(4), lowering="portable"), say=lambda _: None)
    version = importlib.import_module("tensorrt_dispatch").__version__
    return placeholder_plan_engine(d / "onnx", d / "trt", version)


def test_only_tensorrt_engines_count_against_gpu_memory(no_gpu_engine):
    from specdec.runtime.backends import Placement, backend_for, placement_groups

    trt_engine = load_engine_dir(no_gpu_engine)
    ort_engine = load_engine_dir(no_gpu_engine.with_name("onnx"))
    # a CPU draft beside a GPU target: the tensorrt backend is asked about its own engine only
    groups = placement_groups([(trt_engine, Placement("cuda", 1)), (ort_engine, Placement("cpu", 0))])
    assert groups[("tensorrt", "cuda")] == [(trt_engine, 1)]
    # the onnxruntime backend measures no GPU memory up front, whatever it is given
    for kind in ("cpu", "cuda"):
        backend_for(ort_engine, kind).check_placement([ort_engine, ort_engine], [0, 0])


def test_executor_refuses_a_host_without_gpu_before_tensorrt_runs(no_gpu_engine):
    # In a child process: TensorRT deserializing without a driver ends the process with SIGSEGV.
    code = ("from specdec.formats.engine_format import load_engine_dir\nfrom specdec.runtime.backends.tensorrt.executor import TrtExecutor\n"
            f"TrtExecutor(load_engine_dir({str(no_gpu_engine)!r}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 1, out.stderr[-2000:]
    assert "specdec.formats.errors.DeviceError" in out.stderr
    assert "(TensorRT engine) needs an NVIDIA GPU, but CUDA sees none (cudaGetDeviceCount)" in out.stderr


def test_specdec_run_says_no_gpu_in_one_line(no_gpu_engine, tmp_path):
    (tmp_path / "ids.csv").write_text("5,6,7,8\n")
    out = subprocess.run([sys.executable, "-m", "specdec.cli.run", "--engine_dir", str(no_gpu_engine), "--input_file", str(tmp_path / "ids.csv")],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 1, out.stderr[-2000:]
    assert "Traceback" not in out.stderr
    assert out.stderr.strip().splitlines()[-1].startswith("error: a tensorrt engine needs an NVIDIA GPU, but CUDA sees none")


def test_no_gpu_means_zero_devices_and_a_device_error():
    if not HAS_CUDA_PYTHON:
        pytest.skip("cuda-python is not installed")
    if cuda_device_count() > 0:
        pytest.skip("this host has a GPU")
    with pytest.raises(DeviceError, match="needs an NVIDIA GPU, but CUDA sees none"):
        trt_host.require_gpu(0, "x")


def test_forcing_a_runtime_module(monkeypatch):
    monkeypatch.setenv("SPECDEC_TENSORRT_RUNTIME", "tensorrt_fast")
    with pytest.raises(EngineError,
                       match=r"SPECDEC_TENSORRT_RUNTIME='tensorrt_fast' is not a TensorRT runtime module; use one of tensorrt, tensorrt_dispatch, "
                             r"tensorrt_lean"):
        import_runtime(meta(), "e")
    if "tensorrt" not in INSTALLED:
        monkeypatch.setenv("SPECDEC_TENSORRT_RUNTIME", "tensorrt")
        with pytest.raises(EngineError, match=r"SPECDEC_TENSORRT_RUNTIME=tensorrt but `import tensorrt` failed .*install tensorrt, or unset"):
            import_runtime(meta(compatible=True), "e")
    if "tensorrt_lean" in INSTALLED:
        lean = importlib.import_module("tensorrt_lean").__version__
        monkeypatch.setenv("SPECDEC_TENSORRT_RUNTIME", "tensorrt_lean")  # dispatch would be chosen otherwise
        assert import_runtime(meta(lean, compatible=True), "e").__name__ == "tensorrt_lean"
