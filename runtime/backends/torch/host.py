"""What a host needs to run a torch engine, checked before anything is allocated, each refusal in one line."""

from __future__ import annotations

from ....formats.engine_format import EngineDir
from ....formats.errors import DeviceError, EngineError
from ....formats.torch_layout import READ_VERSIONS

DTYPES = ("float32", "float16", "bfloat16")
# SPECDEC_TORCH_DENSE (ops.TritonOps): each layer's tile (16 rows for small calls where exact); the same with split layers' sums
# in a kernel of their own; each layer's shape tile for every call; one 16 x 32 tile everywhere; torch's matmul
DENSE = ("stable", "unfused", "shape", "fixed", "cublas")


def require_torch(what: str):
    """The torch module, or an EngineError saying how to get it (torch is not a dependency of specdec's runtime)."""
    try:
        import torch
    except ImportError as err:
        raise EngineError(f"{what} needs torch, which is not installed ({err}): pip install torch (a CUDA build on an NVIDIA GPU host; "
                          "it brings Triton). The onnxruntime backend runs without it.") from None
    return torch


def torch_dtype(torch, name: str):
    return {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}[name]


def check_engine(engine: EngineDir, kind: str) -> None:
    """Refuse an engine this executor cannot run on a device of ``kind``, from its config alone."""
    build, where = engine.config.build, engine.path
    if build.backend != "torch":
        raise EngineError(f"{where} is a {build.backend} engine; the torch executor runs engines built with --backend torch.")
    version = (engine.config.extra.get("torch") or {}).get("layout_version")
    if version not in READ_VERSIONS:
        raise EngineError(f"{where} holds torch engine layout {version}, this specdec reads layouts {', '.join(map(str, READ_VERSIONS))}: "
                          "rebuild it with this specdec-build.")
    if build.dtype not in DTYPES:
        raise EngineError(f"{where} has dtype {build.dtype!r}; the torch executor runs {', '.join(DTYPES)}.")
    if kind == "cpu" and build.dtype != "float32":
        raise EngineError(f"{where} is a {build.dtype} torch engine: on a CPU the torch backend runs float32 engines only (what CI checks it in). "
                          "Run it with --device cuda, or rebuild it with --dtype float32.")


def cuda_device(torch, index: int, engine: EngineDir):
    """torch.device('cuda:index'), after checking the GPU exists and computes the engine's dtype."""
    if not torch.cuda.is_available():
        raise DeviceError(f"{engine.path} on --device cuda: torch {torch.__version__} sees no CUDA GPU "
                          f"({'a CPU-only build of torch' if torch.version.cuda is None else 'check the driver and CUDA_VISIBLE_DEVICES'}).")
    count = torch.cuda.device_count()
    if not 0 <= index < count:
        raise DeviceError(f"cuda device {index} does not exist (this host has {count} cuda device(s): {list(range(count))}).")
    if engine.config.build.dtype == "bfloat16" and not torch.cuda.is_bf16_supported():
        raise EngineError(f"{engine.path} is a bfloat16 engine and GPU {index} ({torch.cuda.get_device_name(index)}) has no bfloat16 arithmetic "
                          "(compute capability 8.0 or newer needed): rebuild it with --dtype float16.")
    return torch.device("cuda", index)


def cuda_count() -> int:
    """CUDA GPUs torch sees (0 without torch or a GPU: device_count's contract is a number, the refusal comes on opening)."""
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0
