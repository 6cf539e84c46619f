"""Where a small model's attention heads go in its enlargement when the head layout itself changes.

benchmarks/enlarge.py pads every tensor with zeros and keeps the real weights in the leading corner. That is
enough while head_dim and the GQA group (query heads per kv head) stay; real 8B/1B shapes change both (the demo
target: head_dim 32, group 2; Llama-3.1-8B: head_dim 128, group 4). Both changes keep the function:

* **Group G -> G' (G' >= G).** Query head j reads kv head j // G. In the enlargement it goes to index
  (j // G) * G' + j % G, which reads kv head ((j // G) * G' + j % G) // G' = j // G, the same real kv head.
  The other query heads are zero rows: they attend uniformly over their kv head's values (real ones, for the
  slots between real heads) and their o_proj columns are zero, so they add exact zeros.
* **head_dim d -> D (D >= d, both even).** Rotary rotates the pairs (t, t + d/2) of a head at the frequency
  theta^(-2t/d). In the enlargement the real dims sit at t and D/2 + t (t < d/2), a pair of the D-wide rotation,
  whose frequency is theta'^(-2t/D): equal for theta' = theta^(D/d). The new dims are zero in q, k and v, so
  they add nothing to scores or values. Scores are scaled by 1/sqrt(D) instead of 1/sqrt(d): the real query rows
  are multiplied by sqrt(D/d), exact in every float format when D/d is a power of 4 (the 8B preset: 4), one
  rounding of the stored weights otherwise (the 1B draft preset: D/d = 2). RoPE's frequencies themselves are
  computed from theta' in float32 (by transformers and by the builder), so they match to float rounding.

Models whose per-head norms (Qwen3's q_norm/k_norm) or rotary scheme (longrope's per-dim factors, partial
rotary) depend on head_dim are refused when head_dim grows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

ROPE_TYPES_THAT_SCALE = (None, "default", "linear", "llama3")  # inv_freq depends on theta^(-2t/dim) alone


@dataclass(frozen=True)
class HeadLayout:
    """Index maps of the real q/kv features in the enlarged q/kv axes, and the query scale."""

    q: np.ndarray  # [nh * d] int64: where real query feature f goes in the enlarged [NH * D] axis
    kv: np.ndarray  # [kvh * d] int64: likewise in [KVH * D]
    q_scale: float  # sqrt(D / d): real query rows are multiplied by it
    theta_power: float  # D / d: rope_theta' = rope_theta ** theta_power

    @property
    def identity(self) -> bool:
        return self.theta_power == 1.0 and bool((self.q == np.arange(self.q.size)).all())


def head_layout(nh: int, kvh: int, d: int, NH: int, KVH: int, D: int) -> HeadLayout:
    """The maps for nh/kvh heads of width d enlarged to NH/KVH heads of width D (checked by check_heads)."""
    group, new_group = nh // kvh, NH // KVH
    half = d // 2
    dims = np.concatenate([np.arange(half), D // 2 + np.arange(d - half)])  # rotate_half pairs stay pairs
    heads = (np.arange(nh) // group) * new_group + np.arange(nh) % group
    q = (heads[:, None] * D + dims[None, :]).reshape(-1)
    kv = (np.arange(kvh)[:, None] * D + dims[None, :]).reshape(-1)
    return HeadLayout(q=q.astype(np.int64), kv=kv.astype(np.int64), q_scale=math.sqrt(D / d), theta_power=D / d)


def check_heads(old: dict[str, Any], nh: int, kvh: int, d: int, NH: int, KVH: int, D: int) -> list[str]:
    """Why these head counts/widths cannot hold the source's heads (empty: they can). old: the source config.json."""
    problems = []
    if KVH < 1 or NH % KVH:
        problems.append(f"num_heads={NH} must be a multiple of num_kv_heads={KVH}")
    elif NH // KVH < nh // kvh:
        problems.append(f"num_heads/num_kv_heads={NH}/{KVH} (group {NH // KVH}) must keep at least the source's group of {nh // kvh} "
                        f"query heads per kv head ({nh}/{kvh}), so real query heads keep reading real kv heads")
    if D < d:
        problems.append(f"head_dim={D} is smaller than the source's head_dim={d}")
    elif D != d:
        if d % 2 or D % 2:
            problems.append(f"head_dim {d} -> {D}: rotary pairs need even head dims")
        scaling = old.get("rope_parameters") or old.get("rope_scaling") or {}
        kind = scaling.get("rope_type") or scaling.get("type")
        if kind not in ROPE_TYPES_THAT_SCALE:
            problems.append(f"head_dim {d} -> {D}: rope type {kind!r} has per-dimension factors; only "
                            f"{', '.join(map(str, ROPE_TYPES_THAT_SCALE[1:]))} can be widened")
        if float(scaling.get("partial_rotary_factor", old.get("partial_rotary_factor", 1.0)) or 1.0) != 1.0:
            problems.append(f"head_dim {d} -> {D}: partial rotary embeddings cannot be widened")
        if old.get("architectures", [None])[0] == "Qwen3ForCausalLM":
            problems.append(f"head_dim {d} -> {D}: Qwen3's q_norm/k_norm average over head_dim, which would change")
    if NH * D < nh * d or KVH * D < kvh * d:
        problems.append(f"{NH}x{D} query / {KVH}x{D} kv features cannot hold the source's {nh}x{d} / {kvh}x{d}")
    return problems


def widen_rope(cfg: dict[str, Any], power: float) -> None:
    """rope_theta -> rope_theta ** power wherever config.json spells it (rope_theta, rope_scaling, rope_parameters)."""
    if power == 1.0:
        return
    for holder in (cfg, cfg.get("rope_scaling"), cfg.get("rope_parameters")):
        if isinstance(holder, dict) and "rope_theta" in holder:
            holder["rope_theta"] = float(holder["rope_theta"]) ** power
    if not any(isinstance(h, dict) and "rope_theta" in h for h in (cfg, cfg.get("rope_scaling"), cfg.get("rope_parameters"))):
        cfg["rope_theta"] = 10000.0**power  # transformers' default theta, written out


def place(real: np.ndarray, out: np.ndarray, index: list[np.ndarray | None]) -> np.ndarray:
    """Write ``real`` into ``out`` at the given per-axis indices (None: the leading positions)."""
    axes = [np.arange(n) if idx is None else idx for n, idx in zip(real.shape, index, strict=True)]
    out[np.ix_(*axes)] = real
    return out
