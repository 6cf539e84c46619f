"""How many drafts each request takes per round: the one seam between the round and the cost model.

The round (runtime/round.py) calls its policy at named points, and nowhere else:

    begin(reqs, round_index)                 a round starts for these requests
    declines_all(method, proposer, running)  no draft_len=auto request of the method takes any this round (asked
                                             once per method and round, before the requests)
    declines(r, proposer, running)           r takes none this round, whatever its room (asked first)
    draft_len(r, proposer, limit, running)   how many drafts r takes, at most ``limit`` (the round's bound)
    fit(reqs, drafts)                        the drafts the round verifies (a policy may cut them); asked where a
                                             request was granted drafts
    proposed(method, rows, steps, seconds, fed, catch_up_seconds, refined)
                                             a proposer's call: its draft steps and its catch-up, timed (refined: a
                                             P-EAGLE round's refining calls and their seconds, apart)
    verified(rows, width, seconds)           the target's call and the per-row work after it, timed
    observed(r, draft, accepted, path, emitted)
                                             what the target kept of r's draft (a tree's: the nodes of its path) and
                                             the tokens it emitted (rounds where r drafted)

``FixedDraftPolicy``: each request drafts its own draft_len; nothing measured,
nothing cut. ``AutoDraftPolicy`` (the Engine's): the same for those, and for
``draft_len="auto"`` requests the length the cost model (runtime/draft_len.py:
``AutoDraftLen``, measured step costs and per-request acceptance) expects to
pay, every request's outcome teaching it the methods' acceptance; and for a
P-EAGLE drafter with ``--peagle_refine auto``, every request's refining calls
(``Request.refine_calls``), with the length (auto) or for its own length.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import Protocol

import numpy as np

from .draft_len import EXPLORE_ROUNDS, HORIZON, PROBE_BACKLOG, AutoDraftLen
from .proposers.base import Draft, Proposer
from .request import AUTO, Request


class DraftPolicy(Protocol):
    def begin(self, reqs: Sequence[Request], round_index: int) -> None:
        """A round starts for ``reqs`` (the running requests); ``round_index`` counts rounds from 1."""

    def draft_len(self, r: Request, proposer: Proposer, limit: int, running: int) -> int:
        """How many drafts ``r`` takes this round, from 0 to ``limit`` (> 0: the target's max_draft_len, the request's
        and its cache's room, the proposer's own); ``running``: the requests in the batch."""

    def declines_all(self, method: str, proposer: Proposer, running: int) -> bool:
        """True where no draft_len=auto request of ``method`` takes drafts this round: they are not asked one by one."""

    def declines(self, r: Request, proposer: Proposer, running: int) -> bool:
        """True where ``r`` takes no drafts this round whatever its room (asked before its room is worked out)."""

    def fit(self, reqs: Sequence[Request], drafts: list[Draft]) -> list[Draft]:
        """The drafts to verify, request i's in drafts[i]: all of them, or prefixes (a static tree: the nodes that pay)."""

    def proposed(self, method: str, rows: int, steps: int, seconds: float, fed: int, catch_up_seconds: float,
                 refined: tuple[int, float] = (0, 0.0)) -> None:
        """One proposer's call for ``rows`` requests: ``steps`` drafts deep in ``seconds``, after feeding ``fed`` tokens
        its model had not seen in ``catch_up_seconds``; ``refined``: then (calls, seconds) of refining calls. rows 0: a
        feed alone (backlogs past the proposer's bound, Proposer.overdue), nothing drafted."""

    def verified(self, rows: int, width: int, seconds: float) -> None:
        """The target's call of ``rows`` x ``width`` tokens and the per-row work after it took ``seconds``."""

    def observed(self, r: Request, draft: Draft, accepted: int, path: Sequence[int] = (), emitted: Sequence[int] = ()) -> None:
        """The target kept ``accepted`` of ``r``'s ``draft``: a tree's nodes ``path``, from the root; it emitted ``emitted``
        (the kept drafts, then its own token). Called where r drafted: a round without drafts has nothing to teach."""


class FixedDraftPolicy:
    """Each request takes its own draft_len (at most the round's limit): nothing is measured or cut."""

    def begin(self, reqs: Sequence[Request], round_index: int) -> None:
        pass

    def draft_len(self, r: Request, proposer: Proposer, limit: int, running: int) -> int:
        return min(int(r.draft_len), limit)

    def declines_all(self, method: str, proposer: Proposer, running: int) -> bool:
        return False

    def declines(self, r: Request, proposer: Proposer, running: int) -> bool:
        return False

    def fit(self, reqs: Sequence[Request], drafts: list[Draft]) -> list[Draft]:
        return drafts

    def proposed(self, method: str, rows: int, steps: int, seconds: float, fed: int, catch_up_seconds: float,
                 refined: tuple[int, float] = (0, 0.0)) -> None:
        pass

    def verified(self, rows: int, width: int, seconds: float) -> None:
        pass

    def observed(self, r: Request, draft: Draft, accepted: int, path: Sequence[int] = (), emitted: Sequence[int] = ()) -> None:
        pass


class AutoDraftPolicy(FixedDraftPolicy):
    """draft_len="auto" requests draft what ``cost`` (AutoDraftLen) expects to pay; the others take their own length.
    Costs are measured in the rounds that have an auto request; every request's outcome counts for its method."""

    def __init__(self, cost: AutoDraftLen):
        self.cost = cost
        self.round_index = 0
        self.timed = False  # this round has an auto request: its costs are measured
        self.reqs: Sequence[Request] = ()
        self.paying: dict[str, bool] = {}
        self.best: dict[str, float] = {}
        self.best_scale: dict[str, float] = {}

    def begin(self, reqs: Sequence[Request], round_index: int) -> None:
        self.round_index = round_index
        # this round has an auto request (or one whose refining calls are chosen): step costs feed those choices only
        refining = self.cost.refining
        self.timed = any(r.draft_len == AUTO or r.method in refining for r in reqs)
        if self.timed:  # (only auto requests read these: a round without one allocates nothing)
            self.reqs = reqs
            self.paying = {}  # method -> whether any of its requests may draft this round (may_draft)
            self.best = {}  # method -> the best acceptance among its auto requests in the batch, when may_draft asks
            self.best_scale = {}  # method -> the best tree_scale among its auto requests (static trees), likewise

    def best_acceptance(self, method: str) -> float:
        """The best acceptance among the round's auto requests of ``method`` (worked out only when may_draft needs it: at a
        batch size where even a perfect drafter does not pay, no request's acceptance is read)."""
        best = self.best.get(method)
        if best is None:
            counts = ((m.accepted, m.rejected) for r in self.reqs if r.draft_len == AUTO and r.method == method for m in (r.metrics,))
            best = self.best[method] = self.cost.best_acceptance(method, counts)
        return best

    def best_tree_scale(self, method: str) -> float:
        """The best AutoDraftLen.tree_scale among the round's auto requests of ``method`` (a static tree's), worked out
        when may_draft needs it."""
        tree_scale = self.cost.tree_scale
        return self._best(self.best_scale, method, lambda r: tree_scale(r.metrics.accepted, r.auto_expected), 0.0)

    def _best(self, memo: dict[str, float], method: str, score, default: float) -> float:
        """The round's largest ``score(r)`` over its auto requests of ``method``, worked out once per round."""
        best = memo.get(method)
        if best is None:
            best = memo[method] = max((score(r) for r in self.reqs if r.draft_len == AUTO and r.method == method), default=default)
        return best

    def declines_all(self, method: str, proposer: Proposer, running: int) -> bool:
        """True where the method may not draft this round (may_draft): none of its auto requests is asked (a full batch
        where nothing pays costs one check a round, not one per request); each one's auto_k is 0, as declines sets it."""
        if not self.timed or self.may_draft(method, proposer, running):
            return False
        for r in self.reqs:
            if r.draft_len == AUTO and r.method == method:
                r.auto_k = 0
        return True

    def declines(self, r: Request, proposer: Proposer, running: int) -> bool:
        """True where r takes no drafts this round whatever its room: an auto request of a method that may not draft."""
        if r.draft_len != AUTO or self.may_draft(r.method, proposer, running):
            return False
        r.auto_k = 0
        return True

    def may_draft(self, method: str, proposer: Proposer, running: int) -> bool:
        """Whether any request of ``method`` may draft this round, decided once per round and method: no, where not even a
        perfect drafter would pay at this batch size (AutoDraftLen.pays_at; probes included); no, outside probe rounds,
        where a chain drafter (a draft model, n-gram, an EAGLE chain) would not pay even at the batch's best acceptance,
        or no nodes of a static tree (Medusa, EAGLE, P-EAGLE) even at the batch's best scale, each with the batch's
        lightest catch-up (least_catch_up), so that a full batch where nothing pays costs one check, not a choice per
        request."""
        paying = self.paying.get(method)
        if paying is None:
            cost = self.cost
            paying = cost.pays_at(method, running)
            if paying and not proposer.scores_drafts and not cost.probe_due(self.round_index, running):
                if proposer.tree is None:
                    best = self.best_acceptance(method)
                    pays = partial(cost.pays_at, method, running, best)
                else:  # no nodes of a tree pay for any request where none pay for the best one (choose_nodes)
                    best_nodes = partial(cost.choose_nodes, method, len(proposer.tree), self.best_tree_scale(method), running)
                    pays = lambda catch_up_s=0.0: len(best_nodes(catch_up_s)) > 0  # noqa: E731
                paying = pays()
                if paying:  # ... nor with the batch's lightest catch-up (requests whose draft has not read their text)
                    spread = self.least_catch_up(method, proposer, running)
                    paying = spread == 0.0 or pays(catch_up_s=spread * HORIZON)
            self.paying[method] = paying
        return paying

    def least_catch_up(self, method: str, proposer: Proposer, running: int) -> float:
        """The smallest catch-up a round of ``method`` would spread over each token it makes, among the round's auto
        requests of it (draft_len's ``catch_up_s / min(left, HORIZON)``; 0 once one request's draft is caught up). With
        the best acceptance it bounds every request's speed: where even that pair does not pay, none does, and a full
        batch of requests whose drafts have not read their prompts costs one check a round, not a choice per request."""
        cost, least = self.cost, None
        for r in self.reqs:
            if r.draft_len != AUTO or r.method != method:
                continue
            backlog = proposer.backlog(r)
            if not backlog:
                return 0.0
            left = r.config.max_output_len - len(r.output_ids)
            spread = cost.catch_up_cost(method, backlog, running) / max(min(left, HORIZON), 1)
            if spread <= 0.0:
                return 0.0
            least = spread if least is None else min(least, spread)
        return least or 0.0

    def draft_len(self, r: Request, proposer: Proposer, limit: int, running: int) -> int:
        if r.draft_len != AUTO:
            k = min(int(r.draft_len), limit)  # FixedDraftPolicy's, inline: this runs per request per round
            if r.method in self.cost.refining:
                self.refine_calls(r, k, running)
            return k
        if not self.may_draft(r.method, proposer, running):
            r.auto_k, r.refine_calls = 0, 0
            return 0
        cost, rounds = self.cost, self.round_index
        if proposer.scores_drafts:  # proposes its best, then ``fit`` keeps a prefix ... unless none paid last time and
            # proposing costs enough to be worth saving (AutoDraftLen.worth_skipping): then only in probe rounds
            skip = r.auto_k == 0 and not cost.probe_due(rounds, running) and cost.worth_skipping(r.method, running, limit)
            return 0 if skip else limit
        # a draft model or EAGLE module that has not read the prompt yet: drafting first costs a prefill
        backlog = proposer.backlog(r)
        catch_up_s = cost.catch_up_cost(r.method, backlog, running)
        left = r.config.max_output_len - len(r.output_ids)
        if proposer.tree is not None:  # a static tree: the nodes that pay, and its first nodes up to them drafted
            keep = r.auto_nodes = cost.choose_nodes(r.method, limit, cost.tree_scale(r.metrics.accepted, r.auto_expected), running,
                                                    catch_up_s, left)
            k = int(keep[-1]) + 1 if len(keep) else 0
            if k and cost.probe_due(rounds, running):  # the whole tree, on the probe rounds: the nodes it leaves out are measured
                k, r.auto_nodes = limit, None
        elif r.method in cost.refining:  # P-EAGLE --peagle_refine auto: the drafts and the refining calls, together
            current = (r.auto_k, r.auto_refine or 0) if r.auto_k is not None else None
            k, n = cost.choose_refined(r.method, r.metrics.accepted, r.metrics.rejected, limit, running, current, catch_up_s, left)
            r.auto_k, r.auto_refine = k, n
            r.refine_calls = self.exploring(r, k, running) or n
        else:
            k = cost.choose(r.method, r.metrics.accepted, r.metrics.rejected, limit, running, r.auto_k, catch_up_s, left)
            r.auto_k = k
        # look again, all at once: the text may have changed. Not a request whose draft never read its prompt, unless
        # the prompt is short (that probe would be a prefill on the draft, for one token) or the method has hardly
        # drafted yet (its acceptance is still the prior: without probes it would stay that) and the request has
        # tokens enough left that a perfect drafter would repay the prefill
        if k == 0 and cost.probe_due(rounds, running) and (
                r.metrics.drafting_rounds or backlog <= PROBE_BACKLOG
                or (cost.drafting_rounds.get(r.method, 0) < EXPLORE_ROUNDS and cost.pays_at(r.method, running, catch_up_s=catch_up_s, left=left))):
            k = limit if proposer.tree is not None else 1
            r.auto_nodes = None  # a probe verifies what it drafts: every node's acceptance is measured so
        return k

    def refine_calls(self, r: Request, k: int, running: int) -> None:
        """A fixed-length request's refining calls this round (``r.refine_calls``), for its k drafts: the most while the
        method explores and in probe rounds (a request whose drafts measure them), else the number the cost model expects
        to pay; none for a single draft."""
        if k <= 1:
            r.refine_calls = 0
            return
        r.refine_calls = self.exploring(r, k, running)
        if not r.refine_calls:
            current = (k, r.auto_refine) if r.auto_refine is not None else None
            r.refine_calls = r.auto_refine = self.cost.choose_refined(r.method, r.metrics.accepted, r.metrics.rejected, k, running, current,
                                                                      left=r.config.max_output_len - len(r.output_ids), draft_len=k)[1]

    def exploring(self, r: Request, k: int, running: int) -> int:
        """The refining calls r makes this round to measure what every number of calls buys (record_fewer): as many as its
        k drafts take while the method explores and in probe rounds, where its drafts can measure them; else 0."""
        cost = self.cost
        if k > 1 and measures_refining(r) and (cost.exploring_refines(r.method) or cost.probe_due(self.round_index, running)):
            return min(cost.refining[r.method], k - 1)
        return 0

    def fit(self, reqs: Sequence[Request], drafts: list[Draft]) -> list[Draft]:
        """Scored drafts cut to the prefix that pays at this batch size, static trees to the nodes chosen for them, then
        every auto request's draft to the width that pays for the whole batch (probe rounds keep their width: they are
        how estimates update)."""
        if not self.timed:
            return drafts
        running = len(reqs)
        drafts = [d if r.draft_len != AUTO else self.prefix(r, d, running) if d.scores is not None
                  else chosen_nodes(d, r.auto_nodes) if d.tree_index is not None else d for r, d in zip(reqs, drafts, strict=True)]
        if running > 1 and not self.cost.probe_due(self.round_index, running):
            drafts = self.batch_cap(reqs, drafts)
        return drafts

    def prefix(self, r: Request, d: Draft, running: int) -> Draft:
        """The prefix of a scored draft that draft_len=auto expects to pay (or nothing, but in probe rounds)."""
        k = self.cost.choose_scored(r.method, d.scores, running)
        r.auto_k = k if len(d) else None  # 0: a draft that did not pay: skip proposing until a probe round, if that saves much
        if k == 0 and len(d) and self.cost.probe_due(self.round_index, running):
            k = 1
        return d if k == len(d) else d.prefix(k)

    def batch_cap(self, reqs: Sequence[Request], drafts: list[Draft]) -> list[Draft]:
        """The auto requests' drafts cut to the call width that pays for the whole batch (AutoDraftLen.batch_width):
        the call is as wide as its widest row, for every row."""
        auto = [i for i, r in enumerate(reqs) if r.draft_len == AUTO and len(drafts[i])]
        if not auto:
            return drafts
        floor = 1 + max((len(d) for r, d in zip(reqs, drafts, strict=True) if r.draft_len != AUTO), default=0)
        # every row counts: one without drafts makes its token at any width, and pays for the widest row all the same
        curves = [[1.0]] * len(reqs)
        firsts: dict[int, np.ndarray] = {}  # a static tree's nodes, best first
        for i in auto:
            d = drafts[i]
            if d.tree_index is not None:
                firsts[i] = self.best_first(reqs[i], d)
            curves[i] = self.expected_curve(reqs[i], d, firsts.get(i))
        width = self.cost.batch_width(curves, len(reqs), floor)
        out = list(drafts)
        for i in auto:
            d = drafts[i]
            if len(d) >= width:  # chains and scored drafts keep a prefix, static trees their best nodes
                out[i] = d.prefix(width - 1) if i not in firsts else d.nodes(np.sort(firsts[i][: width - 1]).tolist())
        return out

    def best_first(self, r: Request, d: Draft) -> np.ndarray:
        """[len(d)] a static tree draft's nodes (their places in ``d``), best first by the method's node values (ties: in
        order): every first n of them is a tree, as AutoDraftLen.node_values orders them."""
        return np.argsort(-self.cost.node_values(r.method)[0][d.tree_index], kind="stable")

    def expected_curve(self, r: Request, d: Draft, first: np.ndarray | None = None) -> list[float]:
        """[k] request r's expected tokens this round if it keeps at most k of its drafts ``d`` (k = 0..len(d)); ``first``:
        a static tree draft's best_first, when known."""
        cost = self.cost
        if d.scores is not None:  # suffix: 1 + the calibrated sum of the kept nodes' scores
            return [1.0, *(1.0 + cost.calibration(r.method) * np.cumsum(d.scores)).tolist()]
        if d.tree_index is not None:  # a static tree: 1 + the values of its best nodes, scaled to the request
            values = cost.node_values(r.method)[0][d.tree_index[self.best_first(r, d) if first is None else first]]
            scale = cost.tree_scale(r.metrics.accepted, r.auto_expected)
            return [1.0, *(1.0 + np.cumsum(np.minimum(scale * values, 0.999))).tolist()]
        a = cost.acceptance(r.method, r.metrics.accepted, r.metrics.rejected)
        if r.method in cost.refining:  # drafted with its refining calls: what those buy counts (they are paid for already)
            return cost.expected_refined(r.method, a, len(d), min(r.refine_calls or 0, cost.refining[r.method]))
        return cost.expected_tokens(r.method, a, len(d))

    def proposed(self, method: str, rows: int, steps: int, seconds: float, fed: int, catch_up_seconds: float,
                 refined: tuple[int, float] = (0, 0.0)) -> None:
        if self.timed:
            if fed:
                self.cost.record_catch_up(method, fed, catch_up_seconds)
            calls, refine_s = refined
            if not rows:  # a feed alone
                return
            if method not in self.cost.refining:  # a fixed number of refining calls: a round's price includes them
                seconds, calls = seconds + refine_s, 0
            self.cost.record_draft(method, rows, steps, seconds)
            if calls:
                self.cost.record_refine(method, rows, calls, refine_s, seconds)

    def verified(self, rows: int, width: int, seconds: float) -> None:
        if self.timed:
            self.cost.record_verify(rows, width, seconds)

    def observed(self, r: Request, draft: Draft, accepted: int, path: Sequence[int] = (), emitted: Sequence[int] = ()) -> None:
        k = len(draft)
        if draft.fewer_calls is not None and k:
            self.cost.record_fewer(r.method, len(draft.fewer_calls), fewer_outcomes(draft, emitted, self.cost.refining.get(r.method, 0)), k)
        if draft.tree_index is not None and k:
            nodes = draft.tree_index.tolist()
            if r.draft_len == AUTO:
                r.auto_expected += self.cost.promised(r.method, nodes)
            self.cost.record_tree(r.method, nodes, [nodes[j] for j in path])
        self.cost.record_round(r.method, k, accepted)
        if draft.scores is not None and k:
            self.cost.record_scored(r.method, float(draft.scores.sum()), accepted)


def measures_refining(r: Request) -> bool:
    """Whether r's drafts tell what refining calls buy (Draft.fewer_calls): a greedy request whose picks are the block's
    most likely tokens. A sampled one would pay for the most calls in exploring rounds and learn nothing."""
    proc = r.processor
    return r.config.sampling.greedy and (proc is None or proc.plain)


def fewer_outcomes(d: Draft, emitted: Sequence[int], cap: int) -> list[tuple[int, bool]]:
    """[m] (drafts kept, missed) for the chain m refining calls would have drafted (m = 0..the calls made: ``d.fewer_calls``
    then ``d`` itself; up to ``cap`` where ``d`` was settled, its k - 1 calls made), judged by the tokens the target
    ``emitted`` (greedy: its own after the drafts it kept, so each is the target's token after the ones before). missed:
    its next draft was not the target's; False where it kept all, or where it matches every emitted token and goes on
    (censored: whether its next draft would have been kept was not computed)."""
    fewer = d.fewer_calls
    assert fewer is not None
    chains = [*fewer.tolist(), d.tokens.tolist()]
    if len(fewer) >= len(d) - 1:  # settled: more calls draft the same
        chains += [chains[-1]] * max(cap + 1 - len(chains), 0)
    out = []
    for chain in chains:
        kept = 0
        while kept < len(chain) and kept < len(emitted) and chain[kept] == emitted[kept]:
            kept += 1
        out.append((kept, kept < len(chain) and kept < len(emitted)))
    return out


def chosen_nodes(d: Draft, nodes: np.ndarray | None) -> Draft:
    """A static tree's draft cut to the tree's ``nodes`` (None: all it drafted). A draft may lack some of them (a sampled
    node's distribution had fewer tokens than children, a grammar cut one): the rest is still a tree."""
    if nodes is None or not len(d):
        return d
    if int(d.tree_index[-1]) == len(d) - 1:  # the tree's first len(d) nodes, none left out: places are tree indices
        keep = nodes[nodes < len(d)]
    else:
        keep = np.flatnonzero(np.isin(d.tree_index, nodes))
    return d if len(keep) == len(d) else d.nodes(keep.tolist())
