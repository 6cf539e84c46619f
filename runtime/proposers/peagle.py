"""P-EAGLE drafts: EAGLE-3's module and features, a whole block of drafts in ONE module call.

A peagle target (``--speculative_decoding_mode peagle``) returns ``eagle_hidden`` as an eagle target does, and its
module engine (the target's ``eagle/`` folder, mode peagle_module) reads the same pairs (features of token p, token
p + 1) plus placeholder rows: token id ``vocab_size`` stands for a position not drafted yet (builder/eagle.py). A
round feeds each drafting request, in one ragged call,

    [its pending real pairs (the last verification's), then k - 1 placeholders]

and reads k rows of logits: the last real pair's (the guess for the token after the one just appended, as EAGLE's
depth 1) and each placeholder's, the position after it. Every placeholder sees the real pairs and the placeholders
before it (the module was trained on exactly these rows, train/peagle.py), never a drafted token: the k guesses
are independent draws given the context, which is what makes them one call. The placeholders' K/V are dropped
at once (the cache keeps the real pairs only), as EAGLE rolls its drafted rows back.

Chains take each position's pick (greedy: argmax; sampled: a draw from the processed distribution, passed on for
rejection sampling; runtime/proposers/medusa.py's ``positional_draft``, Medusa's heads being the same kind of
per-position guesses); trees (``--peagle_choices``) take, from the same single call, each depth's top candidates
(greedy) or its draws without replacement (sampled, verified by recursive rejection sampling: runtime/tree.py), the
same under every parent.

Pending pairs, prefill and removal are EAGLE's (EagleProposer), except that a backlog (a long prompt, rounds without
drafts) is fed up to its last pair: that one goes with the block, so a round is always one call.

``refine`` (``--peagle_refine N``, a module trained with ``specdec-train --peagle_refine``) adds N calls to a round,
each feeding the block's k - 1 placeholder rows again with tokens in place of the placeholder ids: before call m + 1,
position m + 1 is drafted from its final row (the draw of a sampled request, a processor's pick, a tree's first
draw: medusa.py's PositionalDraft), and row d reads the token drafted at position d (d <= m + 1; beyond, the last
call's most likely token) and, as a placeholder does, the anchor's features plus depth d's vector (fed by the
runtime: the engine's placeholder_features.npy, the vectors its graph adds to a placeholder id's row). Where
positions 1..d were right, row d then reads what the module was trained on for such blocks (the true tokens), so
call m + 1 drafts position m + 1 as a one-call-per-token drafter would, reading the request's own drafts; the real
pairs are in the cache already, and the refining rows are dropped as the placeholders are.

``refine="auto"`` (``--peagle_refine auto``) makes each request's refining calls the draft policy's choice
(``Request.refine_calls``, runtime/draft_policy.py), up to a chain's k - 1: the calls after the first that a round
makes are timed apart (``refined``), and a greedy chain's draft carries the chains fewer calls would have drafted
(``Draft.fewer_calls``: the block's most likely tokens after each call), which the policy judges against the
target's tokens to learn what each call buys. Chains only: a tree's nodes are priced as drafted by one number of calls.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np

from ...formats.engine_format import MODULE_MODES, PLACEHOLDER_FEATURES_FILE
from ...formats.errors import EngineError, RequestError
from ..request import Request
from .base import Draft, adjacent_runs
from .eagle import CATCH_UP_AFTER, HIDDEN_IN, EagleProposer
from .medusa import PositionalDraft
from .method import Flag, Method
from .own import DraftTreeConfig

if TYPE_CHECKING:
    from collections.abc import Callable

    from ...formats.engine_format import EngineDir
    from ..backends.base import Executor
    from ..tree import DraftTree

MAX_REFINE = 7  # a block of 8 positions is fixed by 7 refining calls (call m + 1 fixes position m + 1)
AUTO_REFINE = "auto"  # the draft policy chooses each request's refining calls, each round (up to MAX_REFINE)
AUTO_ON_A_TREE = "--peagle_refine auto chooses the refining calls of chains; with --peagle_choices give a number of calls."


def refine_value(text: str | int) -> int | str:
    """A --peagle_refine value: a whole number of calls from 0 to MAX_REFINE, or "auto" (RequestError otherwise)."""
    if isinstance(text, str) and text.strip().lower() == AUTO_REFINE:
        return AUTO_REFINE
    try:
        n = int(text)
    except (TypeError, ValueError):
        n = -1
    if isinstance(text, bool) or not 0 <= n <= MAX_REFINE or (isinstance(text, float) and text != n):
        raise RequestError(f"--peagle_refine {text!r}: give a whole number of calls from 0 to {MAX_REFINE}, or auto.")
    return n


class PEagleProposer(EagleProposer):
    name = "peagle"
    choices_flag = "--peagle_choices"
    title, module_flag = "P-EAGLE", "--peagle_dir"
    module_mode = MODULE_MODES[name]
    drafts_in_one_call = True  # draft_len=auto prices a round's drafts as one call (a line over k, once two k were timed)

    def __init__(self, target: Executor, module: Executor, choices: str | Sequence[Sequence[int]] | DraftTree | None = None,
                 refine: int | str = 0):
        """refine: calls after the first, each reading the previous one's drafts (a module trained to: --peagle_refine);
        "auto": each request's, as the draft policy chooses (Request.refine_calls), up to MAX_REFINE."""
        super().__init__(target, module, choices)
        refine = refine_value(refine)
        self.auto_refine = refine == AUTO_REFINE
        if self.auto_refine and self.tree is not None:
            raise RequestError(AUTO_ON_A_TREE)
        self.refine = MAX_REFINE if self.auto_refine else int(refine)  # the most calls a round makes
        self.auto_refine_calls = self.refine if self.auto_refine else 0
        self.refined = (0, 0.0)
        self.depth_vectors: np.ndarray | None = None  # [vectors, hidden]: what a refining row adds to (or feeds as) its features
        self.anchored = True
        if refine:
            extra = module.engine.config.extra
            path = module.engine.path / PLACEHOLDER_FEATURES_FILE
            if not path.is_file() or "peagle_placeholders" not in extra:
                raise EngineError(f"--peagle_refine needs the module's {PLACEHOLDER_FEATURES_FILE}, which {module.engine.path} was built "
                                  "without (an older specdec-build): rebuild the target.")
            if not extra.get("peagle_refine"):
                raise EngineError(f"--peagle_refine: the P-EAGLE module in {module.engine.path} was not trained to read its drafts (specdec-train "
                                  "--peagle_refine): a refining call would feed it tokens where it learned placeholders. Train the module "
                                  "with --peagle_refine, or draft without --peagle_refine.")
            self.depth_vectors = np.load(path, allow_pickle=False).astype(np.float32)
            self.anchored = extra["peagle_placeholders"] == "anchored"

    @classmethod
    def for_target(cls, target: Executor, choices, open_beside: Callable[[EngineDir], Executor], refine: int = 0) -> PEagleProposer:
        from ...formats.engine_format import eagle_module_dir, load_engine_dir

        return cls(target, open_beside(load_engine_dir(eagle_module_dir(target.engine))), choices, refine)

    def with_tree(self, tree: DraftTree) -> PEagleProposer:
        return type(self)(self.target, self.module, tree, AUTO_REFINE if self.auto_refine else self.refine)

    def refining(self, refine: int | str) -> PEagleProposer:
        """The same drafter on the same executors, refining each block ``refine`` times (or "auto")."""
        return type(self)(self.target, self.module, self.tree, refine)

    @property
    def label(self) -> str:
        return super().label + (", refined auto" if self.auto_refine else f", refined x{self.refine}" if self.refine else "")

    @property
    def placeholder(self) -> int:
        """The token id of the first position not drafted yet (depth 1; depth d is this + d - 1): past the vocabulary
        (builder/eagle.py)."""
        return self.module.model.vocab_size

    # -- backlogs: fed up to their last pair --------------------------------------------
    def backlog(self, request: Request) -> int:
        pending = len(self.pending[request.request_id])
        return pending - 1 if pending > CATCH_UP_AFTER else 0

    def catch_up(self, requests: Sequence[Request]) -> int:
        slots = sorted(self.slot_of[r.request_id] for r in requests if self.backlog(r))
        fed = 0
        for run in adjacent_runs(slots):
            fed += self._feed(run[0], run[-1] + 1, {self.order[s]: 0 for s in run})
        return fed

    # -- a round ------------------------------------------------------------------------
    def propose(self, requests: Sequence[Request], draft_lens: Sequence[int]) -> list[Draft]:
        self.refined = (0, 0.0)
        out = [Draft.empty() for _ in requests]
        rows_for: dict[str, int] = {}  # request -> positions its draft reads (its chain, or its tree's depth)
        for r, k in zip(requests, draft_lens, strict=False):
            if k > 0 and len(self.pending[r.request_id]):
                rows_for[r.request_id] = self._positions(int(k))
        if not rows_for:
            return out
        slots = sorted(self.slot_of[rid] for rid in rows_for)
        blocks: dict[str, np.ndarray] = {}
        # refining calls per request: its own (auto: the policy's choice, none where it chose none) or the proposer's
        # (a block of p positions is settled by p - 1 calls)
        calls = {r.request_id: min((r.refine_calls or 0) if self.auto_refine else self.refine, rows_for[r.request_id] - 1)
                 for r in requests if r.request_id in rows_for}
        most = max(calls.values())
        anchors: dict[str, np.ndarray] | None = {} if most > 0 else None  # [hidden] per block: what its refining rows add to
        self._feed(slots[0], slots[-1] + 1, rows_for, blocks, anchors)
        drafts = {r.request_id: PositionalDraft(r, int(k), self.tree) for r, k in zip(requests, draft_lens, strict=False)
                  if r.request_id in blocks}
        # auto: a greedy chain's chains after each call but its last (what fewer calls would have drafted), [k] each; none
        # for a chain not refined (its draft is what no call drafts: the policy learns the one call's acceptance from it)
        fewer: dict[str, list[np.ndarray]] = {rid: [] for rid, d in drafts.items() if d.picks} if self.auto_refine else {}  # (chains only)
        refine_s = 0.0  # the calls' own time, not the bookkeeping of what fewer calls drafted
        for call in range(most):
            for rid in fewer:
                if call < calls[rid]:
                    fewer[rid].append(blocks[rid].argmax(-1))
            t0 = time.perf_counter()
            self._refine(slots[0], slots[-1] + 1, rows_for, blocks, anchors, drafts, call, calls)
            refine_s += time.perf_counter() - t0
        self.refined = (most, refine_s)
        for i, r in enumerate(requests):
            rid = r.request_id
            if rid in blocks:
                out[i] = drafts[rid].draft(blocks[rid])
                if rid in fewer:  # [calls, k]
                    out[i] = replace(out[i], fewer_calls=np.stack(fewer[rid]) if fewer[rid] else np.zeros((0, rows_for[rid]), np.int64))
        return out

    def _positions(self, k: int) -> int:
        """The block's positions a draft of k reads: its chain, or its tree's depth."""
        if self.tree is None:
            return k
        return int(self.tree.depths[: min(k, len(self.tree))].max())

    def _feed(self, lo: int, hi: int, rows_for: dict[str, int], blocks: dict[str, np.ndarray] | None = None,
              anchors: dict[str, np.ndarray] | None = None) -> int:
        """One call on slots lo..hi: each request of ``rows_for`` fed its pending pairs (all but the last when it drafts
        0 positions: a catch-up), then positions - 1 placeholders; the real pairs stay in the cache, the placeholders do
        not. ``blocks``: filled with each drafting request's logits [positions, vocab]; ``anchors`` (refining): with the
        features of its last real pair [hidden]. Returns the pairs fed. One call per slot when a row riding along would
        write past the cache's capacity."""
        ids = self.order[lo:hi]
        go = np.array([rid in rows_for for rid in ids])
        pairs = [len(self.pending[rid]) - (rows_for[rid] == 0) if g else 0 for rid, g in zip(ids, go, strict=False)]
        extra = [max(rows_for[rid] - 1, 0) if g else 0 for rid, g in zip(ids, go, strict=False)]
        width = max(p + e for p, e in zip(pairs, extra, strict=False))
        if width == 0:
            return 0
        if hi - lo > 1 and int(self.cache.lengths[lo:hi].max()) + width > self.cache.capacity:
            return sum(self._feed(s, s + 1, {ids[s - lo]: rows_for[ids[s - lo]]}, blocks, anchors) for s in range(lo, hi) if go[s - lo])
        hidden_size = self.module.model.hidden_size
        tokens, hidden = [], np.zeros((len(ids), width, hidden_size), np.float32)  # [n, width, hidden]
        for i, rid in enumerate(ids):
            if not go[i] or pairs[i] + extra[i] == 0:
                tokens.append([0])  # rides along (not advanced: what it writes is stale at once)
                go[i] = False
                continue
            pending = self.pending[rid]
            tokens.append(pending.tokens[: pairs[i]] + [self.placeholder + j for j in range(extra[i])])  # placeholder of depth j + 1
            rows = pending.features  # [pending, hidden]
            hidden[i, : pairs[i]] = rows[: pairs[i]]
            hidden[i, pairs[i] : pairs[i] + extra[i]] = rows[pairs[i] - 1]  # the anchor's features (read when anchored)
        real = self.cache.lengths[lo:hi].copy()
        step = self.module.forward(self.cache, tokens, all_logits=blocks is not None, advance=go, first_slot=lo, extra_inputs={HIDDEN_IN: hidden})
        self.cache.lengths[lo:hi] = real + np.where(go, pairs, 0)  # the real pairs stay, the placeholders go
        for i, rid in enumerate(ids):
            if not go[i]:
                continue
            if blocks is not None and rows_for[rid] > 0:  # the last real pair's row, then each placeholder's
                blocks[rid] = step.logits[i, pairs[i] - 1 : pairs[i] - 1 + rows_for[rid]].copy()
                if anchors is not None:
                    anchors[rid] = self.pending[rid].features[pairs[i] - 1].copy()  # (a view of a buffer that drop reuses)
            self.pending[rid].drop(pairs[i])  # a catch-up's last pair waits for the block
            self.overdue.discard(rid)
        return int(sum(p for p, g in zip(pairs, go, strict=False) if g))

    def _refine(self, lo: int, hi: int, rows_for: dict[str, int], blocks: dict[str, np.ndarray], anchors: dict[str, np.ndarray],
                drafts: dict[str, PositionalDraft], call: int, calls: dict[str, int]) -> None:
        """Refining call ``call`` (0-based) on slots lo..hi: each block not yet settled (positions 1..call + 1 are, so
        one of more than call + 1 positions; a block's positions: its chain, or its tree's depth) drafts position
        call + 1 from its final row, then feeds its positions - 1 placeholder rows again with the placeholder's
        features, row d reading the token drafted at position d where it is drafted (1..call + 1: a draw for a sampled
        request, a processor's pick) and the block's most likely token beyond; its rows call + 2..positions are
        replaced by the call's. ``calls``: each request's refining calls (one takes part in calls 0..its own - 1). The
        cache holds the real pairs only, before and after."""
        ids = self.order[lo:hi]
        go = np.array([rid in blocks and rows_for[rid] - 1 > call and calls[rid] > call for rid in ids])
        if not go.any():
            return
        # at most max_draft_len - 1 rows wide, which the cache holds past max_seq_len for every slot: one ragged call always
        width = max(rows_for[rid] - 1 for rid, g in zip(ids, go, strict=True) if g)
        vectors = self.depth_vectors  # [D, hidden]: depth d's is row min(d, D) - 1
        tokens, hidden = [], np.zeros((len(ids), width, self.module.model.hidden_size), np.float32)  # [n, width, hidden]
        for i, rid in enumerate(ids):
            if not go[i]:
                tokens.append([0])  # rides along, not advanced
                continue
            rows = rows_for[rid] - 1
            drafts[rid].settle(blocks[rid][call])  # position call + 1: final since the last call
            tokens.append(drafts[rid].read + blocks[rid][call + 1 : rows].argmax(-1).tolist())  # row d reads position d's token
            depth = vectors[np.minimum(np.arange(rows), len(vectors) - 1)]  # [rows, hidden]
            hidden[i, :rows] = depth + anchors[rid] if self.anchored else depth
        real = self.cache.lengths[lo:hi].copy()
        try:
            step = self.module.forward(self.cache, tokens, all_logits=True, advance=go, first_slot=lo, extra_inputs={HIDDEN_IN: hidden})
        finally:
            self.cache.lengths[lo:hi] = real  # the refining rows go, as the placeholders did
        for i, rid in enumerate(ids):
            if go[i]:  # row d's logits are position d + 1's; positions 1..call + 1 stay as drafted
                blocks[rid][call + 1 : rows_for[rid]] = step.logits[i, call : rows_for[rid] - 1]


# -- the method's registration (runtime/methods.py: a peagle target carries it) -----------------------------------
@dataclass(frozen=True)
class PEagleConfig(DraftTreeConfig):
    """P-EAGLE drafting with the module in a --speculative_decoding_mode peagle target's eagle/ folder: a draft tree
    (each depth's top candidates from the one call's block), or chains; ``refine`` calls after the first, each reading
    the previous one's drafts (a module trained with --peagle_refine)."""

    refine: int | str = 0  # or "auto"

    def __post_init__(self) -> None:
        object.__setattr__(self, "refine", refine_value(self.refine))
        if self.refine == AUTO_REFINE and self.choices is not None:
            raise RequestError(AUTO_ON_A_TREE)


def _from_flags(values) -> PEagleConfig | None:
    given = values.get("peagle_refine")
    choices, refine = values.get("peagle_choices"), 0 if given is None else refine_value(given)  # 0, the default, asks for nothing
    return None if choices is None and not refine else PEagleConfig(choices, refine)


METHOD = Method(
    name=PEagleProposer.name, config=PEagleConfig, proposer=PEagleProposer, flag=PEagleProposer.choices_flag, from_flags=_from_flags,
    flags=(Flag("peagle_choices", 'A --speculative_decoding_mode peagle target: the draft tree, as --medusa_choices, e.g. '
                '"[[0],[1],[0,0],[0,1],[0,0,0]]", drafted from one module call [default: a chain of --draft_len drafts, 4].'),
           Flag("peagle_refine", "P-EAGLE: module calls after the first, each reading the previous call's drafts (a module trained with "
                f"specdec-train --peagle_refine; 1 call more fixes one more position), 0 to {MAX_REFINE}, or auto: chosen per request and "
                "round from measured costs and what each call buys (chains); 0: one call a round.", default="0")),
    open=lambda c, context: PEagleProposer.for_target(context.open_target(), c.choices, context.open_beside, c.refine),
    default_config=PEagleConfig)
