"""The tensorrt backend: a TensorRT plan (rank0.engine) on one NVIDIA GPU (executor.py); host.py finds a runtime for it."""
