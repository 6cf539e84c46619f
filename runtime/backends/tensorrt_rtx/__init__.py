"""The tensorrt_rtx backend: a TensorRT-for-RTX engine (EPContext model per SM) on one RTX GPU through ONNX Runtime's
TensorRT-RTX provider (executor.py); host.py checks the driver, the GPU's SM and the provider before anything loads."""
