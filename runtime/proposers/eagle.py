"""EAGLE-3 drafts: a one-layer module over the target's own features, with its own engine and KV cache.

An eagle target (``--speculative_decoding_mode eagle``) returns ``eagle_hidden``
[rows, hidden] for every token it is fed: fc(its low, middle and high layers'
outputs). The module engine (the target's ``eagle/`` folder) reads, at
position p, the pair (features of token p, token p + 1) and predicts token
p + 2; its ``hidden_out`` (pre-norm) stands in for the features of a token the
target has not seen yet, so it drafts several tokens ahead (EAGLE-3).

Per request the module's cache holds the *real* pairs only (features the
target computed). A round:

    catch up   feed the pairs the last verification produced (the kept rows'
               features with the tokens that follow them): one call for every
               request, ragged; its last row predicts depth 1
    draft      chain: k - 1 one-token calls, each feeding (its previous
               hidden_out, its previous draft); tree: one call per level, the
               whole tree so far re-fed with tree attention (a level's nodes
               need their parents' hidden_out); then the cache goes back to the
               real pairs

A request with ``draft_len="auto"`` keeps its prompt's pairs pending until it
first drafts (``backlog`` / ``catch_up``, as a draft model does): at a full
batch auto rarely drafts, and the module's prefill of every prompt was 7% of
the wall time at 4 streams on the 325M int4 pair for requests that then did
not draft. Pending features are kept in one buffer per request
(``PendingPairs``): a round appends its rows with one copy, a feed reads them
as they lie. The rows of a round where a request took no drafts reach the
proposer all at once (``observe_plain``): a batch whose auto requests do not
draft pays one row's copy a request and round for them, not a call each.
A request keeps at most ``MAX_PENDING`` pairs unfed: past them (a long prompt
at admission, a long run of rounds without drafts) the round feeds them
(``overdue``), so a long text does not hold 4 bytes x hidden a token of
features on the host while auto declines.

Greedy chains and trees are exact (runtime/tree.py); sampled chains draw each
draft from the module's processed distribution and pass it for rejection
sampling. Trees: a greedy request's node holds its parent's top
candidates; a sampled request's children of a node are drawn without
replacement from the module's processed distribution there (its path as
history) and verified by recursive rejection sampling (runtime/tree.py), so
the output keeps the target's distribution.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from ...formats.config_strings import DEFAULT_DRAFT_LEN
from ...formats.engine_format import MODULE_MODES, EngineDir, eagle_module_dir, load_engine_dir
from ...formats.errors import EngineError
from ..backends.base import Executor, StepOutput
from ..request import AUTO, Request
from ..sampling import processed_probs, sample, sample_distinct
from ..tree import DraftTree, check_tree, parse_choices, top_k
from .base import Draft, TargetOutput, adjacent_runs, free_slot, kept
from .drawn import draft_distribution, drawn_tree
from .own import DraftTreeConfig, OwnDrafter, own_drafter_method

CATCH_UP_AFTER = 9  # pending pairs beyond one round's worth are fed in a call of their own (catch_up)
MAX_PENDING = 512  # pairs a request keeps unfed (an 8B target's features: 16 KiB each, 8 MiB in all); past them the round feeds them
SPARE_ROWS = 16  # a request's pending buffer holds this many rows beyond what it was given, and shrinks back to it once fed
# the engines' extra tensors (engine_format.extra_io), by name
FEATURES = "eagle_hidden"  # the target's output: [rows, hidden] fc(its aux layers' outputs) of every fed token
HIDDEN_IN = "hidden_states"  # the module's input: [n, width, hidden] the features (or its own hidden_out) of each fed token
HIDDEN_OUT = "hidden_out"  # the module's output: [n, rows, hidden] its pre-norm state on the logits rows


class PendingPairs:
    """A request's real pairs its module has not been fed yet: the features of tokens the target saw ([n, hidden], in one
    float32 buffer that grows by doubling, so a round appends its rows with one copy and a feed reads them as they lie)
    and the token after each ([n] ints)."""

    __slots__ = ("_rows", "tokens")

    def __init__(self, hidden: int, features: np.ndarray | None = None, tokens: Sequence[int] = ()):
        """features [n, hidden] (copied) and their n tokens; room for SPARE_ROWS more."""
        n = 0 if features is None else len(features)
        self._rows = np.empty((n + SPARE_ROWS, hidden), np.float32)
        if n:
            self._rows[:n] = features
        self.tokens: list[int] = list(tokens)

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def features(self) -> np.ndarray:
        """[n, hidden] the pending pairs' features: a view, valid until the next add or drop."""
        return self._rows[: len(self.tokens)]

    def add(self, rows: np.ndarray, tokens: Sequence[int]) -> None:
        """Append rows [m, hidden] (copied) and the token after each."""
        n, m = len(self.tokens), len(tokens)
        self._make_room(n + m)
        self._rows[n : n + m] = rows
        self.tokens.extend(tokens)

    def add_one(self, row: np.ndarray, token: int) -> None:
        """Append one pair: row [hidden] (copied) and its token."""
        n = len(self.tokens)
        if n == len(self._rows):
            self._make_room(n + 1)
        self._rows[n] = row
        self.tokens.append(token)

    def drop(self, fed: int) -> None:
        """Forget the first ``fed`` pairs (the module has them now). A big buffer left with a few rows (a prompt's, a long
        backlog's: P-EAGLE keeps the last pair) is given back for one of those rows and SPARE_ROWS more, so a request does
        not hold a prompt's worth of buffer for the rest of its life."""
        rest = max(len(self.tokens) - fed, 0)
        if rest <= SPARE_ROWS and len(self._rows) > rest + SPARE_ROWS:
            small = np.empty((rest + SPARE_ROWS, self._rows.shape[1]), np.float32)
            small[:rest] = self._rows[fed : fed + rest]
            self._rows = small
        elif rest:
            self._rows[:rest] = self._rows[fed : fed + rest]  # (numpy copies overlapping rows correctly)
        del self.tokens[:fed]

    def _make_room(self, rows: int) -> None:
        if rows > len(self._rows):
            grown = np.empty((max(2 * len(self._rows), rows), self._rows.shape[1]), np.float32)
            grown[: len(self.tokens)] = self.features
            self._rows = grown


class EagleProposer(OwnDrafter):
    name = "eagle"
    choices_flag = "--eagle_choices"
    target_outputs = (FEATURES,)
    title, module_flag = "EAGLE", "--eagle_dir"  # for messages
    module_mode = MODULE_MODES[name]  # the mode of the engine in the target's eagle/ folder

    def __init__(self, target: Executor, module: Executor, choices: str | Sequence[Sequence[int]] | DraftTree | None = None):
        """target: an eagle target's executor (returns eagle_hidden); module: the executor of its eagle/ engine.
        choices: a draft tree (TensorRT-LLM's --eagle_choices format), or None for chains."""
        mode, want = target.build.speculative_decoding_mode, self.name
        if mode != want or FEATURES not in target.extra_outputs:
            raise EngineError(f"{self.title} drafting needs a target engine built with --speculative_decoding_mode {want} {self.module_flag} MODULE; "
                              f"{target.engine.path} was built with --speculative_decoding_mode {mode}"
                              + ("" if mode != want else f" and its {type(target).__name__} does not return {FEATURES}") + ".")
        if module.build.speculative_decoding_mode != self.module_mode:
            raise EngineError(f"{module.engine.path} is not an {self.title} module engine (mode {module.build.speculative_decoding_mode}); "
                              f"it is the eagle/ folder inside an {want} target engine.")
        if module.model.hidden_size != target.model.hidden_size or module.vocab_size != target.vocab_size:
            raise EngineError(f"the {self.title} module {module.engine.path} (hidden {module.model.hidden_size}, vocab {module.vocab_size}) "
                              "does not belong to "
                              f"the target {target.engine.path} (hidden {target.model.hidden_size}, vocab {target.vocab_size}).")
        self.target, self.module = target, module
        self.tree = choices if isinstance(choices, DraftTree) else parse_choices(choices, self.choices_flag)
        if self.tree is not None:
            check_tree(self.tree, target, self.choices_flag)
            if len(self.tree) > module.build.max_draft_len:
                raise EngineError(f"{self.choices_flag} has {len(self.tree)} nodes, more than the EAGLE module's "
                                  f"max_draft_len={module.build.max_draft_len}.")
        self.cache = module.new_cache(module.build.max_batch_size)
        self.order: list[str] = []  # order[s]: the request in module slot s
        self.slot_of: dict[str, int] = {}
        self.pending: dict[str, PendingPairs] = {}  # per request: its real pairs not fed to the module yet
        self.overdue: set[str] = set()  # requests holding more than MAX_PENDING pending pairs: the round feeds them
        self.next_logits: dict[str, np.ndarray] = {}  # [vocab]: the module's guess for depth 1 (after catch-up)
        self.next_hidden: dict[str, np.ndarray] = {}  # [hidden]: its hidden_out on that row

    @classmethod
    def for_target(cls, target: Executor, choices, open_beside: Callable[[EngineDir], Executor]) -> EagleProposer:
        """The module is the engine in the target's eagle/ folder, opened where the target runs."""
        return cls(target, open_beside(load_engine_dir(eagle_module_dir(target.engine))), choices)

    def with_tree(self, tree: DraftTree) -> EagleProposer:
        return type(self)(self.target, self.module, tree)

    @property
    def max_chain_len(self) -> int:
        return self.target.build.max_draft_len

    @property
    def default_chain_len(self) -> int:
        return min(DEFAULT_DRAFT_LEN, self.max_chain_len)  # a draft model's default chain length (config_strings)

    # -- requests come and go -----------------------------------------------------------
    def add(self, requests: Sequence[Request]) -> None:
        for r in requests:
            self.slot_of[r.request_id] = len(self.order)
            self.order.append(r.request_id)
            self.pending[r.request_id] = self._no_pairs()

    def _no_pairs(self) -> PendingPairs:
        return PendingPairs(self.module.model.hidden_size)

    def prefilled(self, requests: Sequence[Request], step: StepOutput, first_slot: int) -> None:
        """The target just prefilled ``requests``: the prompt's features pair with the prompt shifted by one and the first token."""
        feats = step.extras[FEATURES]  # [len(prefilled), width, hidden]
        for r in requests:
            n = len(r.prompt_ids)
            if r.draft_len == 0:  # it never drafts: the module never reads its pairs (observe keeps none either)
                continue
            self.pending[r.request_id] = PendingPairs(self.module.model.hidden_size, feats[r.slot - first_slot, :n],
                                                      [*r.prompt_ids[1:], r.output_ids[0]])
        # a fixed draft_len: a prompt longer than one round's pairs now, in a call of its own (the joining requests hold
        # the last module slots, and a prompt fed beside running requests would make them ride along a prompt-wide
        # step; a short one goes with the next draft); auto: when the request first drafts, or now past MAX_PENDING
        self.catch_up([r for r in requests if r.draft_len != AUTO or len(self.pending[r.request_id]) > MAX_PENDING])  # (draft_len 0: none)

    def remove(self, request_id: str) -> None:
        if free_slot(request_id, self.slot_of, self.order, self.cache, self.module.copy_slot):
            for d in (self.pending, self.next_logits, self.next_hidden):
                d.pop(request_id, None)
            self.overdue.discard(request_id)

    def room(self, request: Request) -> int:
        rid = request.request_id
        fed = int(self.cache.lengths[self.slot_of[rid]]) + len(self.pending[rid])
        limit = len(self.tree) if self.tree is not None else self.module.build.max_draft_len
        return max(0, min(limit, self.cache.max_seq_len - fed))

    def observe(self, request: Request, draft: Draft, target: TargetOutput) -> None:
        """The kept rows' features pair with the tokens that follow them: the kept drafts, then the new token."""
        if request.draft_len == 0:
            return
        # (copied: the step's outputs may live in a buffer the next call reuses)
        pending = self.pending[request.request_id]
        pending.add(kept(target.extras[FEATURES], target.rows), target.emitted)  # [len(rows), hidden]
        if len(pending) > MAX_PENDING:
            self.overdue.add(request.request_id)

    def observe_plain(self, requests: Sequence[Request], step: StepOutput, tokens: Sequence[int], vocab_limit: int | None) -> None:
        """observe for the requests that took no drafts: each one's row 0 of the step's features, with its token."""
        feats = step.extras[FEATURES]  # [n, width, hidden]
        for r, t in zip(requests, tokens, strict=True):
            if r.draft_len != 0:
                pending = self.pending[r.request_id]
                pending.add_one(feats[r.slot, 0], t)
                if len(pending) > MAX_PENDING:
                    self.overdue.add(r.request_id)

    def backlog(self, request: Request) -> int:
        pending = len(self.pending[request.request_id])
        return pending if pending > CATCH_UP_AFTER else 0

    def catch_up(self, requests: Sequence[Request]) -> int:
        """Feed the long backlogs (a prompt, the tokens of rounds without drafts): one call per run of adjacent slots."""
        slots = sorted(self.slot_of[r.request_id] for r in requests if self.backlog(r))
        runs = adjacent_runs(slots)
        fed = sum(len(self.pending[self.order[s]]) for s in slots)
        for run in runs:
            self._catch_up(run[0], run[-1] + 1, {self.order[s] for s in run})
        return fed

    # -- a round ------------------------------------------------------------------------
    def propose(self, requests: Sequence[Request], draft_lens: Sequence[int]) -> list[Draft]:
        want = {r.request_id: (i, int(k)) for i, (r, k) in enumerate(zip(requests, draft_lens, strict=True)) if k > 0}
        out = [Draft.empty() for _ in requests]
        if not want:
            return out
        slots = sorted(self.slot_of[rid] for rid in want)
        lo, hi = slots[0], slots[-1] + 1
        self._catch_up(lo, hi, want)
        real = self.cache.lengths[lo:hi].copy()
        ids = self.order[lo:hi]
        try:
            if self.tree is not None:  # every request, greedy or sampled; its levels never advance the cache
                self._draft_tree(lo, ids, want, requests, out)
            else:
                self._draft_chain(lo, ids, want, requests, out)
        finally:
            self.cache.lengths[lo:hi] = real  # only real pairs stay between rounds
        return out

    def _call(self, lo: int, tokens, hidden: np.ndarray, advance: np.ndarray, all_logits: bool, parents=None) -> StepOutput:
        """One module call on slots lo..: rows of tokens (ragged allowed) and their hidden_states [n, width, hidden];
        its logits and hidden_out ([n, rows, hidden])."""
        return self.module.forward(self.cache, tokens, all_logits=all_logits, advance=advance, first_slot=lo, parents=parents,
                                   extra_inputs={HIDDEN_IN: hidden})

    def _catch_up(self, lo: int, hi: int, want) -> None:
        """Feed the pending real pairs of the requests ``want`` among slots lo..hi (one ragged call; one call per slot
        when a row riding along would write past the cache's capacity)."""
        ids = self.order[lo:hi]
        todo = np.array([rid in want and len(self.pending[rid]) > 0 for rid in ids])
        if not todo.any():
            return
        width = max(len(self.pending[rid]) for rid, go in zip(ids, todo, strict=True) if go)
        if hi - lo > 1 and int(self.cache.lengths[lo:hi].max()) + width > self.cache.capacity:
            for s in range(lo, hi):
                if todo[s - lo]:
                    self._catch_up(s, s + 1, want)
            return
        tokens = [self.pending[rid].tokens if go else [0] for rid, go in zip(ids, todo, strict=True)]
        hidden = np.zeros((len(ids), width, self.module.model.hidden_size), np.float32)  # [n, width, hidden], rows padded
        for i in np.flatnonzero(todo):
            pending = self.pending[ids[i]]
            hidden[i, : len(pending)] = pending.features
        step = self._call(lo, tokens, hidden, todo, all_logits=False)  # logits [n, 1, vocab]: each row's last pair
        for i in np.flatnonzero(todo):
            rid = ids[i]
            self.next_logits[rid], self.next_hidden[rid] = step.logits[i, 0].copy(), step.extras[HIDDEN_OUT][i, 0].copy()
            self.pending[rid].drop(len(self.pending[rid]))
            self.overdue.discard(rid)

    def _draft_chain(self, lo: int, ids: list[str], want: dict, requests: Sequence[Request], out: list[Draft]) -> None:
        lens = np.array([want[rid][1] if rid in want else 0 for rid in ids], np.int64)
        reqs = [requests[want[rid][0]] if rid in want else None for rid in ids]
        sampled = [r is not None and not r.config.sampling.greedy for r in reqs]
        drafts = np.zeros((len(ids), int(lens.max())), np.int64)
        probs: list[list[np.ndarray]] = [[] for _ in ids]
        logits = np.stack([self.next_logits.get(rid, np.zeros(self.module.vocab_size, np.float32)) for rid in ids])  # [n, vocab]
        hidden = np.stack([self.next_hidden.get(rid, np.zeros(self.module.model.hidden_size, np.float32)) for rid in ids])  # [n, hidden]
        for j in range(int(lens.max())):
            for i in np.flatnonzero(lens > j):
                r = reqs[i]
                if r.processor is not None and (sampled[i] or not r.processor.plain):  # its chain, with its drafts so far as history
                    t, q = r.processor.pick(logits[i], drafts[i, :j], r.rng)
                    drafts[i, j] = t
                    if sampled[i]:
                        probs[i].append(q)
                elif sampled[i]:
                    q = processed_probs(logits[i : i + 1], r.config.sampling)[0]
                    drafts[i, j] = sample(q, r.rng)
                    probs[i].append(q)
                else:
                    drafts[i, j] = int(logits[i].argmax())
            if j + 1 == int(lens.max()):
                break
            go = lens > j + 1
            step = self._call(lo, drafts[:, j : j + 1], hidden[:, None], go, all_logits=False)
            logits, hidden = step.logits[:, 0].copy(), step.extras[HIDDEN_OUT][:, 0].copy()  # [n, vocab], [n, hidden]
        for i, rid in enumerate(ids):
            if rid in want:
                k = int(lens[i])
                out[want[rid][0]] = Draft(drafts[i, :k].copy(), np.stack(probs[i][:k]) if probs[i] else None)

    def _draft_tree(self, lo: int, ids: list[str], want: dict, requests: Sequence[Request], out: list[Draft]) -> None:
        tree = self.tree
        n, nodes = len(ids), len(tree)
        tokens = np.zeros((n, nodes), np.int64)
        feed_hidden = np.zeros((n, nodes, self.module.model.hidden_size), np.float32)  # each node's input: its parent's hidden_out
        go = np.flatnonzero([rid in want for rid in ids])
        # sampled requests: each node's children drawn without replacement from its processed distribution (kept for
        # recursive rejection sampling), per request i: [nodes, vocab] the distributions, [nodes] which nodes were drawn
        sampled = {int(i): requests[want[ids[i]][0]] for i in go if not requests[want[ids[i]][0]].config.sampling.greedy}
        takes = {i: min(want[ids[i]][1], nodes) for i in sampled}  # the nodes it drafts: a prefix of the tree
        probs = {i: np.zeros((takes[i], self.module.vocab_size), np.float64) for i in sampled}
        drawn = {i: np.zeros(takes[i], bool) for i in sampled}

        def children(i: int, row: np.ndarray, parent: int, kids: np.ndarray) -> None:
            """Fill request i's nodes ``kids`` (every child of ``parent``, in order) from the module's row at the parent."""
            if i not in sampled:
                tokens[i, kids] = top_k(row, int(tree.ranks[kids].max()) + 1)[tree.ranks[kids]]
                return
            kids = kids[kids < takes[i]]  # (siblings are adjacent: a prefix of them)
            if not len(kids) or (parent >= 0 and not drawn[i][parent]):
                return  # past its nodes, or under a node its parent's distribution had no draw left for (no path to process)
            path = []
            while parent >= 0:
                path.append(int(tokens[i, parent]))
                parent = int(tree.parents[parent])
            q = draft_distribution(sampled[i], row, path[::-1])
            draws = sample_distinct(q, len(kids), sampled[i].rng)
            tokens[i, kids[: len(draws)]] = draws
            drawn[i][kids[: len(draws)]] = True
            probs[i][kids] = q

        first = np.flatnonzero(tree.depths == 1)
        for i in go:
            children(int(i), self.next_logits[ids[i]], -1, first)
            feed_hidden[i, first] = self.next_hidden[ids[i]]
        need = min(max(k for _, k in want.values()), nodes)  # the nodes any request takes: deeper levels are not drafted
        riding = np.zeros(n, bool)  # no row advances: the module's cache keeps its real pairs, the tree is re-fed per level
        for depth in range(1, int(tree.depths[:need].max())):
            upto = int((tree.depths <= depth).sum())  # nodes are ordered by depth: re-feed the tree so far
            parents = tree.parents[:upto]  # -1: a child of the last real pair (the cache's last row)
            step = self._call(lo, tokens[:, :upto], feed_hidden[:, :upto], riding, all_logits=True, parents=[parents] * n)
            logits, hidden_out = step.logits, step.extras[HIDDEN_OUT]  # [n, upto, vocab], [n, upto, hidden]
            level = np.flatnonzero(tree.depths == depth + 1)
            for p in np.unique(tree.parents[level]).tolist():  # one top-k (or draw) per parent, shared by its children
                kids = level[tree.parents[level] == p]
                for i in go:
                    children(int(i), logits[i, p], p, kids)
                    feed_hidden[i, kids] = hidden_out[i, p]
        for i, rid in enumerate(ids):
            if rid in want:
                k = min(want[rid][1], nodes)
                if i in sampled:
                    out[want[rid][0]] = drawn_tree(tree, tokens[i, :k], probs[i], drawn[i])  # (it copies the tokens)
                else:
                    out[want[rid][0]] = Draft(tokens[i, :k].copy(), parents=tree.parents[:k].copy(), depths=tree.depths[:k].copy(),
                                              tree_index=np.arange(k))


# -- the method's registration (runtime/methods.py: an eagle target carries it) -----------------------------------
@dataclass(frozen=True)
class EagleConfig(DraftTreeConfig):
    """EAGLE-3 drafting with the module in a --speculative_decoding_mode eagle target's eagle/ folder: a draft tree, or chains."""


METHOD = own_drafter_method(
    EagleProposer, EagleConfig,
    'A --speculative_decoding_mode eagle target: the draft tree, as --medusa_choices, e.g. "[[0],[1],[0,0],[0,1],[0,0,0]]" '
    "[default: a chain of --draft_len drafts, 4].")
