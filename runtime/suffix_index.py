"""Suffix decoding's data structure: where a context occurred before, and what followed, by frequency.

Suffix decoding (Oliaro et al. 2024, ArcticInference) keeps a suffix tree
over earlier text whose node counts say how often each continuation of a
context followed it, and drafts the most frequent continuations. The count of
the tree node for a string s is the number of occurrences of s in the text
(suffixes capped at ``max_depth`` tokens). We keep the same counts implicitly:

* ``TokenStore`` holds sequences in one int32 array (a -1 between them) and
  finds, for the last m tokens of a context, every position right after an
  earlier occurrence (m = 1, 2, ... while any remain): numpy compares the
  candidate positions against one more context token per step. A long store
  (the global cache of responses) keeps a sorted index of token pairs so the
  first step is a binary search; the tokens added since its last rebuild are
  scanned directly.
* ``speculate`` expands the occurrences of a matched context into the
  frequency-scored tree ArcticInference drafts: a child's probability is its
  parent's times (occurrences continuing with that token / occurrences of the
  parent), nodes are taken best first while their probability is at least
  ``min_token_prob``, up to a budget of ``max_spec_factor * match length +
  max_spec_offset`` nodes (a longer match earns a deeper draft), and the match
  length with the best score (the sum of the nodes' probabilities: the
  expected number of accepted drafts) wins.

Why not a library: ArcticInference's C++ suffix tree ships as a source
distribution whose build needs torch, CMake and nanobind (it builds vLLM
kernels beside it), which a host that runs engines must not need; the suffix
tree/array packages on PyPI keep no counts, no incremental appends or no
removal. Why not our own explicit tree: in Python its nodes cost ~100 bytes
each and a 2,000-token prompt makes ~48,000 of them (24 suffix lengths per
token) and ~30 ms of inserts, where this store is 4 bytes a token and a
lookup costs tens of microseconds (benchmarks/bench_drafters.py --micro prints
both measurements). The drafts are the same: the counts are the same counts.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

SEPARATOR = -1  # between sequences and past the end: never a token, so no match runs across it


@dataclass
class SuffixDraft:
    """A draft tree in verification order (a node's parent comes before it)."""

    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)  # -1: a child of the context's last token
    probs: list[float] = field(default_factory=list)  # estimated probability that the node is accepted
    match_len: int = 0
    ends: np.ndarray | None = None  # the occurrences it was drawn from (positions after the matched context)

    @property
    def score(self) -> float:
        """The expected number of accepted drafts, by the counts."""
        return float(sum(self.probs))

    def __len__(self) -> int:
        return len(self.tokens)


class TokenStore:
    """Sequences of token ids in one growing array, searchable by context suffix."""

    SCAN_LIMIT = 8192  # tokens appended since the index was built that a lookup may scan before a rebuild

    def __init__(self) -> None:
        self._buf = np.full(1024, SEPARATOR, np.int32)
        self._buf[0] = SEPARATOR  # position 0 is a separator: every token has a predecessor
        self.size = 1
        # pair index: positions i (token pair s[i], s[i + 1]) sorted by (s[i + 1], s[i]); covers i + 1 < indexed
        self._keys = np.zeros(0, np.int64)
        self._pos = np.zeros(0, np.int64)
        self._radix = 1
        self._indexed = 1  # positions below this are in the pair index; the rest are scanned

    @property
    def tokens(self) -> np.ndarray:
        return self._buf[: self.size]

    def __len__(self) -> int:
        return self.size - 1

    @property
    def nbytes(self) -> int:
        return self._buf.nbytes + self._keys.nbytes + self._pos.nbytes

    def append(self, tokens: Sequence[int], end: bool = False, index: bool = True) -> None:
        """Add tokens to the last sequence; ``end`` closes it (the next append starts a new one). ``index=False``:
        no re-sort however long the unindexed tail grows (a caller appending many sequences reindexes once after)."""
        add = np.asarray(tokens, np.int32)
        need = self.size + len(add) + 1
        if need >= len(self._buf):
            grown = np.full(max(2 * len(self._buf), need + 1024), SEPARATOR, np.int32)
            grown[: self.size] = self._buf[: self.size]
            self._buf = grown
        self._buf[self.size : self.size + len(add)] = add
        self.size += len(add)
        if end:
            self._buf[self.size] = SEPARATOR
            self.size += 1
        if index and self.size - self._indexed > max(self.SCAN_LIMIT, self._indexed // 4):
            self.reindex()

    def reindex(self) -> None:
        """Sort every token pair: a lookup's first step becomes a binary search."""
        s = self._buf[: self.size].astype(np.int64) + 1  # separators -> 0
        keys = s[1:] * (int(s.max()) + 1) + s[:-1]  # [size - 1]: pair (s[i], s[i + 1]), keyed by s[i + 1] first
        order = np.argsort(keys, kind="stable")
        self._keys, self._pos, self._radix = keys[order], order, int(s.max()) + 1
        self._indexed = self.size

    def _ends_after(self, last: int, before: int) -> np.ndarray:
        """Positions right after each occurrence of token ``last`` (positions < ``before``)."""
        hits = [np.zeros(0, np.int64)]
        if self._indexed > 1 and len(self._keys):
            lo = np.searchsorted(self._keys, (last + 1) * self._radix)
            hi = np.searchsorted(self._keys, (last + 2) * self._radix)
            hits.append(self._pos[lo:hi] + 2)  # pair i ends at i + 1: the position after it is i + 2
        tail = self._buf[self._indexed : self.size]  # appended since the index was built
        hits.append(np.flatnonzero(tail == last) + self._indexed + 1)
        ends = np.concatenate(hits)
        return ends[ends < before]

    def matches(self, context: Sequence[int], max_len: int, before: int | None = None) -> list[tuple[int, int, np.ndarray]]:
        """[(shortest m, longest m, ends)], longest first: the runs of match lengths m whose context tails
        (the context's last m tokens) have the same earlier occurrences.

        ends: the positions right after those occurrences (int64). A run shares its counts: only the
        draft budget differs along it. ``before``: ignore occurrences ending at or after this position
        (default: the store's end, which in a request's own store is the context itself).
        """
        ctx = np.asarray(list(context)[-max_len:], np.int64)
        if not len(ctx):
            return []
        before = self.size if before is None else before
        ends = self._ends_after(int(ctx[-1]), before)
        out: list[tuple[int, int, np.ndarray]] = []
        m = lo = 1
        while len(ends):
            if len(ends) == 1:  # one occurrence left: how far back it agrees, in one comparison
                e, rest = int(ends[0]), ctx[: len(ctx) - m][::-1]  # the context tokens before the matched m
                back = self._buf[max(e - 1 - m - len(rest) + 1, 0) : e - m][::-1]
                n = min(len(rest), len(back))
                differ = np.flatnonzero(back[:n] != rest[:n])
                m += int(differ[0]) if len(differ) else n
                out.append((lo, m, ends))
                break
            if m == len(ctx):
                out.append((lo, m, ends))
                break
            keep = ends[self._buf[ends - 1 - m] == ctx[-1 - m]]  # ends - 1 - m >= 0: position 0 is a separator
            if len(keep) != len(ends):
                out.append((lo, m, ends))
                lo = m + 1
            ends, m = keep, m + 1
        return out[::-1]

    def speculate(self, ends: np.ndarray, budget: int, min_token_prob: float, tree: bool) -> SuffixDraft:
        """The frequency-scored draft after the occurrences ``ends``: a tree (best first) or the best path."""
        draft = SuffixDraft()
        if budget <= 0 or not len(ends):
            return draft
        buf = self._buf
        if len(ends) == 1:  # one occurrence (the usual long match): copy what followed it
            e = int(ends[0])
            run = buf[e : min(e + budget, self.size)]
            stop = np.flatnonzero(run == SEPARATOR)
            run = run[: stop[0]] if len(stop) else run
            n = len(run)
            return SuffixDraft(run.tolist(), list(range(-1, n - 1)), [1.0] * n)
        # heap of candidate nodes: (-prob, order, ends continuing with the token, depth, parent index, token)
        heap: list[tuple[float, int, np.ndarray, int, int, int]] = []
        order = 0

        def push_children(at: np.ndarray, depth: int, prob: float, parent: int) -> None:
            nonlocal order
            nxt = buf[np.minimum(at + depth, self.size)]  # past the end reads a separator
            toks, counts = np.unique(nxt, return_counts=True)
            total = len(at)
            ranked = sorted(zip(counts.tolist(), toks.tolist(), strict=True), key=lambda c: (-c[0], c[1]))
            for count, tok in ranked:
                p = prob * count / total
                if tok == SEPARATOR or p < min_token_prob:
                    continue
                heapq.heappush(heap, (-p, order, at[nxt == tok], depth + 1, parent, tok))
                order += 1
                if not tree:  # a path follows the most frequent child only
                    break

        push_children(ends, 0, 1.0, -1)
        while heap and len(draft.tokens) < budget:
            neg, _, at, depth, parent, tok = heapq.heappop(heap)
            draft.tokens.append(tok)
            draft.parents.append(parent)
            draft.probs.append(-neg)
            push_children(at, depth, -neg, len(draft.tokens) - 1)
        return draft


@dataclass(frozen=True)
class SpecParams:
    """ArcticInference's knobs (vLLM's suffix_decoding_* options)."""

    max_depth: int = 24  # match + draft at most this deep (the suffix tree's depth)
    max_spec_factor: float = 1.0  # drafts <= factor * match length + offset
    max_spec_offset: float = 0.0
    min_token_prob: float = 0.1  # drafts whose estimated probability is lower are not proposed


def best_draft(store: TokenStore, context: Sequence[int], limit: int, params: SpecParams, tree: bool, before: int | None = None) -> SuffixDraft:
    """The best-scoring draft over match lengths (ties: the longer match), at most ``limit`` nodes."""
    best = SuffixDraft()
    for lo, hi, ends in store.matches(context, params.max_depth - 1, before):
        budget, m = _budget(lo, hi, limit, params)
        if budget <= best.score:  # a draft of `budget` nodes scores at most `budget`
            continue
        draft = store.speculate(ends, budget, params.min_token_prob, tree)
        if draft.score > best.score:
            draft.match_len, draft.ends = m, ends
            best = draft
    return best


def _budget(lo: int, hi: int, limit: int, params: SpecParams) -> tuple[int, int]:
    """(nodes, m): the largest draft budget over match lengths lo..hi (the longest m on a tie).

    The budget min(limit, factor * m + offset, max_depth - m) rises with m, then falls: its peak is
    where the two lines cross, so only the ends of the run and the integers around the crossing can win."""
    f, off, depth = params.max_spec_factor, params.max_spec_offset, params.max_depth
    cross = int((depth - off) / (f + 1.0)) if f > -1.0 else hi
    points = {lo, hi} | {m for m in (cross - 1, cross, cross + 1) if lo <= m <= hi}
    best = max(min(limit, int(m * f + off + 1e-6), depth - m) for m in points)
    return best, min(hi, depth - best)  # the longest m that still leaves room for `best` nodes
