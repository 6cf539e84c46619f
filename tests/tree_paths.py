"""A draft tree's paths, as the tree tests walk them (tests/builder/test_tree_cached_attention.py,
tests/runtime/test_cached_attention_engine.py)."""

from __future__ import annotations

from collections.abc import Sequence


def path_to(parents: Sequence[int], j: int) -> list[int]:
    """Node j's ancestors and itself, root first (parents[j] < j; -1: a child of the cache's last token)."""
    out = []
    while j >= 0:
        out.append(j)
        j = int(parents[j])
    return out[::-1]
