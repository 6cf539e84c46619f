"""Draft trees: TensorRT-LLM's ``--medusa_choices`` / ``--eagle_choices`` and tree acceptance.

A tree is a list of paths of top-k indices: ``[[0], [0, 0], [1], [0, 1]]``
has two depth-1 nodes (the drafter's best and second-best guess for the
next token) and, under the best one, its two best continuations. Every
prefix of a path must be a path too (a node's parent is in the tree).

Nodes are ordered by depth, then by their path (TensorRT-LLM sorts them the
same way), so a node's parent always comes before it; ``parents[j]`` is the
index of node j's parent, -1 for a child of the last accepted token (the
root). The target verifies every node in one call (each attends to its
ancestors only: runtime/backends/onnxruntime/cpu.py's tree_mask), and one
path is kept, walked from the root:

    greedy                       the longest path whose every token is the target's argmax (accept_tree_greedy)
    sampled, deterministic nodes the target draws its token at each node and goes on into the child holding it
                                 (accept_tree_token_compare: suffix decoding's trees)
    sampled, drawn children      a sampled request's path indices are its place among the children drawn (the i-th
                                 draw without replacement, not the i-th best); recursive rejection sampling
                                 (accept_tree_rejection_sampling: Medusa, EAGLE-3, P-EAGLE)
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ..formats.config_strings import INT64, shown, shown_value
from ..formats.errors import EngineError, RequestError
from .sampling import RESIDUAL, draw, sibling_test

if TYPE_CHECKING:
    from .backends.base import Executor
    from .sampling import RowDraws, SamplingConfig


@dataclass(frozen=True)
class DraftTree:
    """A static tree of draft slots, in verification order."""

    paths: tuple[tuple[int, ...], ...]  # node j's path of top-k indices from the root
    parents: np.ndarray  # [nodes] parent node index, -1 = the root
    depths: np.ndarray  # [nodes] 1 for the root's children
    ranks: np.ndarray  # [nodes] its top-k index among its parent's candidates (the path's last entry)
    orders: np.ndarray  # [nodes] its place among its parent's children in the tree: a sampled tree's draw it holds (0: the first)

    def __len__(self) -> int:
        return len(self.paths)

    @property
    def depth(self) -> int:
        return int(self.depths.max()) if len(self.paths) else 0

    def top_k(self, depth: int) -> int:
        """How many candidates the tree takes at ``depth`` (1-based): 1 + its largest top-k index there."""
        at = self.ranks[self.depths == depth]
        return int(at.max()) + 1 if len(at) else 0

    @staticmethod
    def chain(length: int) -> DraftTree:
        """A chain of ``length`` best guesses: [[0], [0, 0], ...]."""
        return DraftTree.from_paths([[0] * d for d in range(1, length + 1)])

    @staticmethod
    def from_paths(paths: Sequence[Sequence[int]], what: str = "the draft tree") -> DraftTree:
        clean: set[tuple[int, ...]] = set()
        for p in paths:
            if not isinstance(p, (list, tuple)) or not p or not all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < INT64 for i in p):
                raise RequestError(f"{what}: every path must be a non-empty list of top-k indices >= 0, found {shown_value(p)}.")
            clean.add(tuple(p))
        if len(clean) != len(paths):
            raise RequestError(f"{what}: a path appears twice.")
        missing = sorted({p[:-1] for p in clean if len(p) > 1} - clean)
        if missing:
            raise RequestError(f"{what}: the path {shown_value(list(missing[0]))} is missing, but "
                               f"{shown_value(list(next(p for p in sorted(clean) if p[:-1] == missing[0])))} "
                               "continues it (every prefix of a path must be in the tree).")
        ordered = sorted(clean, key=lambda p: (len(p), p))
        index = {p: j for j, p in enumerate(ordered)}
        parents = np.array([index[p[:-1]] if len(p) > 1 else -1 for p in ordered], np.int64)
        orders = np.zeros(len(ordered), np.int64)
        seen: dict[int, int] = {}  # parent -> children met so far (siblings are adjacent, by rank)
        for j, parent in enumerate(parents.tolist()):
            orders[j] = seen.get(parent, 0)
            seen[parent] = orders[j] + 1
        return DraftTree(tuple(ordered), parents, np.array([len(p) for p in ordered], np.int64),
                         np.array([p[-1] for p in ordered], np.int64), orders)


def parse_choices(text: str | Sequence[Sequence[int]] | None, flag: str = "--medusa_choices") -> DraftTree | None:
    """TensorRT-LLM's choices string (a JSON list of paths, e.g. "[[0], [0, 0], [1]]") -> a DraftTree; None -> None."""
    if text is None:
        return None
    if isinstance(text, str):
        try:
            paths = json.loads(text)
        except json.JSONDecodeError as err:
            raise RequestError(f"{flag} {shown(text)} is not a JSON list of paths ({err.msg}); "
                               "expected e.g. \"[[0], [0, 0], [1], [0, 1]]\".") from None
        except RecursionError:  # json nests by recursion: a path is a list of numbers, never that deep
            raise RequestError(f"{flag} {shown(text)} nests lists too deeply; "
                               "expected a list of paths, e.g. \"[[0], [0, 0], [1], [0, 1]]\".") from None
    else:
        paths = [list(p) for p in text]
    if not isinstance(paths, list) or not paths:
        raise RequestError(f"{flag} must be a non-empty list of paths, e.g. \"[[0], [0, 0], [1], [0, 1]]\"; found {shown_value(text)}.")
    return DraftTree.from_paths(paths, flag)


def accept_tree_greedy(tokens: np.ndarray, parents: np.ndarray, logits) -> tuple[list[int], int]:
    """The longest path of drafts that greedy decoding would have produced.

    tokens: [k] the nodes' tokens; parents: [k] (-1 = root); logits: [k + 1, vocab] (or runtime/logits.py's Rows:
    each node's row processed with its path as history), row 0 the root's (the last accepted token), row j + 1
    node j's. Returns (accepted node indices, root first, and the target's token after the last of them: the
    bonus token, or the correction at the first mismatch).
    """
    from .logits import as_rows

    rows = as_rows(logits)
    if rows.plain:  # every row's argmax at once
        picks = rows.raw.argmax(axis=-1)  # [k + 1]
        return _walk(tokens, parents, lambda row, path: int(picks[row]))
    return _walk(tokens, parents, lambda row, path: int(np.argmax(rows.logits(row, path))))


def accept_tree_token_compare(tokens: np.ndarray, parents: np.ndarray, logits, cfg: SamplingConfig,
                               draws: RowDraws) -> tuple[list[int], int]:
    """accept_tree_greedy for a sampled request: at each node reached (the root first) the target's token is drawn from its
    own processed distribution there, given the path so far, and the walk goes on into the child holding that token, if
    any. Every token emitted is a draw from the target's distribution after the tokens before it, whatever the tree held:
    the output is distributed as target-only sampling's (for a deterministic tree, each child is a one-hot draft tried in
    turn: "accept x with probability p(x)", over the node's children at once). A node at depth j draws with output
    position start + j's uniform (``draws``), so the tokens are target-only's with the same seed. Returns what
    accept_tree_greedy does."""
    from .logits import as_rows

    if cfg.greedy:
        return accept_tree_greedy(tokens, parents, logits)
    rows = as_rows(logits)
    return _walk(tokens, parents, lambda row, path: draws.draw(rows.probs(row, cfg, path), len(path)))


def accept_tree_rejection_sampling(tokens: np.ndarray, parents: np.ndarray, draft_probs: np.ndarray, logits, cfg: SamplingConfig,
                                   draws: RowDraws) -> tuple[list[int], int]:
    """Recursive rejection sampling down a tree whose children were drawn (SpecInfer's multi-draft verification, the
    children drawn without replacement as in Recursive Speculative Decoding, Jeon et al. 2024).

    A node's children x_1, x_2, .. were drawn one after another from q without replacement (runtime/sampling.py's
    sample_distinct), so x_i came from q_i: q with x_1..x_{i-1} removed, renormalized. At the node reached, with the
    target's processed distribution p_1 = p there (its path as history): accept x_i with probability
    min(1, p_i(x_i) / q_i(x_i)) and go on into it; else p_{i+1} = normalize(max(0, p_i - q_i)) and try the next child;
    when none is left, draw from the last p_i. Each step is speculative sampling's rule for one draft, so the token
    emitted at every node is distributed as p (a rejected child has no mass left in the residual); a tree with one
    child per node is rejection sampling on a chain.

    tokens, parents: [k] (parents first, each node's children in the order drawn); draft_probs: [k, vocab] node j's q,
    the distribution it and its siblings were drawn from (before any was removed); logits: [k + 1, vocab] or Rows
    (row 0 the root's, row j + 1 node j's). The child tests and the residual's draw take their position's own
    uniforms, a leaf's bonus token target-only's (``draws``). Returns what accept_tree_greedy does."""
    from .logits import as_rows

    if cfg.greedy:
        return accept_tree_greedy(tokens, parents, logits)
    rows = as_rows(logits)
    path: list[int] = []
    history: list[int] = []  # the path's tokens
    node = -1
    while True:
        depth = len(path)
        p = rows.probs(node + 1, cfg, history)  # [vocab]
        children = np.flatnonzero(parents == node)
        if not len(children):  # a leaf: the bonus token, target-only's draw
            return path, draws.draw(p, depth)
        rest = np.array(draft_probs[children[0]], dtype=np.float64)  # q with the children tried so far removed
        kept = None
        for i, child in enumerate(children.tolist()):
            total = rest.sum()
            if total <= 0:  # (children are drawn from q: none is left without mass, but never divide by 0)
                break
            q, x = rest / total, int(tokens[child])
            if q[x] > 0 and draws.uniform(depth, sibling_test(i)) < min(1.0, p[x] / q[x]):
                kept = child
                break
            residual = np.maximum(p - q, 0.0)
            mass = residual.sum()
            if mass > 0:  # (0 only where p and q agree to rounding: then p is its own residual)
                p = residual / mass
            rest[x] = 0.0
        if kept is None:
            return path, draw(p, draws.uniform(depth, RESIDUAL))
        path.append(kept)
        history.append(int(tokens[kept]))
        node = kept


def _walk(tokens: np.ndarray, parents: np.ndarray, pick) -> tuple[list[int], int]:
    """From the root down: the target's token at each node reached, pick(its row, the path's tokens so far), and on into
    the child holding it while one does (a row is read only when the walk reaches it). (path, the last pick)."""
    path: list[int] = []
    history: list[int] = []  # the path's tokens, grown as the walk goes (not rebuilt at every node)
    node = -1
    while True:
        want = pick(node + 1, history)
        match = np.flatnonzero((parents == node) & (tokens == want))
        if not len(match):
            return path, want
        node = int(match[0])
        path.append(node)
        history.append(want)


def top_k(logits: np.ndarray, k: int) -> np.ndarray:
    """The k best token ids of logits [vocab], best first (ties: the lower id, as argmax)."""
    if k == 1:
        return np.array([int(logits.argmax())], np.int64)
    part = np.argpartition(-logits, k - 1)[:k]
    return part[np.lexsort((part, -logits[part]))].astype(np.int64)


def tree_draft(tree: DraftTree, k: int, candidates) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The first k nodes of ``tree`` (a prefix of its order is a tree) as a Draft's (tokens, parents, depths), each
    [min(k, nodes)], filled from ``candidates(depth, top) -> [top]``, the best tokens at that depth (Medusa: one list
    per depth, whatever the parent)."""
    n = min(k, len(tree))
    ranks, depths = tree.ranks[:n], tree.depths[:n]
    per_depth = {d: candidates(d, tree.top_k(d)) for d in np.unique(depths).tolist()}
    tokens = np.array([per_depth[int(d)][int(i)] for d, i in zip(depths, ranks, strict=True)], np.int64)
    return tokens, tree.parents[:n].copy(), depths.copy()


def check_nodes(tree: DraftTree, max_draft_len: int, flag: str, engine) -> None:
    """At most the engine's max_draft_len nodes: what it verifies per step (baked in at build time)."""
    if len(tree) > max_draft_len:
        raise EngineError(f"{flag} has {len(tree)} nodes, more than {engine}'s max_draft_len={max_draft_len} "
                          "(the nodes it verifies per step, baked in at build time). Use a smaller tree or rebuild with --max_draft_len "
                          f"{len(tree)}.")


def check_tree(tree: DraftTree, target: Executor, flag: str, max_depth: int | None = None, depth_what: str = "") -> None:
    """A tree the target executor can verify: tree attention, at most max_draft_len nodes, ranks within the
    vocabulary, not deeper than ``max_depth``."""
    if not target.tree_attention:
        raise EngineError(f"{flag}: the target engine {target.engine.path} has no tree attention (it verifies chains only); "
                          "rebuild it with --speculative_decoding_mode medusa or eagle.")
    check_nodes(tree, target.build.max_draft_len, flag, "the target engine")
    if int(tree.ranks.max()) >= target.vocab_size:
        raise EngineError(f"{flag} asks for the {int(tree.ranks.max()) + 1}-th best token, more than the vocabulary's {target.vocab_size}.")
    if max_depth is not None and tree.depth > max_depth:
        raise EngineError(f"{flag} is {tree.depth} deep; {depth_what} draft at most {max_depth} tokens ahead.")
