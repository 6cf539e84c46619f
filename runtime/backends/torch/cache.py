"""The torch executor's KV cache: one device tensor for every layer's K and V, a scratch row, lengths on the host.

    kv  [layers, 2 (K, V), num_slots + 1, kv_heads, kv_capacity, head_dim] in the engine's dtype

Slot ``num_slots`` is scratch: the padding rows of a CUDA graph's batch bucket read and write it, so a bucket wider
than the call never touches a running request's row. Moving a slot (copy_slot) or an accepted tree path
(compact_slot) is one indexed copy over every layer at once, queued on the device's stream: the next step, queued
after it, reads the moved positions; nothing waits on the host.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from ....formats.errors import EngineError
from ...kv_cache import KVCache


class TorchKVCache(KVCache):
    def __init__(self, owner, num_slots: int, num_layers: int, kv_heads: int, capacity: int, head_dim: int, max_seq_len: int,
                 dtype: torch.dtype, device: torch.device):
        super().__init__(num_layers, num_slots, kv_heads, capacity, head_dim, max_seq_len, "bnsh", storage=False)
        self.owner = owner  # the executor that made it: only its forward() may use it
        shape = (num_layers, 2, num_slots + 1, kv_heads, capacity, head_dim)
        try:
            self.kv = torch.zeros(shape, dtype=dtype, device=device)
        except (torch.OutOfMemoryError, RuntimeError) as err:  # RuntimeError: a host that cannot allocate it
            gib = int(np.prod(shape)) * torch.empty((), dtype=dtype).element_size() / 2**30
            raise EngineError(f"a KV cache of {list(shape)} {str(dtype).removeprefix('torch.')} ({gib:.1f} GiB) cannot be allocated on {device}: "
                              "lower max_seq_len or max_batch_size (rebuild the engine), "
                              f"or free memory ({str(err).splitlines()[0][:120]}).") from None
        self.scratch = num_slots
        self.graphs: dict[tuple, object] = {}  # (bucket rows, width, logit rows, tree) -> graphs.StepGraph on this cache
        self.host_outputs = None  # graphs.GraphOutputs: pinned host buffers the graphs' outputs come back into

    def copy_slot(self, src: int, dst: int) -> None:
        n = int(self.lengths[src])
        if src != dst and n:
            self.kv[:, :, dst, :, :n] = self.kv[:, :, src, :, :n]
        self.lengths[dst] = n

    def clear_slot(self, slot: int) -> None:
        self.kv[:, :, slot] = 0
        self.lengths[slot] = 0

    def compact(self, slot: int, start: int, keep: Sequence[int]) -> None:
        """Positions start + keep[i] -> start + i (keep ascending, keep[0] = 0); the slot's length becomes start + len(keep)."""
        keep = np.asarray(keep, np.int64)
        n = len(keep)
        if n == 0 or keep[0] != 0 or (np.diff(keep) <= 0).any() or start + int(keep[-1]) >= self.capacity:
            raise ValueError(f"cannot compact slot {slot} at {start} with path {keep.tolist()}")
        if (keep != np.arange(n)).any():
            src = torch.from_numpy(start + keep).to(self.kv.device, non_blocking=True)
            row = self.kv[:, :, slot]  # [layers, 2, kv_heads, capacity, head_dim], a view
            row[:, :, :, start : start + n] = row.index_select(3, src)  # the gather is a copy: sources read before written
        self.lengths[slot] = start + n
