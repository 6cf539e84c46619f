"""The KV cache: owned by the runtime, one static-capacity buffer per layer.

``lengths[b]`` is how many tokens of row b are in the cache. Slots past it
are stale and masked by the network, so rolling back rejected drafts is
setting ``lengths[b]`` back: no tensor is touched.
"""

from __future__ import annotations

import numpy as np

from .errors import RequestError


class KVCache:
    def __init__(self, num_layers: int, batch: int, kv_heads: int, capacity: int, head_dim: int, max_seq_len: int, layout: str = "bnsh"):
        # keys[i], values[i]: [batch, kv_heads, capacity, head_dim] (bnsh) or [batch, capacity, kv_heads * head_dim] (bsh), float32
        if layout not in ("bnsh", "bsh"):
            raise RequestError(f"unknown KV cache layout {layout!r} (engine config build.kv_layout); expected bnsh or bsh.")
        shape = (batch, kv_heads, capacity, head_dim) if layout == "bnsh" else (batch, capacity, kv_heads * head_dim)
        self.keys = [np.zeros(shape, np.float32) for _ in range(num_layers)]
        self.values = [np.zeros(shape, np.float32) for _ in range(num_layers)]
        self.lengths = np.zeros(batch, np.int64)
        self.capacity = capacity
        self.max_seq_len = max_seq_len
        self.version = 0  # bumped whenever the buffers are replaced (executors rebind)

    @property
    def batch_size(self) -> int:
        return len(self.lengths)

    def rollback(self, row: int, length: int) -> None:
        """Forget everything of ``row`` at positions >= ``length``."""
        if not 0 <= length <= self.lengths[row]:
            raise ValueError(f"cannot roll row {row} back to {length}: it holds {self.lengths[row]} tokens")
        self.lengths[row] = length

    def keep_rows(self, rows: np.ndarray | list[int]) -> None:
        """Drop the other rows (finished sequences leave the batch)."""
        rows = np.asarray(rows, dtype=np.int64)
        self.keys = [np.ascontiguousarray(k[rows]) for k in self.keys]
        self.values = [np.ascontiguousarray(v[rows]) for v in self.values]
        self.lengths = self.lengths[rows].copy()
        self.version += 1

    def check_room(self, num_new: np.ndarray, padded_len: int) -> None:
        """Every row must stay within max_seq_len, and padded writes within capacity."""
        after = self.lengths + num_new
        if (after > self.max_seq_len).any():
            row = int(np.argmax(after > self.max_seq_len))
            raise RequestError(
                f"row {row} would hold {int(after[row])} tokens, more than the engine's max_seq_len={self.max_seq_len}. "
                "Shorten the request or rebuild the engine with a larger --max_seq_len."
            )
        if self.batch_size and int((self.lengths + padded_len).max()) > self.capacity:
            raise RequestError(f"a step of {padded_len} tokens would write past the KV capacity {self.capacity}.")
