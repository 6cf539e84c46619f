"""The torch backend: no graph, the checkpoint's tensors in the layout runtime/backends/torch's forward reads.

The engine is formats/torch_layout.py's files (written by builder/torch_network.py with numpy: building needs no
torch). Its executor (runtime/backends/torch/) runs the forward in plain torch over a static KV cache written in
place, with specdec's Triton kernels and CUDA graphs on an NVIDIA GPU, and the same forward in float32 with the
kernels' torch references on a CPU (how CI checks it against the onnxruntime engines). "Compiling" is checking
that every file the executor opens is there.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from ...formats.engine_format import BuildConfig, ModelConfig
from ...formats.errors import BuildConfigError
from ...formats.safetensors_io import SafetensorsFile
from ...formats.torch_layout import DRAFT_TO_TARGET, DRAFT_VOCAB_LAYOUT_VERSION, LAYOUT_VERSION, MODEL_FILE, layer_file
from .base import Compiled

TITLE = "PyTorch"
DEVICE = "cuda"  # where its engines are meant to run (a CPU runs float32 engines, for checking them)
DEFAULT_LOWERING = "torch"  # not a graph lowering (plugins/): the executor's own forward
LOWERINGS = ("torch",)
TREE_ATTENTION = True  # the attention kernel takes a per-row mask of the call's tokens
NETWORK = "torch"
KV_LAYOUT = "bnsh"  # [slots, kv_heads, kv_capacity, head_dim]: one (slot, head)'s positions contiguous, as attention reads them
OPTIONS: dict[str, str] = {}
NOTICE = None


def host_problem() -> str | None:
    return None  # numpy writes the engine: nothing beyond the build extra


def auto_note() -> str | None:
    return None


def check_options(options: dict[str, Any]) -> None:
    pass


def refusals(build: BuildConfig) -> list[str]:
    problems = []
    if build.quantization == "fp8" or build.fp8_activations != "none":
        problems.append("the torch backend has no FP8 path yet: build a float checkpoint with --qformat none, int8_wo or int4_wo "
                        "(--qformat none dequantizes an FP8 checkpoint)")
    return problems


def check_build(build: BuildConfig, options: dict[str, Any]) -> None:
    pass  # every speculative mode builds (a P-EAGLE module's placeholder rows: formats/torch_layout.py)


def compile_engine(out_dir: Path, network_file: str, build: BuildConfig, model: ModelConfig, options: dict[str, Any],
                   say: Callable[[str], None]) -> Compiled:
    """Nothing to compile (the kernels compile for the GPU that runs the engine, at its first load): check the files."""
    missing = [name for name in (MODEL_FILE, *map(layer_file, range(model.num_layers))) if not (out_dir / name).is_file()]
    if missing:
        raise BuildConfigError(f"the torch engine in {out_dir} lacks {', '.join(missing)}: the build did not finish writing it.")
    draft_vocab = DRAFT_TO_TARGET in SafetensorsFile(out_dir / MODEL_FILE).keys()
    version = DRAFT_VOCAB_LAYOUT_VERSION if draft_vocab else LAYOUT_VERSION
    return Compiled(network_file, extra={"torch": {"layout_version": version}},
                    summary="torch engine: runs on an NVIDIA GPU with --device cuda (Triton kernels, CUDA graphs)"
                            + (", or on a CPU with --device cpu" if build.dtype == "float32" else
                               f"; on a CPU only when built with --dtype float32 (this one is {build.dtype})"))
