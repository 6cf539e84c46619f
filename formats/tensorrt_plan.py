"""The names a TensorRT engine directory's plan is written and run under: the builder writes them
(builder/backends/tensorrt.py, trt_onnx.py), the executor reads them (runtime/backends/tensorrt/executor.py)."""

ENGINE_FILE = "rank0.engine"  # the serialized plan of rank 0 (TensorRT-LLM's name)
CONTEXT_PROFILE, GENERATION_PROFILE = 0, 1  # optimization profiles: prompts (wide calls) and decode/verify (narrow calls)
