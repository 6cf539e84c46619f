"""Checkpoint and limit checks that run before any graph is built.

Every tensor the network will read is checked against what config.json implies
(shape, dtype, finiteness), and limits that could never be allocated are
refused with the memory they would need: one clear line, nothing written.
"""

from __future__ import annotations

from ..runtime.engine_format import BuildConfig, ModelConfig


def check_memory_limits(model: ModelConfig, build: BuildConfig) -> None:
    """Refuse max_seq_len / max_batch_size whose KV cache could never be allocated."""


def validate_checkpoint(ckpt, model: ModelConfig, build: BuildConfig, convention, allow_nonfinite: bool = False) -> None:
    """Shapes, dtypes and finiteness of every tensor the network reads, before it is built."""
