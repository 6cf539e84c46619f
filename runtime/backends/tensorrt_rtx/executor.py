"""Run a tensorrt_rtx engine on an RTX GPU: ONNX Runtime with NvTensorRTRTXExecutionProvider on its EPContext model.

**Never run**: no RTX GPU was available (docs/tensorrt.md#tensorrt-for-rtx).
What is checked on CPU: the refusals below, and that the ONNX Runtime calls used
exist in the installed onnxruntime.

The engine directory holds one EPContext model per target SM (built by
``specdec-build --backend tensorrt_rtx``); the one of this GPU's SM is loaded,
so the provider deserializes the prebuilt engine instead of building one. The
rest is the CUDA executor's (``onnxruntime/cuda.py: CudaExecutor``): one device buffer
per (layer, K|V) bound as both ``past_*`` and ``present_*`` (TensorRT's in-place
KV-cache update), per-step inputs in one device buffer, only the asked logit
rows copied back. What differs: the session, the device copies through the
provider's own CUDA runtime, and each call shape names the engine's optimization
profile (``nv_profile_index``): generation when the call fits it, else context.

Before anything is loaded (``host.check_rtx_host``) one line refuses a host
without the NVIDIA driver, a GPU whose SM the engine was not built for (an
H100 is sm90, which TensorRT for RTX does not run), and a provider bundling
another TensorRT-RTX release than the one that built the engine.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ....formats.engine_format import EngineDir
from ....formats.errors import DeviceError, EngineError
from ..base import Placement
from ..onnxruntime.cuda import CudaExecutor
from ..onnxruntime.cuda_host import Cudart
from ..tensorrt.executor import choose_profile
from .host import EP_NAME, check_rtx_host, preload_bundled_cudart, rtx_gpu_count

PROFILE_RUN_KEY = "nv_profile_index"  # the provider's run option (tensorrt_rtx_provider_options.h)
_registered: set[str] = set()  # provider libraries registered in this process (ONNX Runtime refuses a second time)


# -- the Backend protocol (runtime/backends/base.py) --------------------------------------
def make_executor(engine: EngineDir, placement: Placement) -> RtxExecutor:
    return RtxExecutor(engine, device=placement.index)  # needs an RTX GPU, its driver and the provider: refused in one line otherwise


def device_count() -> int:
    """GPUs the NVIDIA driver sees (asked through libcuda.so.1); a one-line DeviceError on a host without the driver."""
    return rtx_gpu_count()


def check_placement(engines: Sequence[EngineDir], devices: Sequence[int]) -> None:
    """Nothing measured up front: as on the CUDA executor, ONNX Runtime's session reports what does not fit when it opens."""


def check_engine(engine: EngineDir) -> None:
    build, where = engine.config.build, str(engine.path)
    if build.backend != "tensorrt_rtx":
        raise EngineError(f"{where} is a {build.backend} engine; the TensorRT-RTX executor runs tensorrt_rtx engines.")
    if "tensorrt_rtx" not in engine.config.extra:
        raise EngineError(f"{where}: config.json lacks extra.tensorrt_rtx (its engines per SM); rebuild it with this specdec-build.")


def rtx_session(ort, network_path: str, device: int, package) -> object:
    """An InferenceSession of the EPContext model on GPU ``device`` through the TensorRT-RTX provider."""
    library = package.get_library_path()
    if library not in _registered:
        ort.register_execution_provider_library(EP_NAME, library)
        _registered.add(library)
    devices = [d for d in ort.get_ep_devices() if d.ep_name == EP_NAME]
    chosen = [d for d in devices if d.ep_options.get("device_id") == str(device)] or devices[device : device + 1]
    if not chosen:
        raise DeviceError(f"the TensorRT-RTX execution provider offers {len(devices)} GPU(s), not GPU {device}: "
                          "its driver check refused the others (RTX GPUs of compute capability 8.6, 8.9, 12.x, driver 555.85+ / 570+ on RTX 50xx).")
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    opts.add_provider_for_devices(chosen, {})
    return ort.InferenceSession(network_path, sess_options=opts)


class RtxExecutor(CudaExecutor):
    """A tensorrt_rtx engine on one RTX GPU (ONNX Runtime's NvTensorRTRTXExecutionProvider)."""

    tree_attention = False  # tensorrt_rtx builds refuse tree modes: chains only (compact_slot and forward are the CUDA executor's)
    extra_outputs: frozenset[str] = frozenset()  # and so no extra inputs or outputs
    extra_inputs: frozenset[str] = frozenset()

    def __init__(self, engine: EngineDir, device: int = 0, warm_up: bool = True):
        where = str(engine.path)
        check_engine(engine)
        files, package, package_dir = check_rtx_host(engine, device)  # one-line refusals before anything loads
        self.engine, self.model, self.build = engine, engine.config.model, engine.config.build
        self._name, self.vocab_size, self.device_id, self.device = where, self.model.vocab_size, device, f"cuda:{device}"
        self.cuda_graphs = False  # the portable lowering reads the live length on the host
        import onnxruntime as ort

        cudart = preload_bundled_cudart(package_dir)
        self._ort, self._rt = ort, Cudart(str(cudart) if cudart else None)
        network = engine.path / files["network_file"]
        try:
            self.session = rtx_session(ort, str(network), device, package)
        except DeviceError:
            raise
        except Exception as err:  # onnxruntime's own errors are untyped
            raise EngineError(f"ONNX Runtime could not load {network} with {EP_NAME} on GPU {device}: {err}") from err
        self._check_inputs(where)
        self._allocate()
        self._gen_max = max(2, self.build.max_draft_len + 1)  # the generation profile's widest call (trt_onnx.generation_width)
        self._ctx_max = self.build.max_input_len
        self._decode_width, self._next_graph = self._gen_max, 0
        self._steps = np.arange(max(self.build.max_input_len, self.build.kv_capacity), dtype=np.int64)
        if warm_up:
            self._warm_up()  # TensorRT-RTX specialises its kernels on the first runs: paid at load

    def _configure_run(self, run_options, width: int, rows: int) -> None:
        run_options.add_run_config_entry(PROFILE_RUN_KEY, str(choose_profile(width, rows, self._gen_max, self._ctx_max)))
