"""Medusa drafts: the target engine's own Medusa heads guess the tokens after the next one.

A ``--speculative_decoding_mode medusa`` target returns, beside its logits,
``medusa_logits`` [rows, heads, vocab] for the same rows. On the row of the
last token a round keeps, the target's logits pick the next token t+1 (the
bonus or recovered token the engine appends) and head i guesses t+2+i. The
proposer is handed the heads of the call itself: the prefill's outputs
(``prefilled``) and each verification's rows (``TargetOutput.extras`` in
``observe``), and keeps a copy of the row it needs. Proposing costs no
model call.

Chain (no choices): draft i is head i's pick. Greedy requests take its
argmax and are verified by token compare; sampled requests draw draft i from
head i's processed distribution and are verified by rejection sampling with
it (runtime/acceptance.py), so the output is distributed as the target's.

Tree (``choices``, TensorRT-LLM's ``--medusa_choices``): the node with path
[i0, .., id] is head d's (i_d + 1)-th best token under its parent. The target
verifies every node in one call (runtime/tree.py). A greedy request keeps the
longest path of the target's argmaxes. A sampled request's node of place i
under its parent holds head d's i-th draw without replacement from its
processed distribution (the same draws under every parent), verified by
recursive rejection sampling, so the output is distributed as the target's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from ...formats.engine_format import EngineDir
from ...formats.errors import EngineError
from ..backends.base import Executor, StepOutput
from ..request import Request
from ..sampling import processed_probs, sample, sample_distinct
from ..tree import DraftTree, check_tree, parse_choices, top_k, tree_draft
from .base import Draft, TargetOutput
from .drawn import draft_distribution, drawn_tree
from .own import DraftTreeConfig, OwnDrafter, own_drafter_method

HEADS = "medusa_logits"  # the target's extra output: [rows, heads, vocab] each head on the logits rows (engine_format.extra_io)


class MedusaProposer(OwnDrafter):
    name = "medusa"
    choices_flag = "--medusa_choices"
    target_outputs = (HEADS,)

    def __init__(self, target: Executor, choices: str | Sequence[Sequence[int]] | DraftTree | None = None):
        """target: the executor of a --speculative_decoding_mode medusa engine (the Engine's target).
        choices: a draft tree (TensorRT-LLM's --medusa_choices format), or None for chains."""
        heads = target.build.medusa_num_heads if target.build.speculative_decoding_mode == "medusa" else 0
        if not heads or HEADS not in target.extra_outputs:
            raise EngineError(
                f"Medusa drafting needs a target engine built with --speculative_decoding_mode medusa --medusa_dir HEADS; "
                f"{target.engine.path} was built with --speculative_decoding_mode {target.build.speculative_decoding_mode}"
                + ("" if target.build.speculative_decoding_mode != "medusa" else f" and its {type(target).__name__} does not return {HEADS}")
                + "."
            )
        self.num_heads = int(heads)
        self.target = target
        self.tree = choices if isinstance(choices, DraftTree) else parse_choices(choices, self.choices_flag)
        if self.tree is not None:
            check_tree(self.tree, target, self.choices_flag, max_depth=self.num_heads, depth_what=f"the engine's {self.num_heads} Medusa heads")
        self.heads: dict[str, np.ndarray] = {}  # request id -> [heads, vocab] the heads on its last kept row (a copy)

    @classmethod
    def for_target(cls, target: Executor, choices, open_beside: Callable[[EngineDir], Executor]) -> MedusaProposer:
        return cls(target, choices)  # the heads are part of the target's network: nothing to open beside it

    def with_tree(self, tree: DraftTree) -> MedusaProposer:
        return MedusaProposer(self.target, tree)

    @property
    def max_chain_len(self) -> int:
        return min(self.num_heads, self.target.build.max_draft_len)  # head i drafts depth i + 1

    def add(self, requests: Sequence[Request]) -> None:
        for r in requests:
            self.heads[r.request_id] = np.zeros((0, 0), np.float32)  # until prefilled() hands over the prompt's head rows

    def prefilled(self, requests: Sequence[Request], step: StepOutput, first_slot: int) -> None:
        """The target just prefilled ``requests`` in slots first_slot..: each one's heads on its last prompt row."""
        heads = step.extras[HEADS]  # [len(prefilled), 1 (or every row: a prefill with all logits), heads, vocab]
        for r in requests:
            row = len(r.prompt_ids) - 1 if heads.shape[1] > 1 else 0
            self.heads[r.request_id] = heads[r.slot - first_slot, row].copy()

    def remove(self, request_id: str) -> None:
        self.heads.pop(request_id, None)

    def room(self, request: Request) -> int:
        if not len(self.heads[request.request_id]):
            return 0
        return len(self.tree) if self.tree is not None else self.num_heads

    def propose(self, requests: Sequence[Request], draft_lens: Sequence[int]) -> list[Draft]:
        return [self._draft(r, int(k)) for r, k in zip(requests, draft_lens, strict=True)]

    def _draft(self, r: Request, k: int) -> Draft:
        return positional_draft(r, self.heads[r.request_id], k, self.tree)

    def observe(self, request: Request, draft: Draft, target: TargetOutput) -> None:
        # the row of the last kept token: its target logits gave the appended token, its heads the ones after it
        self.heads[request.request_id] = target.extras[HEADS][target.rows[-1]].copy()  # [heads, vocab]


def positional_draft(r: Request, rows: np.ndarray, k: int, tree: DraftTree | None) -> Draft:
    """Up to k drafts from one distribution per position ahead (rows [positions, vocab]: Medusa's heads, P-EAGLE's
    block), each blind to the tokens drafted before it. Greedy: the argmax chain, or ``tree`` with the same top-k under
    every parent. Sampled (or processed: grammar, penalties): each position's processed distribution with the drafts
    before it as history, drawn from and returned as the draft probabilities, so rejection sampling keeps the target's
    distribution; with a tree, each depth's draws without replacement (the first draws of the depths before it as
    history, as a chain's), as many as a node there has children, a node holding its place's draw under every parent
    (Medusa's heads do not see the parent), verified by recursive rejection sampling (runtime/tree.py)."""
    return PositionalDraft(r, k, tree).draft(rows)


class PositionalDraft:
    """positional_draft one position at a time, for a drafter that computes a position's row again once the positions
    before it are drafted (P-EAGLE's refining calls: call m + 1 reads the tokens drafted at positions 1..m + 1).
    ``settle(row)`` drafts the next position from its final row [vocab] and returns the token drafted there (a tree:
    the depth's first draw, the history of the depths after it), which the drafter's next call reads; ``draft(rows)``
    drafts the positions not settled from their rows [positions, vocab], whose settled positions' rows are the ones they
    were settled from. The Draft is positional_draft's on those rows, from the same random draws in the same order (one
    stream per request)."""

    def __init__(self, r: Request, k: int, tree: DraftTree | None):
        self.r, self.k, self.tree = r, k, tree
        greedy, proc = r.config.sampling.greedy, r.processor
        self.picks = greedy and (tree is not None or proc is None or proc.plain)  # argmax / top-k: no history, no draws
        self.read: list[int] = []  # the token each settled position hands the next call
        self.qs: list[np.ndarray] = []  # a chain's draws: each position's distribution [vocab]
        if tree is not None and not self.picks:
            n = min(k, len(tree))
            self.depths, self.orders = tree.depths[:n], tree.orders[:n]
            self.tokens, self.drawn = np.zeros(n, np.int64), np.zeros(n, bool)
            self.probs: np.ndarray | None = None  # [n, vocab], from the first row
            self.stopped = False  # a depth drew nothing: the depths below it are not drawn

    def settle(self, row: np.ndarray) -> int:
        """Drafts position len(read) + 1 from ``row`` [vocab]; returns the token drafted there (a tree: its first)."""
        if self.picks:  # drafted from the rows at the end, settled rows included
            token = int(row.argmax())
        elif self.tree is None:
            token = self._draw_chain(row)
        else:
            token = self._draw_depth(row)
        self.read.append(token)
        return token

    def draft(self, rows: np.ndarray) -> Draft:
        """The Draft: the settled positions as drafted, the rest from rows [positions, vocab] (the same positions)."""
        done = len(self.read)
        if self.picks:
            if self.tree is None:
                return Draft(rows[: self.k].argmax(axis=-1).astype(np.int64))
            tokens, parents, depths = tree_draft(self.tree, self.k, lambda depth, top: top_k(rows[depth - 1], top))
            return Draft(tokens, parents=parents, depths=depths, tree_index=np.arange(len(tokens)))
        if self.tree is None:
            for j in range(done, self.k):
                self.settle(rows[j])
            return Draft(np.array(self.read, np.int64), probs=None if self.r.config.sampling.greedy else np.stack(self.qs))
        for depth in range(done + 1, int(self.depths.max()) + 1):
            self.settle(rows[depth - 1])
        return drawn_tree(self.tree, self.tokens, self.probs, self.drawn)

    def _draw_chain(self, row: np.ndarray) -> int:
        """Position j: processed as the target's row there, with the drafts before it as history."""
        if self.r.processor is not None:
            token, q = self.r.processor.pick(row, self.read, self.r.rng)
        else:
            q = processed_probs(row[None], self.r.config.sampling)[0]
            token = sample(q, self.r.rng)
        self.qs.append(q)
        return int(token)

    def _draw_depth(self, row: np.ndarray) -> int:
        """A sampled tree's next depth: its processed distribution drawn from without replacement, as many times as a
        node there has children; returns the first draw (the row's argmax once a depth drew nothing)."""
        if self.probs is None:
            self.probs = np.zeros((len(self.tokens), row.shape[-1]), np.float64)
        if self.stopped:
            return int(row.argmax())
        at = np.flatnonzero(self.depths == len(self.read) + 1)  # (every depth down to the deepest has a node: paths sorted by length)
        q = draft_distribution(self.r, row, self.read)
        draws = sample_distinct(q, int(self.orders[at].max()) + 1, self.r.rng)
        for j in at.tolist():
            if self.orders[j] < len(draws):
                self.tokens[j], self.drawn[j] = draws[self.orders[j]], True
        self.probs[at] = q
        if not draws:
            self.stopped = True
            return int(row.argmax())
        return int(draws[0])


# -- the method's registration (runtime/methods.py: a medusa target carries it) -----------------------------------
@dataclass(frozen=True)
class MedusaConfig(DraftTreeConfig):
    """Medusa drafting with a --speculative_decoding_mode medusa target's own heads: a draft tree (``choices``), or chains."""


METHOD = own_drafter_method(
    MedusaProposer, MedusaConfig,
    'A --speculative_decoding_mode medusa target: the draft tree, TensorRT-LLM\'s format (paths of top-k indices), e.g. '
    '"[[0],[0,0],[1],[0,1],[2],[0,0,0]]"; at most the engine\'s max_draft_len nodes '
    "[default: a chain, one draft per head].")
