"""Rotary position embedding tables, computed the way transformers does.

``cos``/``sin`` are ``[positions, head_dim // 2]`` float32, indexed by
position id; ONNX ``RotaryEmbedding`` (non-interleaved) consumes them.
"""

from __future__ import annotations

import math

import numpy as np

from ..formats.engine_format import ModelConfig
from ..formats.errors import CheckpointError


def inverse_frequencies(cfg: ModelConfig) -> np.ndarray:
    dim = cfg.head_dim
    inv_freq = 1.0 / (cfg.rope_theta ** (np.arange(0, dim, 2, dtype=np.int64).astype(np.float32) / dim))
    inv_freq = inv_freq.astype(np.float32)
    scaling = cfg.rope_scaling or {}
    kind = scaling.get("rope_type")
    if kind == "linear":
        inv_freq = (inv_freq / np.float32(scaling["factor"])).astype(np.float32)
    elif kind == "llama3":
        inv_freq = _llama3(inv_freq, scaling)
    elif kind == "frequency_factors":  # llama.cpp's rope_freqs: theta_i = p * base**(-2i/d) / factors[i]
        inv_freq = (inv_freq / np.asarray(scaling["factors"], np.float32)).astype(np.float32)
    elif kind == "longrope":
        # short_factor only: architectures.py refuses sequences long enough for transformers to switch to long_factor
        shape = np.arange(0, dim, 2, dtype=np.int64).astype(np.float32) / dim
        inv_freq = (1.0 / (np.asarray(scaling["short_factor"], np.float32) * cfg.rope_theta**shape)).astype(np.float32)
    return inv_freq


def _llama3(inv_freq: np.ndarray, s: dict) -> np.ndarray:
    factor = float(s["factor"])
    low, high = float(s["low_freq_factor"]), float(s["high_freq_factor"])
    old_len = float(s["original_max_position_embeddings"])
    low_wavelen, high_wavelen = old_len / low, old_len / high
    wavelen = 2 * math.pi / inv_freq
    scaled = np.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return np.where(medium, smoothed, scaled).astype(np.float32)


def cos_sin_tables(cfg: ModelConfig, num_positions: int) -> tuple[np.ndarray, np.ndarray]:
    """cos, sin: [num_positions, head_dim // 2] float32. Refused if not finite: config.json's numbers can make them
    overflow (rope_theta 5e-324, llama3's high_freq_factor equal to its low_freq_factor), and an engine built on
    NaN rotations emits garbage."""
    with np.errstate(all="ignore"):  # checked below, once, in one line
        inv_freq = inverse_frequencies(cfg)
        freqs = np.arange(num_positions, dtype=np.float32)[:, None] * inv_freq[None, :]
        cos, sin = np.cos(freqs).astype(np.float32), np.sin(freqs).astype(np.float32)
        scaling = cfg.rope_scaling or {}
        if scaling.get("rope_type") == "longrope" and scaling["attention_factor"] != 1.0:  # transformers scales cos and sin
            scale = scaling["attention_factor"]
            cos, sin = (cos * np.float32(scale)).astype(np.float32), (sin * np.float32(scale)).astype(np.float32)
    if not (np.isfinite(cos).all() and np.isfinite(sin).all()):
        from ..formats.config_strings import shown_value

        raise CheckpointError(f"config.json's rope_theta={cfg.rope_theta:g} with rope_scaling {shown_value(cfg.rope_scaling, 120)} gives rotary "
                              "tables that are not finite (NaN or Inf); the model could not run. Fix those fields.")
    return cos, sin
