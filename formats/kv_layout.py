"""The KV cache's layout and size, as the engine's network declares its cache inputs: what the builder sizes and the
runtime allocates (runtime/kv_cache.py)."""

from __future__ import annotations

from .errors import RequestError

KV_LAYOUTS = ("bnsh", "bsh")  # [slots, kv_heads, capacity, head_dim] | [slots, capacity, kv_heads * head_dim]


def kv_cache_shape(layout: str, num_slots: int, kv_heads: int, capacity: int, head_dim: int) -> tuple[int, ...]:
    """One layer's key (or value) buffer: [num_slots, kv_heads, capacity, head_dim] (bnsh) or
    [num_slots, capacity, kv_heads * head_dim] (bsh)."""
    if layout not in KV_LAYOUTS:
        raise RequestError(f"unknown KV cache layout {layout!r} (engine config build.kv_layout); expected bnsh or bsh.")
    return (num_slots, kv_heads, capacity, head_dim) if layout == "bnsh" else (num_slots, capacity, kv_heads * head_dim)


def kv_cache_bytes(model, max_batch_size: int, kv_capacity: int, itemsize: int = 4) -> int:
    """Bytes of an engine's KV cache: keys and values of every layer at static capacity (Python ints: never overflows).

    model: the engine's ModelConfig (num_layers, num_kv_heads, head_dim).
    """
    return 2 * model.num_layers * max_batch_size * kv_capacity * model.num_kv_heads * model.head_dim * itemsize
