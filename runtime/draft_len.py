"""``draft_len=auto``: the draft length that maximises expected tokens per second, each round.

For a request whose drafts survive with per-token probability ``a``, a round
of ``k`` drafts yields ``(1 - a^(k+1)) / (1 - a)`` tokens on average
(Leviathan et al. 2023) and costs ``k * t_draft + t_verify(k + 1)``. Both
costs are measured as the engine runs, per batch size ``n`` (a round of 8
requests verifying 5 tokens each is a different call from one request's):
``t_verify(n, w)``, the target call of ``n`` rows of width ``w`` and the
per-row work after it (acceptance, rollback, the proposers' updates: on a
small model that work is a real share of a round), not flat on a CPU, where
verifying 9 tokens costs more than verifying 1 (a batch size timed at one
width only takes its slope per width from every call's cost per computed
token, times ``n``: at 16 rows a CPU is compute-bound and a second token per
row costs most of a step), and
``t_draft(n)``, one draft step of the method over ``n`` rows. The policy
picks the k in ``0..limit`` with the most tokens per second; k = 0 (no
drafting) wins when drafts do not pay, so auto never loses to target-only
by more than its probes.

``a`` is the request's own acceptance so far, shrunk towards the method's
acceptance over every request (a Beta prior worth ``PRIOR_WEIGHT`` drafts), so
a new request starts from what the method has shown. Drafts are not equally
likely to survive at every position (an n-gram draft that got its first
token right is copying the right passage, and its later tokens survive more
often), so the expected tokens use the method's measured acceptance at each
position given the ones before it, scaled by how the request compares with
the method: ``1 + sum_j prod_{i<=j} c_i`` (the geometric formula when every
``c_i`` is ``a``). Requests at k = 0 draft once more every ``PROBE_EVERY``
rounds, so a change in the text (a copy-heavy stretch for n-gram) is noticed.
A request keeps its k until
another promises ``STICKY`` (5%) more: each new call width is a new shape for
the backend, and estimates are noisy. Drafting at all (k > 0, a tree, a wider
batch call) must promise ``DRAFT_MARGIN`` (10%) more than not drafting: the
best of several noisy estimates is biased upwards (the winner's curse), and a
drafting round pays costs the estimate leaves out (a new call shape, a
draft's catch-up, desynchronised rows). Measured at 8 streams on the 325M
pair on a CPU, k = 1 came out 1-5% ahead of k = 0 by the estimate, and
drafting at those break-even points cost 6-19% of target-only's throughput.

A drafter that drafts any number of tokens in one call (P-EAGLE; ``one_call``, the methods whose proposer says
``drafts_in_one_call``) is timed per round, not per draft, and a round of k > 0 drafts costs one such call:
``t_round(n, k) + t_verify(k + 1)``. The call computes a row per drafted position, which is nearly free at batch 1
(measured on a CPU, the 325M pair: a round of 8 drafts 1.19x a round of 1) and is not at batch 16 (3.02x), so
``t_round(n, k)`` is a line over k fitted to the rounds' timings per batch size, like ``t_verify``: until two draft
lengths were timed at a batch size, the nearest batch size's line scaled to this one's own timings, and flat (one call's
cost whatever k) while no batch size has one. The line only raises the one call's price (the rounds' average), for long
rounds: lowering it for short ones made auto draft where nothing paid. A tree is priced by its nodes, as timed.

A drafter that can refine its block (P-EAGLE with ``--peagle_refine auto``: ``refining``, method -> the most calls)
is priced per round at (k, n): k drafts and n refining calls after the one call (``choose_refined``). A refining call
costs ``refine_share`` of the round's one call, timed per batch size (the nearest batch size's, 1 before any). What n
calls buy comes from the rounds themselves: a round that made n calls also drafted, for free, what m < n calls would
have drafted (the block's most likely tokens after call m; positions 1..m + 1 are the same as drafted), and a greedy
request's verification tells whether each of those drafts would have been kept, as far as the target's tokens go
(``record_fewer``): past them a draft is censored (its kept drafts a lower bound). The expected tokens with no
refining call come from every greedy round's acceptance at each position; with n calls, plus the drafts n calls kept
more than none in the rounds that measured n (``expected_refined``: a difference on the same text; the requests that
refine are the ones that chose to, so their own acceptance says more of them than of the calls). Rounds refine as far
as a chain can (k - 1 calls) until REFINE_EXPLORE rounds measured every n, and in probe rounds after, so a number of
calls that does not pay now is still measured. Sampled requests choose by what greedy rounds measured (a draw is not
the block's most likely token: what fewer calls would have drawn is not known).

Trees and scored drafts use the same costs with their own expected tokens:

* a static tree (Medusa, EAGLE-3, P-EAGLE choices) keeps the nodes that pay
  (``choose_nodes``): each node's chance of being on the path the target
  keeps is measured per method (``record_tree``; a prior worth
  ``PRIOR_WEIGHT`` rounds, a deeper node's its parent's share times the
  first level's, before it was), and the n best
  nodes make 1 + the sum of those chances, scaled by how the request's own
  trees fare against them (``tree_scale``). The n with the most tokens per
  second wins (Sequoia's and EAGLE-2's point: the tree that pays depends on
  the hardware and the batch, not only on the drafter), priced at the call's
  width n + 1 and at drafting the tree's first nodes up to the deepest kept;
  none, where no n beats one token per call. A node is never worth more than
  its parent or an earlier sibling, so the best n nodes are always a tree
  whose nodes keep their first children: what a sampled tree's recursive
  rejection sampling needs. A kept node's chance does not depend on which
  other nodes are kept (a greedy node is kept when the target's token is its
  own; a sampled one after its earlier siblings were tried), so the sum holds
  for any such subtree;
* a draft that scores its own nodes (suffix decoding: each node's estimated
  probability of being accepted, from the counts) keeps the best prefix of
  its nodes (``choose_scored``): the expected tokens of k nodes are 1 + c *
  (the sum of their scores), c the method's measured accepted / predicted
  (the scores' calibration).

A draft model that has not been fed a request's text yet (its prompt, held
back until the request first drafts; tokens emitted while it did not draft)
must catch up before it drafts: ``catch_up_s``, measured per method as
seconds per fed token, is paid once and spread over the tokens the request
has left (at most ``HORIZON``). At a full batch that is what keeps auto from
prefilling every prompt on the draft for a k = 1 that gains 5%; a probe is
skipped for a request that has never drafted and whose catch-up would be a
prefill (more than ``PROBE_BACKLOG`` tokens), unless the method itself has
drafted in fewer than ``EXPLORE_ROUNDS`` rounds: with no acceptance measured,
every choice compares drafting against a prior, and without those first
probes a draft model behind long prompts would never draft at all (measured:
`auto` at target-only speed where k = 4 was 1.5x faster). Even then a request
is not probed where a perfect drafter could not repay that prefill in the
tokens it has left (``pays_at`` with its catch-up): on a fresh server, an agent's 8-token
turns behind 200-token prompts each paid a draft prefill for one draft token
(measured: `auto` 0.83x target-only at 1 stream, without the prefix cache).

No request drafts in a round where even a perfect drafter would not pay at this batch size (``pays_at``: k + 1 tokens
(a static tree's first k nodes: their levels + 1) for a call of width k + 1 and k draft steps (``steps``), against one
token per call, with DRAFT_MARGIN): there the
probes, the exploring rounds and the draft model's catch-ups that let auto notice a change could not find a
draft that pays, and would only cost. Outside probe rounds a chain drafter's requests are not priced one by one either when
no draft length would pay even at the batch's best acceptance with its lightest catch-up (runtime/draft_policy.py:
AutoDraftPolicy.may_draft; a static tree likewise at the batch's best scale), so a full batch where nothing pays, a batch
of requests whose drafts have not read their prompts included, costs one check per round, not a choice per request; what deciding costs per round is
measured (``Metrics.decide_s``, the server's ``spec_decode_decision_seconds``).

Probes of requests at k = 0 fall on the same rounds (``probe_due``): a probe
widens the whole batch's target call, so staggered probes would widen almost
every call at high concurrency. For the same reason they come once in
``PROBE_EVERY`` rounds per row of the batch: at 8 rows on a CPU a probe round
cost about 0.75 of a step (a 2-wide call is 1.45x a 1-wide one, and a draft
model catches up every token since its request last drafted), 5% of the time
at one probe in 16 rounds.

The batch's call is as wide as its widest row (the executor pads ragged rows),
so once the drafts are known the round caps them at the width that pays for
the whole batch (``batch_width``): one request with a long suffix match among
15 with none would otherwise make every row pay for a 9-token call while one
row gains from it. Each request's choice above assumes every row drafts as it
does; the cap is what makes that assumption harmless when they do not.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from functools import partial
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from .tree import DraftTree

PRIOR_WEIGHT = 8.0  # drafts' worth of the method-wide acceptance in a request's estimate
PROBE_EVERY = 16  # one round in this many is a probe round for requests at k = 0
STICKY = 0.05  # a new draft length must promise this much more speed than the current one
DRAFT_MARGIN = 0.10  # drafting must promise this much more speed than decoding one token per call
FORGET = 0.05  # weight of a new timing: the fits follow the last ~20 calls
PRIOR_SLOPE = 0.1  # cost of one more verified token, as a share of a 1-token call, before two widths were timed
HORIZON = 128  # tokens over which a catch-up is spread at most (a request's max_tokens may be far above its length)
PROBE_BACKLOG = 2 * 16  # a request that never drafted is not probed if that would feed its draft more than this ...
EXPLORE_ROUNDS = 8  # ... unless its method has drafted in fewer rounds than this: auto has nothing else to learn from
PERFECT = 1.0  # pays_at's default acceptance: every draft accepted
NODE_PRIOR = 0.5  # a static tree's first-level node's chance of being kept before it was measured, over its place
SKIP_SHARE = 0.02  # a scored draft whose proposal costs less than this share of a target step is proposed every round
REFINE_EXPLORE = 32  # greedy chain rounds that refine as far as they can before the refining calls are chosen (a drafter
#                      measured its acceptance with and without refining on 40 rounds of the demo pair: too few to see a gain of 13%)
GAIN_PRIOR = 2.0  # rounds' worth of "refining changes nothing" in the measured gain of n refining calls
REFINE_MARGIN = 0.03  # refining must promise this much more speed than drafting the same k in one call (see choose_refined)


def _survival(c: list[float]) -> list[float]:
    """[k] expected tokens of a round of k = 0..len(c) drafts whose j-th survives with probability c[j] given the ones before."""
    out, survive = [1.0], 1.0
    for cj in c:
        survive *= cj
        out.append(out[-1] + survive)
    return out


def _refined_speed(tokens: float, drafting: float, verify: float, spread: float, n: int, share: float) -> float:
    """A round's expected tokens per second: its one call ``drafting`` s, n refining calls each ``share`` of it, its target
    call ``verify`` s, ``spread`` s per token; refining discounted by REFINE_MARGIN (choose_refined says why)."""
    return tokens / (drafting * (1.0 + n * share) + verify + spread * tokens) / (1.0 + REFINE_MARGIN * (n > 0))


def _moving(old: float | None, new: float) -> float:
    """A moving average's next value (FORGET's weight on the new timing, at most 3x the old one: one stall is not a cost)."""
    return new if old is None else min((1 - FORGET) * old + FORGET * new, 3.0 * old)


def _nearest(table: dict[tuple[str, int], float], method: str, rows: int) -> float | None:
    """``table``'s value for (method, rows), else for the method's nearest batch size in it, else None."""
    value = table.get((method, rows))
    if value is not None:
        return value
    sizes = [n for m, n in table if m == method]
    return table[(method, min(sizes, key=lambda n: abs(n - rows)))] if sizes else None


def _tally(tallies: dict[tuple, list[float]], key: tuple, seconds: float) -> None:
    """One more call of ``key`` into its [calls, seconds] (no default list allocated per call: this runs every round)."""
    tally = tallies.get(key)
    if tally is None:
        tally = tallies[key] = [0, 0.0]
    tally[0] += 1
    tally[1] += seconds


def _means(tallies: dict[tuple, list[float]], prefix: tuple) -> dict:
    """The tallies whose key starts with ``prefix``, by the key's last part: [calls, mean ms]."""
    n = len(prefix)
    return {key[n]: [int(calls), round(s / calls * 1e3, 3)] for key, (calls, s) in sorted(tallies.items()) if key[:n] == prefix}


class _CostLine:
    """seconds = intercept + slope * width, fitted to recent timings (exponentially forgotten
    least squares). One line, not one average per width: a width timed once during a noisy
    moment cannot lock itself out, every timing informs every width."""

    def __init__(self) -> None:
        self.s = [0.0] * 5  # decayed sums of 1, w, w^2, t, w*t (plain floats: this runs every round)
        self._fit: tuple[float, float, float | None] | None = None  # (mean w, mean t, slope) of s, until the next add

    def add(self, width: int, seconds: float) -> None:
        if self.s[0] > 0:
            seconds = min(seconds, 3.0 * self(width))  # one stall (another process, a page fault) is not a cost
        keep = 1.0 - FORGET
        self.s = [keep * a + b for a, b in zip(self.s, (1.0, width, width * width, seconds, width * seconds), strict=True)]
        self._fit = None

    @property
    def measured(self) -> bool:
        return self.s[0] > 0

    def _fitted(self) -> tuple[float, float, float | None]:
        """(mean width, mean seconds, slope or None until two widths were timed), computed once per timing: a round
        asks every width of the same line."""
        fit = self._fit
        if fit is None:
            n, sw, sww, st, swt = self.s
            mean_w, mean_t = sw / n, st / n
            var = sww / n - mean_w * mean_w
            fit = self._fit = (mean_w, mean_t, None if var < 0.1 else max((swt / n - mean_w * mean_t) / var, 0.0))
        return fit

    @property
    def mean(self) -> tuple[float, float]:
        """(width, seconds): the timings' decayed means, the point the line passes through."""
        return self._fitted()[:2]

    @property
    def slope(self) -> float | None:
        """Seconds per unit of width, or None until two widths were timed."""
        return self._fitted()[2]

    def __call__(self, width: int, slope: float | None = None) -> float:
        """Seconds at ``width``; ``slope``: the one to use when this line has seen one width (else PRIOR_SLOPE)."""
        mean_w, mean_t, own = self._fitted()
        if own is None:  # one width seen: the slope given, else the prior one
            own = slope if slope is not None else PRIOR_SLOPE * mean_t
        return max(mean_t + own * (width - mean_w), 1e-9)


class AutoDraftLen:
    def __init__(self, max_draft_len: int, max_batch: int = 1, even_rows: bool = False):
        self.max_draft_len = max_draft_len
        # an engine that pads a step to an even row count (weight_only["even_rows"]): an odd rows x width call
        # computes one token more per row, so it costs what the next width costs, and is timed as that width
        self.even_rows = even_rows
        self.verify = [_CostLine() for _ in range(max_batch + 1)]  # [rows]: a target call of that many rows
        # every call by the tokens it computes (rows x width): a batch size timed at one width only (at 16 streams
        # auto rarely drafts) takes its slope from here, rows x seconds per token. The fixed prior (10% of a call per
        # token) is a 1-row figure; at 16 rows on a CPU a second token per row costs ~60% more, not 10%.
        self.per_token = _CostLine()
        # (rows, width) -> [calls, seconds] the rounds timed (seeds not counted): describe() sets them beside the line, so
        # a report shows which widths the line was fitted on and what they cost (a GPU's cost is no line: flat, then steep)
        self.timed: dict[tuple[int, int], list[float]] = {}
        # (method, rows, drafts) -> [calls, seconds] of the drafting rounds timed, likewise (a one-call drafter's cost by k)
        self.drafts_timed: dict[tuple[str, int, int], list[float]] = {}
        self.draft_s: dict[tuple[str, int], float] = {}  # (method, rows) -> seconds per draft step (moving average)
        self.one_call: set[str] = set()  # methods that draft a round in one call (the Engine fills it): one step per round
        self.round_lines: dict[tuple[str, int], _CostLine] = {}  # (one-call method, rows) -> a round's drafting by its drafts
        self.catch_up_s: dict[str, _CostLine] = {}  # method -> seconds of a catch-up call by the tokens it feeds
        # The first call of a shape pays ONNX Runtime's one-time work for it (memory planning,
        # kernel choice): 10x a step on the enlarged model. It is not a step's cost, so it is not timed.
        self._seen: set[tuple] = set()
        self._memo: dict[int, list[float]] = {}  # rows -> verify_costs, until the next timing
        self.accepted: dict[str, float] = {}  # method -> drafts accepted (every request)
        self.reached: dict[str, float] = {}  # method -> drafts the target reached (accepted + first rejections)
        # method -> [position] drafts accepted / reached there: the acceptance at a position given the ones before
        self.accepted_at: dict[str, list[int]] = {}
        self.reached_at: dict[str, list[int]] = {}
        self._at: dict[str, tuple[float, list[float]]] = {}  # method -> (its acceptance, at each position), until its next round
        self._tokens: dict[str, tuple[float, list[float]]] = {}  # method -> (a, expected_tokens to max_draft_len), likewise
        self.drafting_rounds: dict[str, int] = {}  # method -> rounds that drafted
        self.predicted: dict[str, float] = {}  # method -> the scores of scored drafts, summed (their calibration)
        # static trees (Medusa, EAGLE-3, P-EAGLE choices), filled by the Engine: method -> its proposer's DraftTree
        self.trees: dict[str, DraftTree] = {}
        self.node_counts: dict[str, tuple[list[float], list[float]]] = {}  # method -> rounds each node was (verified, kept)
        self._values: dict[str, tuple[np.ndarray, np.ndarray, list[float], list[int]]] = {}  # method -> _node_values
        self._stale: set[str] = set()  # methods whose tree rounds came after their node_values
        self._levels: dict[str, list[int]] = {}  # method -> [k] the levels of its tree's first k nodes (steps)
        self.scored_accepted: dict[str, float] = {}
        # refining drafters (P-EAGLE --peagle_refine auto), filled by the Engine: method -> the most refining calls a round
        self.refining: dict[str, int] = {}
        # method -> [position] drafts accepted / reached there with no refining call, over every greedy chain round (record_fewer)
        self.unrefined_accepted: dict[str, list[int]] = {}
        self.unrefined_reached: dict[str, list[int]] = {}
        # method -> [n][j - 1] how much more often n refining calls kept a draft at position j than none did, summed over the
        # rounds that measured n with at least j drafts, and those rounds (what n calls buy, measured on the same text as none)
        self.gain_sum: dict[str, list[list[float]]] = {}
        self.gain_rounds: dict[str, list[list[int]]] = {}
        self.refine_rounds: dict[str, int] = {}  # method -> greedy chain rounds that made its most refining calls (measured them all)
        self.refine_ratio: dict[tuple[str, int], float] = {}  # (method, rows) -> a refining call's seconds / the round's one call's
        self.refines_timed: dict[tuple[str, int, int], list[float]] = {}  # (method, rows, calls) -> [rounds, seconds] (describe)

    def describe(self, method: str, rows: int) -> dict:
        """What ``method``'s decisions at ``rows`` requests read, in milliseconds: the target call by width, a draft step,
        a 64-token catch-up, the method's acceptance and drafting rounds, and whether a perfect drafter would pay (for a
        benchmark's report: why auto drafted, or did not); beside the call's line, the widths the rounds timed at ``rows``
        (calls, mean ms: every round of the engine's life, not only the line's recent ones), and the method's drafting
        rounds there by their drafts, likewise (a one-call drafter's round line is fitted on these)."""
        return {"verify_ms": [round(c * 1e3, 3) for c in self.verify_costs(rows)[1:]],
                "rounds_timed": _means(self.timed, (rows,)),
                "drafts_timed": _means(self.drafts_timed, (method, rows)),
                "draft_step_ms": round(self.draft_cost(method, rows, default=float("nan")) * 1e3, 3),
                "catch_up_64_ms": round(self.catch_up_cost(method, 64, rows) * 1e3, 3) if method in self.catch_up_s else None,
                "acceptance": round(self.acceptance(method, 0, 0), 3), "drafting_rounds": self.drafting_rounds.get(method, 0),
                **({"node_values": [round(v, 3) for v in self.node_values(method)[0].tolist()]} if method in self.trees else {}),
                **({"refine_share": round(self.refine_share(method, rows), 3), "refine_rounds": self.refine_rounds.get(method, 0),
                    "refines_timed": _means(self.refines_timed, (method, rows)),
                    "refined_tokens_k2_4": [[round(x, 3) for x in self.expected_refined(method, self.acceptance(method, 0, 0), 4, n)[2:]]
                                            for n in range(self.refining[method] + 1)]} if method in self.refining else {}),
                "perfect_drafter_pays": self.pays_at(method, rows)}

    # -- measurements -------------------------------------------------------------------
    def _first(self, key: tuple) -> bool:
        if key in self._seen:
            return False
        self._seen.add(key)
        return True

    def computed_width(self, rows: int, width: int) -> int:
        """The tokens per row a target call of ``rows`` x ``width`` computes."""
        return width + 1 if self.even_rows and rows * width % 2 else width

    def record_verify(self, rows: int, width: int, seconds: float) -> None:
        width = self.computed_width(rows, width)
        if self._first(("verify", rows, width)):
            return
        if rows < len(self.verify):
            self.verify[rows].add(width, seconds)
        self.per_token.add(rows * width, seconds)
        self._memo.clear()
        _tally(self.timed, (rows, width), seconds)

    def seed_verify(self, costs: dict[tuple[int, int], float]) -> None:
        """Target calls timed before the first round ((rows, width) -> seconds, runtime/step_costs.py), counted as if
        recorded: every batch size timed starts from its own costs, not the prior; the rounds' timings take over."""
        for (rows, width), seconds in sorted(costs.items()):
            width = self.computed_width(rows, width)
            self._seen.add(("verify", rows, width))  # not a first call any more: the rounds' first timing of it counts
            if rows < len(self.verify):
                self.verify[rows].add(width, seconds)
            self.per_token.add(rows * width, seconds)
        self._memo.clear()  # costs a round read before (an engine that served requests first) are stale now

    def seed_draft(self, method: str, steps: dict[int, float], catch_up: dict[int, float]) -> None:
        """A draft model's costs timed before the first round (runtime/step_costs.py measure_draft_costs): rows -> seconds of
        a draft step, tokens -> seconds of a catch-up feed. The rounds' timings take over as they come."""
        for rows, seconds in steps.items():
            self.draft_s[(method, rows)] = seconds
        if catch_up:
            self._seen.add(("catch_up", method))  # not a first call any more: the rounds' first catch-up counts
            line = self.catch_up_s.setdefault(method, _CostLine())
            for tokens, seconds in sorted(catch_up.items()):
                line.add(tokens, seconds)
        self._memo.clear()

    def steps(self, method: str, drafts: int) -> int:
        """Draft steps a round of ``drafts`` drafts costs: one per chain token; one per level of a static tree's first
        ``drafts`` nodes (EAGLE-3 drafts a level in one call, whatever its nodes); one for a one-call drafter."""
        if method in self.one_call:
            return min(drafts, 1)
        if method not in self.trees:
            return drafts
        levels = self.tree_levels(method)
        return levels[min(drafts, len(levels) - 1)]

    def tree_levels(self, method: str) -> list[int]:
        """[k] the levels the first k nodes of the method's static tree span (k = 0..its nodes)."""
        levels = self._levels.get(method)
        if levels is None:
            levels = self._levels[method] = [0, *np.maximum.accumulate(self.trees[method].depths).tolist()]
        return levels

    def record_draft(self, method: str, rows: int, drafts: int, seconds: float) -> None:
        """A round's drafting of ``drafts`` drafts (its longest) over ``rows`` requests took ``seconds``."""
        if self._first(("draft", method, rows, drafts)):  # each shape's first call pays ONNX Runtime's setup
            return
        steps = self.steps(method, drafts)
        _tally(self.drafts_timed, (method, rows, drafts), seconds)
        if method in self.one_call and drafts > 0:  # a tree's round is timed at its nodes drafted, and priced at them (choose_nodes)
            line = self.round_lines.get((method, rows))
            if line is None:
                line = self.round_lines[(method, rows)] = _CostLine()
            line.add(drafts, seconds)
        if steps > 0:
            per = seconds / steps
            self.draft_s[(method, rows)] = _moving(self.draft_s.get((method, rows)), per)

    def record_refine(self, method: str, rows: int, calls: int, seconds: float, first_s: float) -> None:
        """A round's ``calls`` refining calls over ``rows`` requests took ``seconds`` after its one call took ``first_s``."""
        if calls <= 0 or first_s <= 0 or self._first(("refine", method, rows, calls)):  # a new shape's first call: setup
            return
        _tally(self.refines_timed, (method, rows, calls), seconds)
        self.refine_ratio[(method, rows)] = _moving(self.refine_ratio.get((method, rows)), seconds / calls / first_s)

    def refine_share(self, method: str, rows: int) -> float:
        """A refining call's cost as a share of the round's one call at ``rows`` requests: measured, else the nearest batch
        size's, else 1 (a refining call feeds each request its block again, about what the one call feeds)."""
        share = _nearest(self.refine_ratio, method, rows)
        return 1.0 if share is None else share

    def record_fewer(self, method: str, calls: int, outcomes: list[tuple[int, bool]], drafts: int) -> None:
        """A greedy chain round that made ``calls`` refining calls: ``outcomes[m]`` for m = 0..calls (more where its chain was
        settled before: more calls change nothing), (drafts kept, missed): the draft m calls would have made kept that many
        of its drafts, then (missed) had its next one rejected; not missed where it ran out, or where the target's tokens
        stop before its first miss (censored); ``drafts``: the chain's length. A censored draft's positions after those
        the target's tokens cover count, in the gains, at their chance of being kept, the unrefined acceptance from there
        on: it is censored exactly where it beat the drafted chain, so counting them as misses would favour refining,
        and leaving them out would drop the rounds where fewer calls did better."""
        cap, top = self.refining.get(method, 0), self.max_draft_len
        if method not in self.gain_sum:
            self.unrefined_accepted[method], self.unrefined_reached[method] = [0] * top, [0] * top
            self.gain_sum[method] = [[0.0] * top for _ in range(cap + 1)]
            self.gain_rounds[method] = [[0] * top for _ in range(cap + 1)]
        kept0, missed = outcomes[0]
        acc, reach = self.unrefined_accepted[method], self.unrefined_reached[method]
        for j in range(min(kept0, top)):
            acc[j] += 1
            reach[j] += 1
        if missed and kept0 < top:
            reach[kept0] += 1
        width = min(drafts, top)
        p = [(acc[j] + 1) / (reach[j] + 2) for j in range(width)]  # the unrefined acceptance at each position, for the censored

        def kept_at(kept: int, missed: bool) -> list[float]:
            """[position] 1 where the draft was kept, 0 where it was not, its chance where it is censored."""
            out, chance = [1.0] * min(kept, width) + [0.0] * (width - min(kept, width)), 1.0
            if not missed and kept < width:
                for j in range(kept, width):
                    chance *= p[j]
                    out[j] = chance
            return out

        if len(outcomes) > 1:
            none = kept_at(kept0, missed)
            for n, outcome in enumerate(outcomes[1 : cap + 1], 1):
                gains, rounds = self.gain_sum[method][n], self.gain_rounds[method][n]
                for j, (x, y) in enumerate(zip(kept_at(*outcome), none, strict=True)):  # position j + 1: n calls' draft, less none's
                    gains[j] += x - y
                    rounds[j] += 1
        if calls > 0 and drafts > 1 and len(outcomes) > cap:  # (a single draft, never refined, says nothing of what a call buys)
            self.refine_rounds[method] = self.refine_rounds.get(method, 0) + 1

    def record_catch_up(self, method: str, tokens: int, seconds: float) -> None:
        if self._first(("catch_up", method)):  # the first call of a long feed pays ONNX Runtime's setup for it
            return
        self.catch_up_s.setdefault(method, _CostLine()).add(tokens, seconds)

    def record_scored(self, method: str, predicted: float, accepted: int) -> None:
        """A scored draft whose kept nodes summed to ``predicted`` expected drafts got ``accepted``."""
        self.predicted[method] = self.predicted.get(method, 0.0) + predicted
        self.scored_accepted[method] = self.scored_accepted.get(method, 0.0) + accepted

    def record_round(self, method: str, drafted: int, accepted: int) -> None:
        if drafted:
            self._at.pop(method, None)
            self._tokens.pop(method, None)
            self.drafting_rounds[method] = self.drafting_rounds.get(method, 0) + 1
            self.accepted[method] = self.accepted.get(method, 0.0) + accepted
            self.reached[method] = self.reached.get(method, 0.0) + accepted + (accepted < drafted)
            acc = self.accepted_at.setdefault(method, [0] * self.max_draft_len)
            reach = self.reached_at.setdefault(method, [0] * self.max_draft_len)
            for j in range(min(accepted, self.max_draft_len)):
                acc[j] += 1
            for j in range(min(accepted + 1, drafted, self.max_draft_len)):
                reach[j] += 1

    # -- the estimate (plain Python: it runs per request per round, over at most 9 lengths) ---
    def acceptance(self, method: str, accepted: int, rejected: int) -> float:
        """A request's per-token acceptance: its own counts with the method-wide prior."""
        prior = (self.accepted.get(method, 0.0) + 1.0) / (self.reached.get(method, 0.0) + 2.0)
        a = (accepted + PRIOR_WEIGHT * prior) / (accepted + rejected + PRIOR_WEIGHT)
        return float(min(a, 0.999))

    def best_acceptance(self, method: str, counts: Iterable[tuple[int, int]]) -> float:
        """The largest ``acceptance`` over (accepted, rejected) ``counts`` (0.0 for none), in one pass: may_draft reads
        it over a batch's requests every round."""
        prior = (self.accepted.get(method, 0.0) + 1.0) / (self.reached.get(method, 0.0) + 2.0)
        given = PRIOR_WEIGHT * prior
        best = max(((accepted + given) / (accepted + rejected + PRIOR_WEIGHT) for accepted, rejected in counts), default=None)
        return 0.0 if best is None else float(min(best, 0.999))

    def expected_tokens(self, method: str, a: float, limit: int) -> list[float]:
        """[k] expected tokens of a round with k = 0..limit drafts for a request of acceptance ``a``. Worked out to
        max_draft_len and remembered per method for the last ``a`` until the method's next round: a round asks for
        the same request's curve twice (may_draft's bound, then its choice) and each answer is a prefix."""
        last = self._tokens.get(method)
        if last is not None and last[0] == a and limit <= self.max_draft_len:
            return last[1][: limit + 1]
        at = self._positions(method)
        depth = max(limit, self.max_draft_len)
        out = _survival([min(x * a / max(at[0], 1e-6), 0.999) for x in at[1][:depth]] if at is not None else [a] * depth)  # scaled to r
        self._tokens[method] = (a, out)
        return out[: limit + 1]

    def _positions(self, method: str) -> tuple[float, list[float]] | None:
        """(the method's acceptance, [position] its smoothed acceptance there given the ones before), until its next round;
        None before it drafted."""
        at = self._at.get(method)
        if at is None and self.reached_at.get(method) is not None and self.reached.get(method, 0.0) > 0:
            method_a = self.accepted[method] / self.reached[method]
            acc, reach = self.accepted_at[method], self.reached_at[method]
            at = self._at[method] = (method_a, [(acc[j] + PRIOR_WEIGHT * method_a) / (reach[j] + PRIOR_WEIGHT) for j in range(len(acc))])
        return at

    def expected_refined(self, method: str, a: float, limit: int, calls: int) -> list[float]:
        """[k] expected tokens of a round of k = 0..limit drafts refined by (at most) ``calls`` calls, for a request of
        acceptance ``a``: with no refining call, each position's acceptance counted over every greedy chain round (the
        method's acceptance there as the prior); with n calls, plus how much more often n calls kept a draft at each
        position up to k than none did, averaged over the rounds that measured both (GAIN_PRIOR rounds of no gain with them). A difference on the same
        text, not n calls' own acceptance: the rounds that refine are the ones whose requests chose to, and their
        acceptance says more of those requests than of the calls; a ratio of the two's acceptance at each position, given
        the ones before, swung with a handful of rounds (measured: 2.77 tokens a round for 2.10). The first is scaled by
        how the request compares with the method, as expected_tokens does; the gain is not: what a call buys varies from
        prompt to prompt, not with how well the one call drafts it (measured per kind of prompt: docs/benchmarks.md), and
        scaling the gain with the request's acceptance kept auto from refining prompts where one call bought most
        (measured: 1.55x where one refining call makes 1.80x)."""
        at = self._positions(method)
        gains = self.gain_sum.get(method)
        if at is None or gains is None or calls >= len(gains):
            return self.expected_tokens(method, a, limit)
        scale = a / max(at[0], 1e-6)
        acc, reach = self.unrefined_accepted[method], self.unrefined_reached[method]
        c = [min((acc[j] + PRIOR_WEIGHT * at[1][j]) / (reach[j] + PRIOR_WEIGHT) * scale, 0.999) for j in range(min(limit, len(acc)))]
        out = _survival(c)
        if calls:  # plus each position's gain, up to k (per position: a long chain's rounds, copying text where refining buys
            # least, would otherwise price every k > 3 apart from the short chains' rounds, and a longer chain below a shorter)
            rounds, more = self.gain_rounds[method][calls], 0.0
            for k in range(1, len(out)):
                more += gains[calls][k - 1] / (rounds[k - 1] + GAIN_PRIOR)
                out[k] = min(max(out[k] + more, 1.0), k + 1.0)
        return out[: limit + 1]

    def verify_costs(self, rows: int) -> list[float]:
        """[w] verify_cost(rows, w) for w = 1..max_draft_len + 1 (index 0 unused), all at once and remembered until
        the next timing: every request of a round asks for the same few. Every round times a call, so this runs about
        once a round: the widths come off one fitted line in one pass, not one ``verify_cost`` each."""
        costs = self._memo.get(rows)
        if costs is None:
            widths = range(1, self.max_draft_len + 2)
            priced = self.__dict__.get("verify_cost")  # a formula set on the instance (the tests price calls so)
            costs = self._memo[rows] = [0.0, *(map(partial(priced, rows), widths) if priced else self._line_costs(rows, widths))]
        return costs

    def _line_costs(self, rows: int, widths) -> list[float]:
        """verify_cost(rows, w) for each w of ``widths``."""
        line = self._line(rows)
        odd = self.even_rows and rows % 2  # computed_width: an odd rows x width call computes width + 1
        if line is None:  # unitless until the first call is timed
            return [1.0 + PRIOR_SLOPE * (w + (odd and w % 2) - 1) for w in widths]
        mean_w, mean_t, slope = line._fitted()
        if slope is None:  # one width seen: the slope per computed token over every call, else the prior
            per_token = self.per_token.slope
            slope = rows * per_token if per_token is not None else PRIOR_SLOPE * mean_t
        return [max(mean_t + slope * (w + (odd and w % 2) - mean_w), 1e-9) for w in widths]

    def _cost(self, rows: int, width: int) -> float:
        costs = self.verify_costs(rows)
        return costs[width] if width < len(costs) else self.verify_cost(rows, width)

    def verify_cost(self, rows: int, width: int) -> float:
        """Seconds of a target call of ``rows`` x ``width`` tokens, from the nearest batch size timed."""
        return self._line_costs(rows, (width,))[0]

    def _line(self, rows: int) -> _CostLine | None:
        if rows < len(self.verify) and self.verify[rows].measured:
            return self.verify[rows]
        timed = [n for n, line in enumerate(self.verify) if line.measured]
        return self.verify[min(timed, key=lambda n: abs(n - rows))] if timed else None

    def draft_cost(self, method: str, rows: int, default: float) -> float:
        """Seconds of one draft step over ``rows`` requests: measured, else the nearest batch size measured."""
        cost = _nearest(self.draft_s, method, rows)
        return default if cost is None else cost

    def _round_line(self, method: str, rows: int) -> tuple[_CostLine, float] | None:
        """(line, scale): a one-call drafter's round at ``rows`` costs scale * line(k). Its own line once two draft lengths
        were timed at ``rows``; else the nearest batch size's that was, scaled to meet this one's own timings where it has
        some (at the width they were timed at: a batch size where auto declines drafts only in probes, all k = 1, and as a
        batch drains each size sees a few rounds at one k); None while no batch size has one."""
        own = self.round_lines.get((method, rows))
        if own is not None and own.slope is not None:
            return own, 1.0
        sloped = [n for (m, n), line in self.round_lines.items() if m == method and line.slope is not None]
        if not sloped:
            return None
        line = self.round_lines[(method, min(sloped, key=lambda n: abs(n - rows)))]
        if own is None:
            return line, 1.0
        mean_w, mean_t = own.mean
        there = line(mean_w)
        return (line, mean_t / there) if there > 1e-6 else None

    def _round_price(self, method: str, rows: int, t_draft: float) -> Callable[[int], float]:
        """Seconds of a round of k > 0 drafts at ``rows`` requests: its ``steps`` of ``t_draft``, or for a one-call drafter its
        round line at k (``_round_line``) where that is above ``t_draft`` (its rounds' average), else ``t_draft``. The line
        only raises a price: where it made short rounds cheaper than the average, auto drafted at batch 4 on a CPU where no
        length paid (measured: 0.99x target-only against 1.05x at one price)."""
        if method not in self.one_call:
            return lambda k: self.steps(method, k) * t_draft
        got = self._round_line(method, rows)
        if got is None:
            return lambda k: t_draft
        line, scale = got
        return lambda k: max(t_draft, scale * line(k))

    def drafting_costs(self, method: str, rows: int, limit: int, t_draft: float) -> list[float]:
        """[k] seconds a round's drafting of k = 0..limit drafts costs at ``rows`` requests (``_round_price``)."""
        return [0.0, *map(self._round_price(method, rows, t_draft), range(1, limit + 1))]

    def drafting_cost(self, method: str, rows: int, drafts: int, t_draft: float) -> float:
        """One entry of ``drafting_costs``: a round of ``drafts`` drafts (a static tree's nodes)."""
        return self._round_price(method, rows, t_draft)(drafts) if drafts > 0 else 0.0

    def catch_up_cost(self, method: str, tokens: int, rows: int = 1) -> float:
        """Seconds for the method's draft to be fed ``tokens`` it has not seen (unmeasured: an eighth of a draft step
        per token, about what a prompt's prefill costs per token on a CPU)."""
        if tokens <= 0:
            return 0.0
        line = self.catch_up_s.get(method)
        if line is not None and line.measured:
            return line(tokens, slope=line.s[3] / max(line.s[1], 1e-9))  # one size seen: proportional to the tokens
        return tokens * self.draft_cost(method, rows, default=0.1 * self._cost(rows, 1)) / 8

    def choose(self, method: str, accepted: int, rejected: int, limit: int, rows: int = 1, current: int | None = None,
               catch_up_s: float = 0.0, left: int = HORIZON) -> int:
        """The k in 0..limit with the most expected tokens per second, in a round of ``rows`` requests.

        ``current``: the request's k of the last round, kept unless another k is expected to be
        ``STICKY`` faster: every new call width costs ONNX Runtime a new shape (buffers, a rebinding,
        its memory plan), so chasing a 1% difference from noisy estimates loses more than it gains.
        ``catch_up_s``: what drafting at all first costs this request (its draft's backlog), spread over the
        ``left`` tokens it may still make (at most HORIZON); paid by every row, as the costs above assume.
        """
        limit = min(limit, self.max_draft_len)
        if limit <= 0:
            return 0
        tokens = self.expected_tokens(method, self.acceptance(method, accepted, rejected), limit)
        verify, drafting, spread = self._round_prices(method, rows, limit, catch_up_s, left)
        speed = [tokens[k] / (drafting[k] + verify[k] + (spread * tokens[k] if k else 0.0)) for k in range(limit + 1)]
        speed[0] *= 1.0 + DRAFT_MARGIN
        best = max(range(limit + 1), key=speed.__getitem__)
        if current is not None and current <= limit and speed[best] < speed[current] * (1.0 + STICKY):
            return current
        return best

    def _round_prices(self, method: str, rows: int, limit: int, catch_up_s: float, left: int) -> tuple[list[float], list[float], float]:
        """(verify [k], drafting [k], spread): the seconds of a round of k = 0..limit drafts at ``rows`` requests, its target
        call of k + 1 tokens and its drafting; and a catch-up's seconds per token the round makes (``choose``)."""
        verify = self.verify_costs(rows)[1 : limit + 2]  # [k]: a call of k + 1 tokens
        t_draft = self.draft_cost(method, rows, default=0.1 * verify[0])  # unmeasured: a tenth of a target step
        spread = rows * catch_up_s / max(min(left, HORIZON), 1)  # per token the round makes
        return verify, self.drafting_costs(method, rows, limit, t_draft), spread

    def exploring_refines(self, method: str) -> bool:
        """Whether the method's rounds still refine as far as they can: fewer than REFINE_EXPLORE greedy chain rounds
        measured what every number of calls buys (record_fewer)."""
        return self.refine_rounds.get(method, 0) < REFINE_EXPLORE

    def choose_refined(self, method: str, accepted: int, rejected: int, limit: int, rows: int = 1, current: tuple[int, int] | None = None,
                       catch_up_s: float = 0.0, left: int = HORIZON, draft_len: int | None = None) -> tuple[int, int]:
        """(k, n): the k in 0..limit drafts and n in 0..min(refining[method], k - 1) refining calls with the most expected
        tokens per second in a round of ``rows`` requests (``choose``'s, each (k, n) priced at the round's one call times
        1 + n * refine_share and its expected tokens expected_refined's), a pair with n > 0 only where it promises
        REFINE_MARGIN more than it would without the margin: the estimates are noisy and near each other (the best of
        them is biased upwards), and a refining call costs what they leave out (more call shapes, a batch's rows that
        ride along). Measured on the 325M pair at batch 4, where every pair came within 3% of the others by the estimate,
        refining without the margin made 1.00x target-only against the one call's 1.05x; at batch 1, where one refining
        call makes 1.80x against 1.65x, a margin of 5% kept auto from it (the estimates of 50 rounds are a few % apart). ``draft_len``: k is fixed (a
        request's own length), only n is chosen. ``current`` is kept unless another pair is STICKY faster."""
        limit = min(limit, self.max_draft_len)
        if draft_len is not None:
            limit = min(limit, draft_len)
        if limit <= 0:
            return 0, 0
        a = self.acceptance(method, accepted, rejected)
        verify, drafting, spread = self._round_prices(method, rows, limit, catch_up_s, left)
        share = self.refine_share(method, rows)
        speeds: dict[tuple[int, int], float] = {}
        if draft_len is None:
            speeds[(0, 0)] = (1.0 + DRAFT_MARGIN) / verify[0]
        for n in range(min(self.refining.get(method, 0), limit - 1) + 1):
            tokens = self.expected_refined(method, a, limit, n)
            for k in range(max(n + 1, limit if draft_len is not None else 1), limit + 1):
                speeds[(k, n)] = _refined_speed(tokens[k], drafting[k], verify[k], spread, n, share)
        best = max(speeds, key=speeds.__getitem__)
        if current is not None and current in speeds and speeds[best] < speeds[current] * (1.0 + STICKY):
            return current
        return best

    def pays_at(self, method: str, rows: int, acceptance: float = PERFECT, catch_up_s: float = 0.0, left: int = HORIZON) -> bool:
        """Whether any draft length could pay in a round of ``rows`` requests at this per-token ``acceptance`` (default:
        a perfect drafter's): its expected tokens at k = 1..max_draft_len per second against one token per call, with
        DRAFT_MARGIN, as ``choose`` weighs them. False for a perfect drafter: no request of the method drafts this round,
        probes and exploring included, since no acceptance a probe could find would pay. True until costs are measured
        (the prior slope is cheap). ``catch_up_s`` / ``left``: a request's first drafting cost, spread as ``choose``
        spreads it (an exploring probe that could not repay it only costs: a 200-token prompt prefilled on the draft
        for a request with 7 tokens to go). A static tree's first k nodes make at most their levels + 1 tokens. A chain
        whose refining calls are chosen (``refining``) pays where any number of them would, each priced as choose_refined
        prices it: more calls can pay where the one call does not."""
        verify = self.verify_costs(rows)
        base = (1.0 + DRAFT_MARGIN) / verify[1]
        t_draft = self.draft_cost(method, rows, default=0.0)
        spread = rows * catch_up_s / max(min(left, HORIZON), 1)  # per token the round makes
        top = max(1, min(self.max_draft_len, left - 1))  # no round makes more than the tokens left
        tree = self.trees.get(method)
        if tree is not None:
            top = min(top, len(tree))
        drafting = self.drafting_costs(method, rows, top, t_draft)
        calls = min(self.refining.get(method, 0), top - 1) if acceptance < PERFECT and tree is None else 0
        if calls:  # as choose_refined weighs (k, n): the one call's tokens are its own chain's, not its rounds'
            share = self.refine_share(method, rows)
            for n in range(calls + 1):
                tokens = self.expected_refined(method, acceptance, top, n)
                if any(_refined_speed(tokens[k], drafting[k], verify[k + 1], spread, n, share) > base for k in range(n + 1, top + 1)):
                    return True
            return False
        tokens = self.expected_tokens(method, acceptance, self.max_draft_len) if acceptance < PERFECT else range(1, self.max_draft_len + 2)
        if tree is not None:
            levels = self.tree_levels(method)
            tokens = [min(tokens[k], 1.0 + levels[k]) for k in range(top + 1)]
        return any(tokens[k] / (drafting[k] + verify[k + 1] + spread * tokens[k]) > base for k in range(1, top + 1))

    # -- trees and scored drafts ------------------------------------------------------------
    def calibration(self, method: str) -> float:
        """Accepted drafts per expected draft of the method's scored drafts (1 until measured; a prior of 8 drafts)."""
        return (self.scored_accepted.get(method, 0.0) + PRIOR_WEIGHT) / (self.predicted.get(method, 0.0) + PRIOR_WEIGHT)

    def worth_skipping(self, method: str, rows: int, limit: int) -> bool:
        """Whether a request whose last scored draft did not pay should stop proposing until a probe round: only
        when proposing costs something. Suffix decoding's proposal is ~0.05% of a target step, and its drafts change
        from one token to the next (a match starts where the text reaches a repeated part), so it looks every round."""
        return self.draft_cost(method, rows, default=0.0) * limit > SKIP_SHARE * self._cost(rows, 1)

    def choose_scored(self, method: str, scores, rows: int = 1) -> int:
        """How many of a draft's nodes to keep (a prefix: nodes come best first, parents before children), from each
        node's estimated probability of being accepted; 0 when no prefix beats decoding one token."""
        c = self.calibration(method)
        t_draft = self.draft_cost(method, rows, default=0.0)
        best, best_speed, expected = 0, (1.0 + DRAFT_MARGIN) / self._cost(rows, 1), 1.0
        for k, score in enumerate(scores, 1):
            expected += c * float(score)
            speed = expected / (k * t_draft + self._cost(rows, k + 1))
            if speed > best_speed:
                best, best_speed = k, speed
        return best

    # -- static trees: each node's acceptance -----------------------------------------------------------------
    def record_tree(self, method: str, verified: list[int], kept: list[int]) -> None:
        """A static tree's round: its nodes ``verified`` and those on the path the target ``kept`` (indices in the
        method's DraftTree, ``trees``). Every tree request's every round counts: plain lists, a few items each."""
        counts = self.node_counts.get(method)
        if counts is None:
            counts = self.node_counts[method] = ([0.0] * self.max_draft_len, [0.0] * self.max_draft_len)
        seen, hit = counts
        for j in verified:
            seen[j] += 1
        for j in kept:
            hit[j] += 1
        self._stale.add(method)

    def node_values(self, method: str, fresh: bool = True) -> tuple[np.ndarray, np.ndarray]:
        """``_node_values``' arrays: (values [nodes], order [nodes])."""
        return self._node_values(method, fresh)[:2]

    def promised(self, method: str, nodes: list[int]) -> float:
        """The accepted drafts the method's tree ``nodes`` promise: their values summed (as the last round left them)."""
        values = self._node_values(method, fresh=False)[2]
        return sum(values[j] for j in nodes)

    def _node_values(self, method: str, fresh: bool = True) -> tuple[np.ndarray, np.ndarray, list[float], list[int]]:
        """(values [nodes], order [nodes]): each node of the method's tree's chance of being on the kept path when it is
        verified, from its counts with a prior worth PRIOR_WEIGHT rounds, made no larger than its parent's or an earlier
        sibling's; and the nodes best first (ties: tree order). So every first n of ``order`` holds each node's parent
        and earlier siblings: a tree, and one a sampled request can verify (its children are tried in the order drawn).

        The prior of a child of the root is NODE_PRIOR / (1 + its place among its siblings); of a deeper node, its
        parent's value times the value of the root's child in its place: a drafter guesses about as well at every
        depth, so a node seldom verified (auto keeps the nodes that pay; the rest are verified in probe rounds only)
        starts from what its parent and the first level show, not from a constant. Worked out again after the
        method's tree rounds when ``fresh`` (once a round: the rounds' outcomes are recorded request by request, and
        read as the last round left them until the next round plans). Also as lists: choose_nodes walks them per request
        and round, and a list's items are cheaper to read."""
        got = self._values.get(method)
        if got is not None and (not fresh or method not in self._stale):
            return got
        self._stale.discard(method)
        tree = self.trees[method]
        verified, kept = self.node_counts.get(method) or ([0.0] * len(tree), [0.0] * len(tree))
        values: list[float] = []
        first: list[int] = []  # the root's children, in their order
        last: dict[int, int] = {}  # parent -> its child met last
        for j, (parent, place) in enumerate(zip(tree.parents.tolist(), tree.orders.tolist(), strict=True)):  # parents first
            if parent < 0:
                prior, cap = NODE_PRIOR / (1 + place), 1.0
                first.append(j)
            else:
                prior = cap = values[parent]
                prior *= values[first[min(place, len(first) - 1)]]
            if parent in last:
                cap = min(cap, values[last[parent]])
            values.append(min((kept[j] + PRIOR_WEIGHT * prior) / (verified[j] + PRIOR_WEIGHT), cap))
            last[parent] = j
        out = np.array(values)
        order = np.argsort(-out, kind="stable")
        got = self._values[method] = (out, order, values, order.tolist())
        return got

    def tree_scale(self, accepted: int, expected: float) -> float:
        """How a request's static trees fare against the method's: its accepted drafts over what its verified nodes'
        values promised (``expected``), with PRIOR_WEIGHT drafts at 1."""
        return (accepted + PRIOR_WEIGHT) / (expected + PRIOR_WEIGHT)

    def node_speeds(self, method: str, limit: int, scale: float = 1.0, rows: int = 1, catch_up_s: float = 0.0,
                    left: int = HORIZON) -> tuple[list[int], list[float], float]:
        """(order, speeds, base): the method's static tree's nodes below ``limit``, best first by value (``node_values``,
        times the request's ``scale``); speeds[n - 1] the expected tokens per second at ``rows`` requests of verifying
        the first n of them, drafting priced at the tree's first (deepest kept index + 1) nodes, what its proposer
        drafts; base: one token per call's, with DRAFT_MARGIN. ``catch_up_s`` / ``left`` as for ``choose``."""
        _, _, values, order = self._node_values(method)
        if limit < len(order):
            order = [j for j in order if j < limit]
        t_draft = self.draft_cost(method, rows, default=0.1 * self._cost(rows, 1))
        price = self._round_price(method, rows, t_draft)
        spread = rows * catch_up_s / max(min(left, HORIZON), 1)
        verify = self.verify_costs(rows)
        tokens, drafted, speeds = 1.0, 0, []
        for n, j in enumerate(order, 1):
            tokens += min(scale * values[j], 0.999)
            drafted = max(drafted, j + 1)
            speeds.append(tokens / (price(drafted) + (verify[n + 1] if n + 1 < len(verify) else self._cost(rows, n + 1)) + spread * tokens))
        return order, speeds, (1.0 + DRAFT_MARGIN) / self._cost(rows, 1)

    def choose_nodes(self, method: str, limit: int, scale: float = 1.0, rows: int = 1, catch_up_s: float = 0.0,
                     left: int = HORIZON) -> np.ndarray:
        """The nodes of the method's static tree (ascending indices, each below ``limit``) to verify at ``rows`` requests:
        the n best by value for the n with the most expected tokens per second (``node_speeds``; the fewest on a tie),
        or none where no n beats one token per call with DRAFT_MARGIN."""
        order, speeds, base = self.node_speeds(method, limit, scale, rows, catch_up_s, left)
        best = max(range(len(speeds)), key=speeds.__getitem__, default=-1)
        n = best + 1 if best >= 0 and speeds[best] > base else 0
        return np.array(sorted(order[:n]), np.int64)

    def batch_width(self, curves: list[list[float]], rows: int, floor: int = 1) -> int:
        """The width of the round's target call (1 + the most drafts any row keeps) with the most expected tokens
        per second for the whole batch. ``curves[i][k]``: row i's expected tokens when it keeps at most k of its
        drafts (k = 0..its draft's length); ``floor``: a width the call has anyway (rows whose draft length is
        fixed). Every row pays for the widest row (ragged rows are padded), so the width that pays is a batch
        decision: sum over rows of tokens at that width / the call's cost."""
        top = max([len(c) for c in curves] + [floor])
        best, best_speed = floor, -1.0
        for width in range(floor, top + 1):
            tokens = sum(c[min(width - 1, len(c) - 1)] for c in curves)
            speed = tokens / self._cost(rows, width) * (1.0 + DRAFT_MARGIN if width == 1 else 1.0)
            if speed > best_speed:
                best, best_speed = width, speed
        return best

    @staticmethod
    def probe_due(round_index: int, rows: int = 1) -> bool:
        """Requests at k = 0 draft once more on the same rounds: one in PROBE_EVERY per row of the batch."""
        return round_index % (PROBE_EVERY * max(rows, 1)) == 0
