"""The TensorRT-RTX executor: its refusals on this GPU-less host, and (marked ``rtx``) the real thing on an RTX GPU.

The ``rtx`` tests build tensorrt_rtx engines for the GPU's own SM and compare
them with ONNX Runtime on the CPU; they are skipped, with the reason, wherever
the NVIDIA driver, an RTX GPU or the execution provider is missing: on every
machine this project has had so far.
"""

import importlib.util
import subprocess
import sys

import numpy as np
import pytest
from checkpoints import make_checkpoint
from click.testing import CliRunner
from conftest import spec_build

from specdec.builder.build import build_engine
from specdec.cli.run import main as run_main
from specdec.formats.engine_format import load_engine_dir
from specdec.formats.errors import DeviceError, EngineError
from specdec.runtime.backends import backend_for, natural_kind
from specdec.runtime.backends.base import Backend
from specdec.runtime.backends.onnxruntime.cpu import OrtExecutor
from specdec.runtime.backends.tensorrt_rtx.host import Driver, bundled_tensorrt_rtx, check_release, pick_target, rtx_supported

HAS_RTX_BUILDER = importlib.util.find_spec("tensorrt_rtx") is not None
QUIET = dict(say=lambda _: None)


def rtx_gpu() -> tuple[str, str] | str:
    """(name, sm) of GPU 0 if the TensorRT-RTX tests can run here, else why not."""
    if not HAS_RTX_BUILDER:
        return "needs TensorRT for RTX to build: pip install -e '.[build,tensorrt-rtx-build]'"
    if importlib.util.find_spec("onnxruntime_ep_nv_tensorrt_rtx") is None:
        return "needs ONNX Runtime's TensorRT-RTX execution provider: pip install -e '.[tensorrt-rtx]'"
    try:
        name, sm = Driver("this test").describe(0)
    except DeviceError as err:
        return str(err)
    return (name, sm) if rtx_supported(sm) else f"GPU 0 ({name}) is {sm}, which TensorRT for RTX does not run"


@pytest.fixture(scope="module")
def rtx_engines(tmp_path_factory):
    """A tiny target built twice: tensorrt_rtx for the GPU's SM, and onnxruntime (portable) to compare with on the CPU."""
    if not HAS_RTX_BUILDER:
        pytest.skip("needs TensorRT for RTX to build: pip install -e '.[build,tensorrt-rtx-build]'")
    d = tmp_path_factory.mktemp("rtx_exec")
    ckpt = make_checkpoint(d / "ckpt", "LlamaForCausalLM", tie_word_embeddings=True)
    gpu = rtx_gpu()
    sm = gpu[1] if isinstance(gpu, tuple) else "sm89"
    build_engine(ckpt, d / "rtx", spec_build(4, backend="tensorrt_rtx"), target_sm=sm, **QUIET)
    build_engine(ckpt, d / "cpu", spec_build(4, lowering="portable"), **QUIET)
    return load_engine_dir(d / "rtx"), load_engine_dir(d / "cpu"), gpu


# -- refusals (decided without a GPU) ------------------------------------------------------------
def test_h100_is_refused_in_one_line(rtx_engines):
    engine = rtx_engines[0]
    with pytest.raises(DeviceError) as err:
        pick_target(engine, "NVIDIA H100 80GB HBM3", "sm90")
    built = ", ".join(engine.config.extra["tensorrt_rtx"]["targets"])
    assert str(err.value) == (f"{engine.path}: engine built for {built}; this GPU (NVIDIA H100 80GB HBM3) is sm90, "
                              "which TensorRT for RTX does not support.")


def test_a_supported_gpu_of_another_sm_is_told_to_rebuild(rtx_engines):
    engine = rtx_engines[0]
    other = "sm86" if "sm86" not in engine.config.extra["tensorrt_rtx"]["targets"] else "sm120"
    with pytest.raises(DeviceError, match=f"is {other}: rebuild with --target_sm .*{other}"):
        pick_target(engine, "an RTX GPU", other)
    sm = next(iter(engine.config.extra["tensorrt_rtx"]["targets"]))
    assert pick_target(engine, "an RTX GPU", sm)["engine_file"] == f"model.{sm}.engine"


@pytest.mark.parametrize("sm, ok", [("sm86", True), ("sm89", True), ("sm120", True), ("sm121", True), ("sm80", False), ("sm90", False),
                                    ("sm100", False)])
def test_supported_compute_capabilities(sm, ok):
    assert rtx_supported(sm) is ok


def test_provider_of_another_release_is_refused(rtx_engines, tmp_path):
    engine = rtx_engines[0]
    built = engine.config.extra["tensorrt_rtx"]["tensorrt_rtx_version"]
    (tmp_path / f"libtensorrt_rtx.so.{'.'.join(built.split('.')[:3])}").write_bytes(b"")
    assert bundled_tensorrt_rtx(tmp_path) == ".".join(built.split(".")[:3])
    check_release(engine, bundled_tensorrt_rtx(tmp_path))  # the same release: accepted
    with pytest.raises(DeviceError, match=f"built by TensorRT for RTX {built}, but the installed execution provider bundles 1.6.0"):
        check_release(engine, "1.6.0")


no_rtx_gpu = pytest.mark.skipif(isinstance(rtx_gpu(), tuple), reason="this host has an RTX GPU: the rtx tests run instead")


def refusal_of_this_host(message: str) -> bool:
    """Whether ``message`` is the backend's refusal of a host without the driver, or of a GPU TensorRT for RTX does not run."""
    return "needs an NVIDIA RTX GPU and its driver" in message or "which TensorRT for RTX does not support" in message


@no_rtx_gpu
def test_host_without_driver_or_gpu_is_refused_before_loading(rtx_engines):
    engine, cpu, _ = rtx_engines
    from specdec.runtime.backends.tensorrt_rtx.executor import RtxExecutor

    with pytest.raises(DeviceError) as err:
        RtxExecutor(engine)
    assert "\n" not in str(err.value) and refusal_of_this_host(str(err.value)), err.value
    with pytest.raises(EngineError, match="is a onnxruntime engine; the TensorRT-RTX executor runs tensorrt_rtx engines"):
        RtxExecutor(cpu)


def test_the_registry_runs_tensorrt_rtx_engines_on_cuda_by_default(rtx_engines):
    engine = rtx_engines[0]
    assert natural_kind("tensorrt_rtx") == "cuda"
    module = backend_for(engine, "cuda")
    assert module.__name__ == "specdec.runtime.backends.tensorrt_rtx.executor" and isinstance(module, Backend)
    with pytest.raises(DeviceError, match="a tensorrt_rtx engine .* cannot run on device 'cpu'; it runs on: cuda"):
        backend_for(engine, "cpu")


@no_rtx_gpu
@pytest.mark.parametrize("device", ["auto", "cuda"])
def test_specdec_run_refuses_this_host_in_one_line(rtx_engines, tmp_path, device):
    """specdec-run on a tensorrt_rtx engine reaches its backend, which refuses the host before anything loads."""
    (tmp_path / "prompts.csv").write_text("5,6,7\n")
    r = CliRunner().invoke(run_main, ["--engine_dir", str(rtx_engines[0].path), "--input_file", str(tmp_path / "prompts.csv"), "--device", device])
    assert r.exit_code == 1, r.output
    errors = [line for line in r.output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and refusal_of_this_host(errors[0]), r.output
    assert "Traceback" not in r.output


@no_rtx_gpu
def test_the_refusal_loads_only_the_rtx_backend(rtx_engines, tmp_path):
    """The real specdec-run in a process of its own: one line on stderr, and the backend module loaded without the
    TensorRT-RTX builder, the execution provider or another backend's runtime."""
    engine, prompts = rtx_engines[0], tmp_path / "prompts.csv"
    prompts.write_text("5,6,7\n")
    code = (
        "import sys\n"
        "from specdec.runtime import load_engine\n"
        "from specdec.formats.errors import DeviceError\n"
        "try:\n"
        f"    load_engine({str(engine.path)!r})\n"
        "except DeviceError:\n"
        "    pass\n"
        "else:\n"
        "    sys.exit('loaded on a host without an RTX GPU')\n"
        "assert 'specdec.runtime.backends.tensorrt_rtx.executor' in sys.modules\n"
        "loaded = [m for m in sys.modules if m.startswith(('specdec.builder', 'tensorrt', 'onnxruntime_ep_nv_tensorrt_rtx', 'torch', 'onnx.'))]\n"
        "assert not loaded, loaded\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    cli = subprocess.run([sys.executable, "-m", "specdec.cli.run", "--engine_dir", str(engine.path), "--input_file", str(prompts)],
                         capture_output=True, text=True, timeout=120)
    assert cli.returncode == 1 and cli.stdout == "", cli.stdout + cli.stderr
    assert len(cli.stderr.splitlines()) == 1 and refusal_of_this_host(cli.stderr), cli.stderr


def test_the_onnxruntime_calls_exist():
    """The executor's ONNX Runtime calls, against the installed onnxruntime (names only: behaviour needs an RTX GPU)."""
    import onnxruntime as ort

    assert callable(ort.register_execution_provider_library) and callable(ort.get_ep_devices)
    assert hasattr(ort.SessionOptions, "add_provider_for_devices") and hasattr(ort.RunOptions, "add_run_config_entry")
    assert {"ep_name", "ep_options"} <= set(dir(ort.OrtEpDevice))


# -- on an RTX GPU ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def on_gpu(rtx_engines):
    gpu = rtx_engines[2]
    if not isinstance(gpu, tuple):
        pytest.skip(gpu)
    from specdec.runtime.backends.tensorrt_rtx.executor import RtxExecutor

    return RtxExecutor(rtx_engines[0]), OrtExecutor(rtx_engines[1], num_threads=1)


def test_rtx_logits_match_onnxruntime(on_gpu):
    rtx, cpu = on_gpu
    caches = (rtx.new_cache(2), cpu.new_cache(2))
    prompts = [[3, 17, 5, 9, 2], [8, 1]]
    steps = [(prompts, False), ([[4, 6, 7], [2, 2, 9]], True), ([[11], [12]], True)]  # prefill, a verify step, a decode step
    for tokens, all_logits in steps:
        got, want = (ex.forward(c, tokens, all_logits=all_logits).logits for ex, c in zip((rtx, cpu), caches, strict=True))
        np.testing.assert_allclose(got, want, atol=1e-3)
    assert list(caches[0].lengths) == list(caches[1].lengths)


def test_rtx_greedy_tokens_equal_onnxruntime(on_gpu):
    rtx, cpu = on_gpu
    outs = []
    for ex in on_gpu:
        cache, seq = ex.new_cache(1), [5, 9, 13]
        logits = ex.forward(cache, [seq], all_logits=False).logits
        for _ in range(12):
            seq.append(int(np.argmax(logits[0, -1])))
            logits = ex.forward(cache, [[seq[-1]]], all_logits=False).logits
        outs.append(seq)
    assert outs[0] == outs[1]
