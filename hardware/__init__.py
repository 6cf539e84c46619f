"""What this machine has, asked the same way by the builder, the trainer and the runtime.

    cpu.py          usable CPUs, a thread count checked against them, physical memory
    cpu_kernels.py  specdec's int4/int8 CPU kernels compiled from kernels/ with the system C compiler, cached per user
    tensorrt.py     TensorRT's runtime modules and the CUDA runtime: which plans this host can run, on which GPU

It stands on formats/ (errors) and imports nothing else of specdec.
"""
