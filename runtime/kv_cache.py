"""The KV cache: owned by the runtime, one static-capacity buffer per layer.

The cache has ``num_slots`` rows (at most the engine's max_batch_size); a
running request holds one slot. ``lengths[s]`` is how many tokens of slot s
are in the cache. Positions past it are stale and masked by the network, so
rolling back rejected drafts is setting ``lengths[s]`` back: no tensor is
touched. Tensors are touched only by the executor that owns them.
"""

from __future__ import annotations

import logging
import time
import weakref

import numpy as np

from ..formats.errors import EngineError, RequestError
from ..formats.kv_layout import kv_cache_shape


class KVCache:
    """Host-side bookkeeping of a cache; the host (numpy) storage of the CPU executor."""

    def __init__(self, num_layers: int, num_slots: int, kv_heads: int, capacity: int, head_dim: int, max_seq_len: int, layout: str = "bnsh",
                 storage: bool = True):
        # keys[i], values[i]: [num_slots, kv_heads, capacity, head_dim] (bnsh) or [num_slots, capacity, kv_heads * head_dim] (bsh), float32
        shape = kv_cache_shape(layout, num_slots, kv_heads, capacity, head_dim)
        self.layout = layout
        try:
            self.keys = [np.zeros(shape, np.float32) for _ in range(num_layers)] if storage else []
            self.values = [np.zeros(shape, np.float32) for _ in range(num_layers)] if storage else []
        except (MemoryError, ValueError):  # ValueError: a shape past what numpy can index at all
            raise EngineError(f"a KV cache of {num_layers} layers x {list(shape)} float32 cannot be allocated here: lower max_seq_len or "
                              "max_batch_size (rebuild the engine).") from None
        if storage:
            _HOST_CACHES.add(self)
        self.lengths = np.zeros(num_slots, np.int64)
        # the same lengths, read and written as Python ints: no numpy call, which after a model call costs microseconds (the
        # call has evicted numpy's code from the CPU's caches) where the loop reads or sets one length a round
        self.lengths_view = memoryview(self.lengths)
        self.capacity = capacity
        self.max_seq_len = max_seq_len
        self.version = 0  # bumped whenever the buffers are replaced (executors rebind)

    @property
    def num_slots(self) -> int:
        return len(self.lengths)

    @property
    def host_bytes(self) -> int:
        """Bytes of the numpy storage (0 for a cache whose tensors live elsewhere)."""
        return sum(buf.nbytes for buf in (*self.keys, *self.values))

    def commit(self) -> bool:
        """Write every buffer once, before any request: numpy's zeros are mapped by the OS on first write, which
        otherwise happens inside model calls, a slot at a time (measured: the first 16-stream burst on a fresh
        server took 14.7 s against 10.7 s once its slots had been written; committed at load, 9.6 s). A cache that
        holds tokens in any slot is left alone (False): its rows are someone's."""
        if self.lengths.any():
            return False
        for buf in (*self.keys, *self.values):
            buf.fill(0.0)
        return True

    def rollback(self, slot: int, length: int) -> None:
        """Forget everything of ``slot`` at positions >= ``length``."""
        if not 0 <= length <= self.lengths_view[slot]:
            raise ValueError(f"cannot roll slot {slot} back to {length}: it holds {self.lengths_view[slot]} tokens")
        self.lengths_view[slot] = length

    def copy_host_slot(self, src: int, dst: int) -> None:
        """Copy the live part of slot ``src`` into slot ``dst`` (numpy storage)."""
        n = int(self.lengths[src])
        for buf in (*self.keys, *self.values):
            if self.layout == "bnsh":
                buf[dst, :, :n] = buf[src, :, :n]
            else:
                buf[dst, :n] = buf[src, :n]
        self.lengths[dst] = n

    def clear_host_slot(self, slot: int) -> None:
        """Zero every position of ``slot`` (numpy storage) and set its length to 0."""
        for buf in (*self.keys, *self.values):
            buf[slot] = 0
        self.lengths[slot] = 0

    def check_prefix_copy(self, src: KVCache, src_slot: int, length: int) -> None:
        """Refuse copying positions 0..length-1 of ``src``'s slot ``src_slot`` into this cache when ``src`` does not hold
        them, this cache cannot, or the two lay K/V out differently (every executor's copy_prefix checks here)."""
        if not 0 <= length <= min(int(src.lengths[src_slot]), self.capacity) or src.layout != self.layout:
            raise ValueError(f"cannot copy {length} positions of slot {src_slot} (it holds {int(src.lengths[src_slot])})")

    def copy_host_prefix(self, src: KVCache, src_slot: int, dst_slot: int, length: int) -> None:
        """Copy positions 0..length-1 of ``src``'s slot ``src_slot`` into this cache's slot ``dst_slot`` and set its
        length (numpy storage; ``src`` may be this cache or a prefix pool of the same engine)."""
        self.check_prefix_copy(src, src_slot, length)
        for mine, theirs in zip((*self.keys, *self.values), (*src.keys, *src.values), strict=True):
            if self.layout == "bnsh":
                mine[dst_slot, :, :length] = theirs[src_slot, :, :length]
            else:
                mine[dst_slot, :length] = theirs[src_slot, :length]
        self.lengths[dst_slot] = length

    def compact_host_slot(self, slot: int, start: int, keep) -> None:
        """Move the K/V at slots start + keep[i] to start + i (keep ascending, keep[0] = 0: a tree's accepted path) and
        set the slot's length to start + len(keep). Sources are never overwritten before they are read (keep[i] >= i)."""
        keep = np.asarray(keep, np.int64)
        n = len(keep)
        if n == 0 or keep[0] != 0 or (np.diff(keep) <= 0).any() or start + int(keep[-1]) >= self.capacity:
            raise ValueError(f"cannot compact slot {slot} at {start} with path {keep.tolist()}")
        if (keep != np.arange(n)).any():
            src = start + keep
            for buf in (*self.keys, *self.values):
                if self.layout == "bnsh":  # buf[slot] first: numpy puts a split advanced index's axis first
                    buf[slot][:, start : start + n] = buf[slot][:, src]
                else:
                    buf[slot, start : start + n] = buf[slot, src]
        self.lengths[slot] = start + n

    def check_room(self, num_new: np.ndarray, padded_len: int, first_slot: int = 0, what: str = "the engine") -> None:
        """Every row of the range must stay within max_seq_len, and padded writes within capacity."""
        lengths = self.lengths[first_slot : first_slot + len(num_new)].tolist()  # a few rows, checked every step: Python ints
        for row, (length, grow) in enumerate(zip(lengths, num_new.tolist(), strict=True)):
            if length + grow > self.max_seq_len:
                raise RequestError(
                    f"slot {first_slot + row} would hold {length + grow} tokens, more than {what}'s max_seq_len={self.max_seq_len}. "
                    "Shorten the request or rebuild the engine with a larger --max_seq_len."
                )
        if lengths and max(lengths) + padded_len > self.capacity:
            raise RequestError(f"a step of {padded_len} tokens would write past {what}'s KV capacity {self.capacity}.")


_log = logging.getLogger(__name__)
_HOST_CACHES: weakref.WeakSet[KVCache] = weakref.WeakSet()  # every cache with numpy storage, for commit_host_caches


def _memory_available() -> int | None:
    """MemAvailable from /proc/meminfo, in bytes (None where there is none)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def commit_host_caches(mode: str = "auto", caches: list[KVCache] | None = None) -> str | None:
    """Commit the memory of the host KV caches (default: every live one: the target's, the prefix pool's, the
    drafts') before serving. ``mode``: "on"; "off"; "auto" = on when they take at most half the memory available now
    (else they stay mapped as they fill, as without this). Logs and returns what was done (None: nothing to do)."""
    caches = [c for c in (list(_HOST_CACHES) if caches is None else caches) if not c.lengths.any()]
    total = sum(c.host_bytes for c in caches)
    if mode == "off" or total == 0:
        return None
    gib = total / 2**30
    available = _memory_available()
    if mode == "auto" and (available is None or total > available // 2):
        where = f"more than half of the {available / 2**30:.1f} GiB available" if available else "the memory available is unknown"
        note = f"KV caches ({gib:.2f} GiB) not committed at load: {where}; they are mapped as they fill (--preallocate_kv on commits them)"
        _log.warning(note)
        return note
    start = time.perf_counter()
    for cache in caches:
        cache.commit()
    note = f"KV caches committed at load: {gib:.2f} GiB in {time.perf_counter() - start:.1f} s"
    _log.info(note)
    return note
