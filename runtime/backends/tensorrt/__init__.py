"""The tensorrt backend: a TensorRT plan (rank0.engine) on one NVIDIA GPU (executor.py); hardware/tensorrt.py finds a runtime for it.

Never run on a GPU: written from TensorRT's documented API and tested on GPU-less hosts only (docs/tensorrt.md)."""
