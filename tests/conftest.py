import os
import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from checkpoints import make_checkpoint  # noqa: E402  (imports torch, which does not import Triton)

# Triton kernels (runtime/backends/torch/kernels/) run under Triton's interpreter on a host without a GPU; Triton reads
# this when it is first imported, so it is set before any test module imports it (tests/runtime/test_torch_kernels.py)
if not sys.modules["torch"].cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from specdec.builder.build import build_engine  # noqa: E402
from specdec.formats.engine_format import BuildConfig, load_engine_dir  # noqa: E402
from specdec.runtime.backends.onnxruntime.cpu import OrtExecutor  # noqa: E402


@pytest.fixture(scope="session", autouse=True)
def engine_stamp_cache(tmp_path_factory):
    """Engine loads record verified file stamps (formats/file_stamps.py) in this session's own cache, not ~/.cache."""
    os.environ["SPECDEC_CACHE_DIR"] = str(tmp_path_factory.mktemp("stamp-cache"))


def gpu_skip_reason() -> str | None:
    """Why the ``gpu`` tests cannot run here (they build TensorRT engines), or None."""
    try:
        import tensorrt  # noqa: F401  (the builder: tensorrt_lean/dispatch only run plans)
    except Exception as err:
        return f"needs an NVIDIA GPU and the full TensorRT (pip install -e '.[tensorrt]'); import tensorrt failed: {err}"
    from specdec.hardware.tensorrt import cuda_device_count

    if cuda_device_count() == 0:
        return "needs an NVIDIA GPU: TensorRT is installed but CUDA sees no GPU"
    return None


def cuda_skip_reason() -> str | None:
    """Why the ``cuda`` tests (ONNX Runtime's CUDA provider) cannot run here, or None."""
    from specdec.formats.errors import DeviceError
    from specdec.runtime.backends.onnxruntime.cuda_host import visible_cuda_gpus

    try:
        visible_cuda_gpus("this test (marked cuda)")
    except DeviceError as err:
        return str(err)
    return None


def torch_cuda_skip_reason() -> str | None:
    """Why the ``cuda(backend="torch")`` tests (the torch backend on a GPU, Triton kernels) cannot run here, or None."""
    try:
        import torch
    except ImportError as err:
        return f"needs torch with CUDA: {err}"
    if not torch.cuda.is_available():
        return f"needs an NVIDIA GPU: torch {torch.__version__} sees no CUDA device"
    try:
        import triton  # noqa: F401  (torch's CUDA wheels bring it)
    except ImportError as err:
        return f"needs Triton (it comes with torch's CUDA wheels): {err}"
    return None


def pytest_collection_modifyitems(config, items):
    # ``cuda`` tests run ONNX Runtime's CUDA provider, unless marked cuda(backend="torch"): the torch backend, which needs
    # torch with CUDA and Triton, not onnxruntime-gpu
    torch_backend = lambda item: item.get_closest_marker("cuda").kwargs.get("backend") == "torch"  # noqa: E731
    for marker, why, which in (("gpu", gpu_skip_reason, lambda item: True), ("cuda", cuda_skip_reason, lambda item: not torch_backend(item)),
                               ("cuda", torch_cuda_skip_reason, torch_backend)):
        # the marker itself, not item.keywords: a parameter id such as "cuda" is a keyword too, and so is every parent
        # directory's name (a checkout in a directory called gpu or cuda would skip the whole suite)
        marked = [item for item in items if item.get_closest_marker(marker) is not None and which(item)]
        reason = why() if marked else None
        for item in marked if reason else []:
            item.add_marker(pytest.mark.skip(reason=reason))


def spec_build(max_draft_len: int = 4, **kw) -> BuildConfig:
    mode = "draft_tokens_external" if max_draft_len else "none"
    base = dict(max_batch_size=4, max_input_len=48, max_seq_len=96, max_draft_len=max_draft_len, speculative_decoding_mode=mode)
    return BuildConfig(**{**base, **kw})


def build_and_load(ckpt: Path, out: Path, build: BuildConfig | None = None) -> OrtExecutor:
    build_engine(ckpt, out, build or spec_build(), say=lambda _: None)
    return OrtExecutor(load_engine_dir(out), num_threads=1)


def cli_build(ckpt: Path, out: Path, *flags):
    """specdec-build through click's runner, with small limits (the weight-only, AWQ and checkpoint tests)."""
    from click.testing import CliRunner

    from specdec.cli.build import main as build_main

    args = ("--model_dir", ckpt, "--output_dir", out, "--max_seq_len", 96, "--max_input_len", 48, *flags)
    return CliRunner().invoke(build_main, [str(a) for a in args])


def engine_greedy(ex, prompt: list[int], steps: int) -> list[int]:
    """Greedy decoding with an executor alone, one token per step: the reference of the parity tests."""
    cache = ex.new_cache(1)
    logits = ex.forward(cache, [prompt], all_logits=False).logits
    out = [int(logits[0, -1].argmax())]
    for _ in range(steps - 1):
        logits = ex.forward(cache, [[out[-1]]], all_logits=False).logits
        out.append(int(logits[0, -1].argmax()))
    return out


def spec_pair(d: Path, max_draft_len: int) -> dict:
    """A 2-layer target that verifies up to ``max_draft_len`` drafts, a 1-layer draft, and the
    target built as a draft ("identity": drafts that are always right), opened at one thread."""
    target = make_checkpoint(d / "target", num_hidden_layers=2, seed=0)
    draft = make_checkpoint(d / "draft", num_hidden_layers=1, hidden_size=32, intermediate_size=64, seed=0)
    return {
        "target": build_and_load(target, d / "te", spec_build(max_draft_len)),
        "draft": build_and_load(draft, d / "de", spec_build(0)),
        "identity": build_and_load(target, d / "ie", spec_build(0)),
        "dirs": d,
    }


@pytest.fixture(scope="session")
def llama_ckpt(tmp_path_factory) -> Path:
    return make_checkpoint(tmp_path_factory.mktemp("ckpt") / "llama", "LlamaForCausalLM", tie_word_embeddings=True)


@pytest.fixture(scope="session")
def llama_engine(tmp_path_factory, llama_ckpt) -> Path:
    out = tmp_path_factory.mktemp("engines") / "llama"
    build_engine(llama_ckpt, out, spec_build(), say=lambda _: None)
    return out


@pytest.fixture(scope="session")
def built_engine(tmp_path_factory, llama_ckpt):
    """A small draft-verifying engine, built once: tests copy it before changing anything (``engine_copy``)."""
    out = tmp_path_factory.mktemp("engine-format") / "engine"
    build_engine(llama_ckpt, out, spec_build(2), say=lambda _: None)
    return out


@pytest.fixture
def engine_copy(built_engine, tmp_path):
    """A fresh copy of ``built_engine``: its own files, inodes and times."""
    shutil.copytree(built_engine, tmp_path / "engine")
    return tmp_path / "engine"
