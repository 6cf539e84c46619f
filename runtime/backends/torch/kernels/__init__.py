"""specdec's Triton kernels for the torch executor, each beside the few lines of torch that define what it computes.

    norm.py       rmsnorm / add_rmsnorm: the residual add and the next RMSNorm in one pass (the add may sum a split
                  GEMM's float32 partials itself: gemm.Partials)
    rotary.py     rope_append: rotary on q and k, and k, v written into the KV cache at each row's positions
    silu.py       silu_mul: SiLU(gate) * up from the joined gate|up projection
    attention.py  attention for one-token decode, chain and tree verification, and prefill: ragged rows, a tree mask,
                  each row's own cache length read on the device (no host value: CUDA graphs replay it)
    gemm.py       linear layers: dense and weight-only int8/int4 (W8A16/W4A16), each layer on the tile of its shape
                  for every row count, so a row's result never depends on how many rows the call has

The GPU path (runtime/backends/torch/ops.py: TritonOps) launches the kernels; the CPU path runs the references
(ReferenceOps). tests/runtime/test_torch_kernels.py checks each kernel against its reference under the Triton
interpreter (TRITON_INTERPRET=1) on a CPU. _triton.py decorates a kernel at its first launch, so a host without
Triton imports the references, and the interpreter setting is read when a kernel first runs.
"""
