"""A sampled request's draft tree: each node's children drawn from the drafter's distribution, without replacement.

What Medusa, EAGLE-3 and P-EAGLE share when a sampled request drafts a tree: the distribution a node's children are
drawn from (the drafter's row processed as the target's will be there), and the Draft of the nodes drawn. The target
verifies it by recursive rejection sampling (runtime/tree.py: accept_tree_rejection_sampling), which needs each node's
distribution and its place among its siblings (the order drawn: DraftTree.orders).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from ..logits import Rows
from .base import Draft

if TYPE_CHECKING:
    from ..request import Request
    from ..tree import DraftTree


def draft_distribution(r: Request, row: np.ndarray, path: Sequence[int]) -> np.ndarray:
    """The distribution a sampled request's drafter proposes from at a node: its row [vocab] processed as the target's
    row is there (penalties, bias, grammar with the path's tokens as history; temperature, top-k, top-p): Rows.probs."""
    return Rows(row[None], r.processor).probs(0, r.config.sampling, list(path))


def drawn_tree(tree: DraftTree, tokens: np.ndarray, probs: np.ndarray, drawn: np.ndarray) -> Draft:
    """A sampled request's draft of ``tree``'s first len(tokens) nodes: node j holds tokens[j], one of its parent's draws
    without replacement from probs[j] (its ``orders[j]``-th), where drawn[j] (a distribution with fewer tokens than
    the tree has children there draws fewer): the nodes drawn whose parents were, renumbered."""
    n = len(tokens)
    kept = np.zeros(n, bool)
    for j in range(n):
        parent = int(tree.parents[j])
        kept[j] = drawn[j] and (parent < 0 or kept[parent])
    draft = Draft(tokens.astype(np.int64), probs, tree.parents[:n].copy(), tree.depths[:n].copy(), tree_index=np.arange(n))
    return draft.nodes(np.flatnonzero(kept).tolist())
