"""The onnxruntime backend: one engine directory (model.onnx), run on the CPU (cpu.py) or an NVIDIA GPU (cuda.py)."""
