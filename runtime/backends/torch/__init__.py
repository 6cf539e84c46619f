"""The torch backend's executor: specdec's own forward in torch, Triton kernels and CUDA graphs on NVIDIA GPUs.

    cpu.py, cuda.py   the Backend modules the registry names (runtime/backends/__init__.py)
    host.py           what a host needs (torch, a GPU, the engine's dtype), refused in one line
    executor.py       TorchExecutor: the Executor protocol (new_cache, forward, copy_slot, compact_slot)
    weights.py        the engine's tensors (formats/torch_layout.py) on the device
    model.py          the forward, written once: prefill, decode, chain and tree verification
    ops.py            its operations: ReferenceOps (torch, the CPU path) or TritonOps (kernels/, the GPU path)
    cache.py          the KV cache: one device tensor, a scratch slot for padding rows
    graphs.py         CUDA graphs per (batch bucket, width) shape and cache
    kernels/          the Triton kernels, each beside its torch reference

Nothing here is imported unless a torch engine is opened (the registry imports cpu.py / cuda.py then), and torch
itself only when TorchExecutor opens an engine: a host without torch reads this package and refuses such an engine
in one line.
"""
