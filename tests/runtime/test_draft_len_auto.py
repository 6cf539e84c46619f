"""draft_len=auto for trees and scored drafts, under fixed costs at several batch sizes (deterministic, not timed)."""

import numpy as np
import pytest

from specdec.runtime.draft_len import PROBE_EVERY, REFINE_EXPLORE, AutoDraftLen
from specdec.runtime.draft_policy import fewer_outcomes
from specdec.runtime.proposers.base import Draft
from specdec.runtime.tree import DraftTree


def costs(auto: AutoDraftLen, draft_s: float = 0.0) -> AutoDraftLen:
    """A CPU-like target: at 1 row a call costs its weights (flat in width); at more rows each verified token
    adds compute, and at 16 rows a second token per row costs as much as the first (compute-bound GEMMs)."""
    slope = {1: 0.002, 2: 0.01, 4: 0.03, 8: 0.08, 16: 1.0}
    auto.verify_cost = lambda rows, width: 1.0 + slope[rows] * (width - 1)
    auto.draft_cost = lambda method, rows, default: draft_s
    return auto


@pytest.mark.parametrize("rows, want", [(1, 8), (2, 7), (4, 6), (8, 5), (16, 0)])
def test_scored_drafts_keep_the_prefix_that_pays(rows, want):
    # a suffix draft: 3 sure nodes, then fading frequencies. Expected tokens of k nodes: 1, 2, 3, 4, 4.5, 4.8,
    # 5.05, 5.10, 5.12; over the cost 1 + slope * k the best k is 8 (flat), 7 (4.77/s), 6 (4.28/s), 5 (3.43/s),
    # and at 16 rows no k beats one token per call (k = 1: 2 tokens for twice the cost)
    scores = [1.0, 1.0, 1.0, 0.5, 0.3, 0.25, 0.05, 0.02]
    auto = costs(AutoDraftLen(8, 16))
    assert auto.choose_scored("suffix", scores, rows) == want


def test_scored_drafts_follow_their_calibration():
    auto = costs(AutoDraftLen(8, 16))
    scores = [0.9, 0.8, 0.6, 0.4]
    assert auto.choose_scored("suffix", scores, 8) == 4  # believed: 3.7 / 1.32 beats 1 / 1
    for _ in range(100):  # the counts promised 2.7 accepted drafts a round and none came: the scores are not believed
        auto.record_scored("suffix", 2.7, 0)
    auto.record_scored("suffix", 0.0, 1)
    assert auto.calibration("suffix") == pytest.approx(9 / 278)
    assert auto.choose_scored("suffix", scores, 8) == 0  # 1.03 tokens for 1.08 the cost
    # at one row verifying more tokens is nearly free, but 1.09 tokens for 1.006 of a call is a gain inside DRAFT_MARGIN
    assert auto.choose_scored("suffix", scores, 1) == 0
    for _ in range(100):  # half of what they promised came: 1 + 0.5 * 2.7 tokens is worth the wider call
        auto.record_scored("suffix", 2.7, 1.35)
    assert auto.choose_scored("suffix", scores, 1) == 4


TREE = DraftTree.from_paths([[0], [1], [2], [0, 0], [0, 1], [1, 0], [0, 0, 0], [0, 0, 1]])  # nodes 0..7 in this order
# 100 rounds verifying the whole tree, by the path the target kept (node indices): 45 kept [0], [0, 0], [0, 0, 0] ...
PATHS = [([0, 3, 6], 45), ([0, 3], 15), ([0], 10), ([0, 4], 10), ([1, 5], 8), ([2], 2), ([], 10)]


def measured(auto: AutoDraftLen, method: str = "medusa", rounds: int = 1) -> AutoDraftLen:
    auto.trees[method] = TREE
    for _ in range(rounds):
        for path, times in PATHS:
            for _ in range(times):
                auto.record_tree(method, np.arange(8), np.array(path, np.int64))
    return auto


def test_node_values_are_each_nodes_kept_share_bounded_by_its_parent_and_earlier_siblings():
    auto = measured(costs(AutoDraftLen(8, 16)))
    values, order = auto.node_values("medusa")
    # (kept + 8 x prior) / (100 + 8); the prior of a child of the root 0.5 / (1 + its place), of a deeper node its
    # parent's value times the root's child's in its place
    v0, v1 = 84 / 108, 10 / 108
    v3 = (60 + 8 * v0 * v0) / 108
    assert values[[0, 1, 3, 6, 4]] == pytest.approx([v0, v1, v3, (45 + 8 * v3 * v0) / 108, (10 + 8 * v0 * v1) / 108])
    assert order.tolist() == [0, 3, 6, 4, 1, 5, 2, 7]
    auto.record_tree("medusa", np.arange(8), np.array([0, 4]))  # kept more often than its earlier sibling 3 ...
    for _ in range(200):
        auto.record_tree("medusa", np.array([0, 4]), np.array([0, 4]))
    values, order = auto.node_values("medusa")
    assert values[4] == values[3] < values[0]  # ... it is worth no more than 3: a sampled tree tries 3 first
    assert order.tolist().index(3) < order.tolist().index(4)


def closed(tree: DraftTree, nodes) -> bool:
    """Every node's parent and earlier siblings are among ``nodes``: a tree a sampled request can verify."""
    nodes = set(int(j) for j in nodes)
    return all((p < 0 or p in nodes) and all(int(s) in nodes for s in np.flatnonzero(tree.parents[:j] == p))
               for j in nodes for p in [int(tree.parents[j])])


def test_the_nodes_kept_are_always_a_tree_with_each_nodes_first_children(seed=0):
    """Whatever the counts (random trees, random verified and kept nodes, kept shares even above a parent's or an
    earlier sibling's): every first n of node_values' order, every choose_nodes answer at every limit and batch size,
    and the batch's width cap of a draft that lacks some nodes (a sampled node drew fewer children) keep each kept
    node's parent and earlier siblings."""
    from types import SimpleNamespace

    from specdec.runtime.draft_policy import AutoDraftPolicy, chosen_nodes
    from specdec.runtime.metrics import Metrics
    from specdec.runtime.proposers.base import Draft
    from specdec.runtime.request import AUTO

    rng = np.random.default_rng(seed)
    for case in range(60):
        paths: list[list[int]] = []
        while len(paths) < 10:
            parent = paths[rng.integers(len(paths))] if paths and rng.random() < 0.7 else []
            kids = sum(1 for p in paths if p[:-1] == parent and len(p) == len(parent) + 1)
            paths.append([*parent, kids])
        tree = DraftTree.from_paths(paths)
        auto = costs(AutoDraftLen(10, 16), draft_s=float(rng.choice([0.0, 0.05])))
        auto.trees["m"] = tree
        for _ in range(int(rng.integers(0, 40))):
            auto.record_tree("m", np.arange(10), rng.choice(10, size=int(rng.integers(0, 4)), replace=False))
        order = auto.node_values("m")[1]
        assert all(closed(tree, order[:n]) for n in range(11)), case
        for rows in (1, 4, 8):
            for limit in (3, 7, 10):
                keep = auto.choose_nodes("m", limit, float(rng.uniform(0.3, 3.0)), rows)
                assert closed(tree, keep) and (keep < limit).all(), (case, rows, limit)
        # drafts of the tree's first nodes, each without some node's later children (and their subtrees)
        drafts = []
        for _ in range(4):
            drawn = {p: int(rng.integers(0, 4)) for p in range(-1, 10)}  # children each node drew (its first ones)
            kept: list[int] = []
            for j in range(10):
                p = int(tree.parents[j])
                if tree.orders[j] < drawn[p] and (p < 0 or p in kept):
                    kept.append(j)
            whole = Draft(np.arange(10), parents=tree.parents.copy(), depths=tree.depths.copy(), tree_index=np.arange(10))
            drafts.append(whole.nodes(kept))
        reqs = [SimpleNamespace(draft_len=AUTO, method="m", metrics=Metrics(requests=1), auto_nodes=None, auto_expected=0.0) for _ in drafts]
        policy = AutoDraftPolicy(auto)
        policy.begin(reqs, 3)
        for d in policy.batch_cap(reqs, drafts):
            assert closed(tree, [] if d.tree_index is None else d.tree_index), case
        for d in drafts:
            assert closed(tree, chosen_nodes(d, auto.choose_nodes("m", 10, 1.0, 4)).tree_index if len(d) else []), case


@pytest.mark.parametrize("rows, want", [(1, [0, 1, 2, 3, 4, 5, 6]), (4, [0, 1, 3, 4, 5, 6]), (8, [0, 3, 6]), (16, [])])
def test_a_static_tree_keeps_the_nodes_that_pay(rows, want):
    """The best n nodes by value for the n with the most tokens per second: at 1 row a node costs 0.2% of a call and
    all but node 7 (0.1% of a round's tokens) pay; at 8 rows (8% a node) the chain [0], [0, 0], [0, 0, 0] (2.83 tokens
    for 1.24 calls; [0, 1] next would bring 0.10 for 0.08); at 16 rows (a call a node) no node beats one token per call."""
    auto = measured(costs(AutoDraftLen(8, 16)))
    assert auto.choose_nodes("medusa", 8, 1.0, rows).tolist() == want
    assert auto.choose_nodes("medusa", 5, 1.0, rows).tolist() == [j for j in want if j < 5]  # a request with room for 5


def test_a_request_whose_trees_fall_short_keeps_fewer_nodes():
    auto = measured(costs(AutoDraftLen(8, 16)))
    assert auto.tree_scale(0, 0.0) == 1.0
    # its rounds' verified nodes promised 100 accepted drafts and it got none: scale 8 / 108, nothing pays at 8 rows
    assert auto.choose_nodes("medusa", 8, auto.tree_scale(0, 100.0), 8).tolist() == []
    # one that got what they promised is the method's average request; a third of it still pays for the chain at 8 rows
    assert auto.tree_scale(100, 100.0) == 1.0 and auto.choose_nodes("medusa", 8, 0.3, 8).tolist() == [0, 3, 6]
    assert auto.choose_nodes("medusa", 8, 0.15, 8).tolist() == []  # 1.12 tokens for 1.08 of a call: inside DRAFT_MARGIN


def test_a_trees_drafting_costs_a_step_per_level_of_the_nodes_drafted():
    """A tree's proposer drafts its first nodes up to the deepest one kept, level by level (EAGLE-3: one module call a
    level, whatever its nodes): keeping node 6 ([0, 0, 0]) drafts nodes 0..6, 3 levels. At 8 rows with a step of 0.35 of
    a call, the chain of three (2.83 tokens for 1.05 + 1.24 calls: 1.24/s) loses to [0], [0, 0] (2.38 for 0.7 + 1.16:
    1.28/s; [0] alone 1.24/s); free drafting keeps it. A step timed over a tree's round counts its levels."""
    free = measured(costs(AutoDraftLen(8, 16), draft_s=0.0))
    dear = measured(costs(AutoDraftLen(8, 16), draft_s=0.35))
    assert free.choose_nodes("medusa", 8, 1.0, 8).tolist() == [0, 3, 6]
    assert dear.choose_nodes("medusa", 8, 1.0, 8).tolist() == [0, 3]
    assert [dear.steps("medusa", k) for k in range(9)] == [0, 1, 1, 1, 2, 2, 2, 3, 3]
    assert dear.steps("draft", 7) == 7  # a chain: a step a token
    timed = measured(AutoDraftLen(8, 16))
    for _ in range(3):  # (the first call of a shape is not timed)
        timed.record_draft("medusa", 1, 8, 0.3)
    assert timed.draft_cost("medusa", 1, 0.0) == pytest.approx(0.1)  # 8 nodes in 3 levels


def test_a_costly_draft_step_is_counted():
    # each drafted token costs a target call: a coin-flip draft never pays; a free one does
    assert costs(AutoDraftLen(8, 16), draft_s=1.0).choose_scored("suffix", [0.5, 0.5, 0.5], 1) == 0
    assert costs(AutoDraftLen(8, 16), draft_s=0.0).choose_scored("suffix", [0.5, 0.5, 0.5], 1) == 3


def test_a_free_proposal_is_not_skipped():
    # a request whose scored draft did not pay stops proposing until a probe round only if proposing costs something
    assert not costs(AutoDraftLen(8, 16), draft_s=0.0).worth_skipping("suffix", 1, 8)
    assert not costs(AutoDraftLen(8, 16), draft_s=0.001).worth_skipping("suffix", 16, 8)  # 0.8% of a step
    assert costs(AutoDraftLen(8, 16), draft_s=0.01).worth_skipping("suffix", 1, 8)  # 8% of a step


def test_a_batch_size_timed_at_one_width_prices_more_by_its_tokens():
    # a compute-bound CPU: a call costs 16 ms + 4 ms per computed token (rows x width). 1 row was timed at every
    # width, 4 rows at widths 1 and 2, 16 rows only at width 1 (auto rarely drafts there): a 2-wide call of 16 rows
    # is priced 16 tokens more (+64 ms, 80%), not the fixed prior's 10%, and a coin-flip n-gram draft does not pay
    auto = AutoDraftLen(8, 16)
    for _ in range(3):
        for rows, widths in ((1, range(1, 10)), (4, (1, 2)), (16, (1,))):
            for w in widths:
                auto.record_verify(rows, w, 0.016 + 0.004 * rows * w)
    assert auto.verify_cost(16, 1) == pytest.approx(0.080)
    assert auto.verify_cost(16, 2) == pytest.approx(0.144)
    assert auto.verify_cost(1, 3) == pytest.approx(0.028)  # a batch size with its own slope keeps it
    auto.record_round("ngram", 8, 4)
    assert auto.choose("ngram", accepted=50, rejected=50, limit=8, rows=16) == 0
    assert auto.choose("ngram", accepted=50, rejected=50, limit=8, rows=1) > 0


def test_probes_fall_on_the_same_rounds():
    assert [r for r in range(3 * PROBE_EVERY) if AutoDraftLen.probe_due(r)] == [0, PROBE_EVERY, 2 * PROBE_EVERY]
    # a probe widens every row's call: at 8 rows they come 8 times less often
    assert [r for r in range(20 * PROBE_EVERY) if AutoDraftLen.probe_due(r, 8)] == [0, 8 * PROBE_EVERY, 16 * PROBE_EVERY]


def test_the_batch_pays_for_its_widest_row():
    # one row with a long, likely draft among rows with none: the call is as wide as that row for every row
    auto = costs(AutoDraftLen(8, 16))
    scores = [1.0, 1.0, 1.0, 0.9, 0.8, 0.7, 0.6, 0.5, 0.4]
    strong = [1.0, 2.0, 3.0, 3.9, 4.7, 5.4, 6.0, 6.5, 6.9]  # expected tokens keeping k = 0..8 of those drafts
    assert auto.batch_width([strong], 1) == 9  # alone at 1 row (nearly flat): all 8
    # 4 rows (slope 0.03): 3 + 6.9 tokens for 1.24 of a call beats 4 for 1
    assert auto.batch_width([strong, [1.0], [1.0], [1.0]], 4) == 9
    # 8 rows (slope 0.08): the row on its own would keep all 8 (6.9 / 1.64 beats 6.5 / 1.56), as if every row
    # drafted as it does; for the batch, 7 + 4.7 tokens for 1.32 (width 5) beat 7 + 6.9 for 1.64 (width 9)
    assert auto.choose_scored("suffix", scores[:8], 8) == 8
    assert auto.batch_width([strong] + [[1.0]] * 7, 8) == 5
    assert auto.batch_width([strong] * 8, 8) == 9  # every row as strong: all 8 pay
    # 16 rows (a token per row costs a call): 15 + 2 tokens for twice the cost lose to 16 for 1
    assert auto.batch_width([strong] + [[1.0]] * 15, 16) == 1
    assert auto.batch_width([strong] * 16, 16) == 1  # 2 tokens for twice the cost ties: the narrower call


def test_a_fixed_width_row_makes_narrower_drafts_free():
    # a row with a fixed draft_len of 4 widens the call to 5 anyway: auto rows keep up to 4 drafts for nothing more
    auto = costs(AutoDraftLen(8, 16))
    strong = [1.0, 2.0, 3.0, 3.9, 4.7, 5.4, 6.0, 6.5, 6.9]
    assert auto.batch_width([strong] + [[1.0]] * 14, 16, floor=5) == 5
    assert auto.batch_width([[1.0, 1.1]] * 15, 16, floor=5) == 5  # never below the floor


def test_nothing_drafts_where_no_draft_length_pays_at_the_batch_size():
    """pays_at: the expected tokens at k = 1..max_draft_len against one token per call. With a draft step at 60% of a
    target step and a wider call costing 50% more per token (a compute-bound CPU at 64 rows), even a perfect drafter
    does not pay; at one row (5% per token) it does. Free drafts pay at 64 rows for a perfect drafter, not at an
    acceptance of 0.6."""
    auto = AutoDraftLen(8, 64)
    slope = {1: 0.05, 64: 0.5}
    auto.verify_cost = lambda rows, width: 1.0 + slope[rows] * (width - 1)
    auto.draft_cost = lambda method, rows, default: 0.6
    assert auto.pays_at("draft", 1) and not auto.pays_at("draft", 64)
    auto.draft_cost = lambda method, rows, default: 0.0
    assert auto.pays_at("ngram", 64) and not auto.pays_at("ngram", 64, 0.6)


def test_pays_at_reads_measured_costs_and_is_optimistic_before():
    """Unmeasured: the prior slope (10% per token) pays. Width-1 calls at 1 and 32 rows give the per-token slope
    (compute-bound: 32 rows cost 32x one row's compute), and then a draft at 10% of a 32-row step does not pay."""
    auto = AutoDraftLen(8, 64)
    assert auto.pays_at("draft", 32)
    for _ in range(3):  # the first call of each shape is not timed
        auto.record_verify(1, 1, 0.06)
        auto.record_verify(32, 1, 32 * 0.013 + 0.02)
        auto.record_draft("draft", 32, 1, 0.044)
    assert not auto.pays_at("draft", 32)


def test_seeded_costs_replace_the_ones_a_round_read_before():
    """seed_verify after a round priced calls from the prior (an engine that served requests, then measure_step_costs):
    the next rounds read the seeded costs, not the remembered prior."""
    auto = AutoDraftLen(4, 4)
    assert auto.verify_costs(1)[1] == pytest.approx(1.0)  # unitless prior, remembered
    auto.seed_verify({(1, 1): 0.02, (1, 2): 0.03})
    assert auto.verify_costs(1)[1] == pytest.approx(auto.verify_cost(1, 1))
    assert auto.verify_costs(1)[1] < 0.1


@pytest.mark.parametrize("even_rows", [False, True])
def test_verify_costs_in_one_pass_price_each_width_as_its_line_does(even_rows):
    """verify_costs reads every width off the nearest timed line at once: the same seconds as the line itself gives at
    the width the call computes (an odd rows x width call on an even-rows engine computes one token more), before any
    timing (the prior), with one width timed (the slope per computed token, else the prior) and with two."""
    auto = AutoDraftLen(4, 4, even_rows=even_rows)
    assert auto.verify_costs(3)[1:] == pytest.approx([1.0 + 0.1 * (auto.computed_width(3, w) - 1) for w in range(1, 6)])
    for width, seconds in ((1, 0.02), (1, 0.021), (1, 0.019)):
        auto.record_verify(3, width, seconds)
    for rows in (1, 2, 3, 4):  # 3 timed at one width; 1, 2 and 4 priced from it, the nearest
        line = auto.verify[3]
        want = [line(auto.computed_width(rows, w)) for w in range(1, 6)]  # no call of two widths yet: the prior slope
        assert auto.verify_costs(rows)[1:] == pytest.approx(want)
    for width, seconds in ((2, 0.03), (3, 0.035), (2, 0.031), (3, 0.036)):  # each shape's first call is not timed
        auto.record_verify(1, width, seconds)
    line, per_token = auto.verify[1], auto.per_token.slope
    assert per_token is not None and line.slope is not None
    assert auto.verify_costs(1)[1:] == pytest.approx([line(auto.computed_width(1, w)) for w in range(1, 6)])
    assert auto.verify_costs(3)[1:] == pytest.approx([auto.verify[3](auto.computed_width(3, w), 3 * per_token) for w in range(1, 6)])
    assert auto.verify_cost(3, 9) == pytest.approx(auto.verify[3](auto.computed_width(3, 9), 3 * per_token))  # past the memo


def test_expected_tokens_are_remembered_as_prefixes_until_the_method_drafts_again():
    auto = AutoDraftLen(6)
    for accepted in (3, 1, 6, 0):
        auto.record_round("ngram", 6, accepted)
    full = auto.expected_tokens("ngram", 0.6, 6)
    assert auto.expected_tokens("ngram", 0.6, 2) == full[:3]
    assert auto.expected_tokens("ngram", 0.5, 6) != full  # another acceptance: worked out again
    assert auto.expected_tokens("ngram", 0.6, 6) == full
    auto.record_round("ngram", 6, 6)  # the method's positions moved: nothing stale is returned
    again = auto.expected_tokens("ngram", 0.6, 6)
    fresh = AutoDraftLen(6)
    for accepted in (3, 1, 6, 0, 6):
        fresh.record_round("ngram", 6, accepted)
    assert again == pytest.approx(fresh.expected_tokens("ngram", 0.6, 6)) and again != full


def test_a_batch_where_no_static_tree_pays_costs_one_check_not_a_choice_per_request():
    """AutoDraftPolicy.may_draft for a static tree (Medusa, EAGLE, P-EAGLE): at 8 rows a perfect tree would pay (2 tokens
    for 1.08 of a call), the method's nodes do not (its best, kept 1 round in 10, makes 1.12 tokens for 1.08 calls, inside
    DRAFT_MARGIN). Outside probe rounds the batch is declined in one check (no request priced one by one); one request
    whose own trees made twice what their nodes promised lets the method draft its best nodes; a probe round always looks."""
    from types import SimpleNamespace

    from specdec.runtime.draft_policy import AutoDraftPolicy
    from specdec.runtime.metrics import Metrics
    from specdec.runtime.request import AUTO

    auto = costs(AutoDraftLen(8, 16))
    auto.trees["eagle"] = TREE
    for i in range(200):
        auto.record_tree("eagle", np.arange(8), np.array([0] if i % 10 == 0 else [], np.int64))
    calls = []
    real = auto.choose_nodes
    auto.choose_nodes = lambda *a, **k: calls.append(a) or real(*a, **k)
    proposer = SimpleNamespace(tree=TREE, scores_drafts=False, backlog=lambda r: 0)
    reqs = [SimpleNamespace(draft_len=AUTO, method="eagle", metrics=Metrics(requests=1), auto_k=None, auto_nodes=None, auto_expected=0.0,
                            output_ids=[1], config=SimpleNamespace(max_output_len=64)) for _ in range(8)]
    policy = AutoDraftPolicy(auto)
    plain_round, probe_round = 3, PROBE_EVERY * 8
    assert auto.pays_at("eagle", 8) and not len(real("eagle", 8, 1.0, 8))
    policy.begin(reqs, plain_round)
    assert all(policy.declines(r, proposer, 8) for r in reqs) and calls == [("eagle", 8, 1.0, 8, 0.0)]  # one check
    assert all(r.auto_k == 0 for r in reqs)
    policy.begin(reqs, probe_round)
    assert not any(policy.declines(r, proposer, 8) for r in reqs)
    assert policy.draft_len(reqs[0], proposer, 8, 8) == 8 and reqs[0].auto_nodes is None  # a probe verifies the whole tree
    reqs[5].metrics.accepted, reqs[5].auto_expected = 30, 10.0  # its own trees: (30 + 8) / (10 + 8) = 2.1x their values
    policy.begin(reqs, plain_round)
    assert not policy.declines(reqs[0], proposer, 8)
    assert policy.draft_len(reqs[5], proposer, 8, 8) == 1 and reqs[5].auto_nodes.tolist() == [0]
    assert policy.draft_len(reqs[0], proposer, 8, 8) == 0


def test_the_round_verifies_the_chosen_nodes_and_learns_each_nodes_share():
    """fit cuts an auto request's static tree draft to the nodes chosen for it (whatever else it drafted), batch_cap
    to its best nodes by value where the batch's call width pays for fewer, and observed counts each verified node and
    the path kept (tree indices, not the cut draft's places), and what the request's nodes promised."""
    from types import SimpleNamespace

    from specdec.runtime.draft_policy import AutoDraftPolicy
    from specdec.runtime.metrics import Metrics
    from specdec.runtime.proposers.base import Draft
    from specdec.runtime.request import AUTO

    auto = measured(costs(AutoDraftLen(8, 16)), "eagle")
    policy = AutoDraftPolicy(auto)
    r = SimpleNamespace(draft_len=AUTO, method="eagle", metrics=Metrics(requests=1), auto_nodes=np.array([0, 3, 6]), auto_expected=0.0)
    whole = Draft(np.arange(100, 108), parents=TREE.parents.copy(), depths=TREE.depths.copy(), tree_index=np.arange(8))
    policy.begin([r], 3)
    cut = policy.fit([r], [whole])[0]
    assert cut.tree_index.tolist() == [0, 3, 6] and cut.tokens.tolist() == [100, 103, 106] and cut.parents.tolist() == [-1, 0, 1]
    values = auto.node_values("eagle")[0]
    assert policy.expected_curve(r, whole) == pytest.approx([1.0, *(1.0 + np.cumsum(values[[0, 3, 6, 4, 1, 5, 2, 7]]))])
    two = [SimpleNamespace(**{**vars(r), "auto_nodes": None}) for _ in range(16)]  # at 16 rows: 1 + 0.78 for 2 calls
    policy.begin(two, 3)
    assert [len(d) for d in policy.fit(two, [whole] * 16)] == [0] * 16
    auto.verify_cost = lambda rows, width: 1.0 + 0.35 * (width - 1)  # at 0.35 a token the best 2 nodes pay: [0], [0, 0]
    auto._memo.clear()
    kept = policy.fit(two, [whole] * 16)
    assert [d.tree_index.tolist() for d in kept] == [[0, 3]] * 16
    before = np.array(auto.node_counts["eagle"])
    policy.observed(r, cut, 2, [0, 1])  # the cut draft's places 0, 1: tree nodes 0 and 3
    assert (np.array(auto.node_counts["eagle"]) - before).tolist() == [[1, 0, 0, 1, 0, 0, 1, 0], [1, 0, 0, 1, 0, 0, 0, 0]]
    assert r.auto_expected == pytest.approx(values[[0, 3, 6]].sum())


@pytest.mark.parametrize("tree", [False, True])
def test_a_batch_whose_drafts_must_first_read_their_prompts_costs_one_check_where_no_catch_up_pays(tree):
    """may_draft with catch-ups: at 8 rows the method's best acceptance pays when its draft has read the text (an
    EAGLE chain, 0.75 a token; a static 4-node tree), and not for requests whose draft must first be fed 100 tokens
    (5 s, spread over the 63 tokens each has left). Outside probe rounds the batch is declined in one check, as
    choosing request by request would (each chooses 0, asked apart); once one request's catch-up is light enough to pay
    (30 tokens), or its draft is caught up, the method may draft again, and that request drafts while the others still
    choose 0."""
    from types import SimpleNamespace

    from specdec.runtime.draft_policy import AutoDraftPolicy
    from specdec.runtime.metrics import Metrics
    from specdec.runtime.request import AUTO

    auto = costs(AutoDraftLen(8, 16), draft_s=0.05)
    auto.catch_up_cost = lambda method, tokens, rows=1: 0.05 * tokens
    for _ in range(20):
        auto.record_round("eagle", 4, 3)
    calls = []
    auto.trees["eagle"] = DraftTree.chain(4)
    for _ in range(20):
        auto.record_tree("eagle", np.arange(4), np.arange(3))
    for name in ("choose", "choose_nodes"):
        real = getattr(auto, name)
        setattr(auto, name, lambda *a, real=real, name=name, **k: calls.append((name, a)) or real(*a, **k))
    proposer = SimpleNamespace(tree=auto.trees["eagle"] if tree else None, scores_drafts=False, backlog=lambda r: r.backlog)
    reqs = [SimpleNamespace(draft_len=AUTO, method="eagle", metrics=Metrics(requests=1), auto_k=None, auto_nodes=None, auto_expected=0.0,
                            output_ids=[1],
                            config=SimpleNamespace(max_output_len=64), backlog=100) for _ in range(8)]
    limit = 4 if tree else 8

    def alone(r) -> int:  # the request's own choice, priced with its catch-up
        catch_up, left = auto.catch_up_cost("eagle", r.backlog, 8), r.config.max_output_len - len(r.output_ids)
        if tree:
            keep = auto.choose_nodes("eagle", 4, auto.tree_scale(r.metrics.accepted, r.auto_expected), 8, catch_up, left)
            return int(keep[-1]) + 1 if len(keep) else 0
        return auto.choose("eagle", r.metrics.accepted, r.metrics.rejected, limit, 8, None, catch_up, left)

    policy = AutoDraftPolicy(auto)
    policy.begin(reqs, 3)
    assert policy.best_acceptance("eagle") == pytest.approx(0.75, abs=0.02)
    if tree:
        assert len(auto.choose_nodes("eagle", 4, policy.best_tree_scale("eagle"), 8))  # without the catch-up its first 3 nodes pay
    else:
        assert auto.pays_at("eagle", 8, policy.best_acceptance("eagle"))  # without the catch-up it would pay
    chosen = lambda: [a for name, a in calls if name == "choose" or len(a) == 6]  # noqa: E731  (a request's own choice, not may_draft's)
    assert all(policy.declines(r, proposer, 8) for r in reqs) and chosen() == []
    assert [alone(r) for r in reqs] == [0] * 8
    for backlog in (30, 0):  # its draft has read all but 30 tokens (a lighter catch-up that pays), then all of it
        calls.clear()
        reqs[2].backlog = backlog
        policy.begin(reqs, 4)
        assert not policy.declines(reqs[2], proposer, 8), backlog
        assert policy.draft_len(reqs[2], proposer, limit, 8) == alone(reqs[2]) > 0
        assert policy.draft_len(reqs[0], proposer, limit, 8) == 0 and chosen()


def test_describe_reports_what_a_decision_reads():
    auto = costs(AutoDraftLen(4, 16), draft_s=0.25)
    for _ in range(10):
        auto.record_round("draft", 4, 3)
    state = auto.describe("draft", 8)
    assert state["verify_ms"] == pytest.approx([1000 * (1.0 + 0.08 * w) for w in range(5)])
    assert state["draft_step_ms"] == 250.0 and state["catch_up_64_ms"] is None  # no catch-up timed yet
    assert state["drafting_rounds"] == 10 and state["acceptance"] == pytest.approx((30 + 1) / (40 + 2), abs=1e-3)
    assert state["perfect_drafter_pays"] is auto.pays_at("draft", 8)
    assert state["rounds_timed"] == {}  # the costs were set, no round timed
    for width, seconds in ((5, 0.009), (5, 0.009), (5, 0.011), (2, 0.004), (2, 0.006)):  # each shape's first call is not timed
        auto.record_verify(8, width, seconds)
    auto.seed_verify({(8, 9): 0.5})  # a seed is not a round
    assert auto.describe("draft", 8)["rounds_timed"] == {2: [1, 6.0], 5: [2, 10.0]}
    assert state["drafts_timed"] == {}
    for method, rows, drafts, seconds in (("draft", 8, 3, 0.5), ("draft", 8, 3, 0.003), ("draft", 8, 3, 0.005), ("draft", 16, 3, 0.001),
                                          ("draft", 16, 3, 0.001), ("ngram", 8, 3, 0.0001), ("ngram", 8, 3, 0.0001)):
        auto.record_draft(method, rows, drafts, seconds)  # (the first call of each shape is not timed)
    assert auto.describe("draft", 8)["drafts_timed"] == {3: [2, 4.0]}  # this method at this batch size only


def test_seeded_draft_costs_price_the_first_rounds():
    """seed_draft (Engine.measure_step_costs on a draft model): draft steps and catch-up feeds timed before the first
    round. A draft step dearer than a target call pays at no k with the prior acceptance; a cheap one does; a catch-up
    reads the seeded line, and the rounds' first catch-up is a timing like any other."""
    auto = AutoDraftLen(4, 4)
    auto.verify_cost = lambda rows, width: 0.007 + 0.0001 * (width - 1)
    auto.seed_draft("draft", {1: 0.012}, {8: 0.004, 64: 0.02})
    assert auto.draft_cost("draft", 1, default=0.0) == 0.012 and auto.choose("draft", 0, 0, 4, 1) == 0
    auto.seed_draft("draft", {1: 0.0015}, {})
    assert auto.choose("draft", 0, 0, 4, 1) > 0
    assert auto.catch_up_cost("draft", 64) == pytest.approx(0.02, rel=0.05) and auto.catch_up_cost("draft", 8) == pytest.approx(0.004, rel=0.05)
    auto.record_catch_up("draft", 64, 0.05)  # counted, not skipped as a first call
    assert auto.catch_up_cost("draft", 64) > 0.021


def one_call_auto(rows: int, seconds_at) -> AutoDraftLen:
    """A one-call drafter (P-EAGLE) whose rounds at ``rows`` requests took ``seconds_at(k)`` for k drafts (k = 1..8, 30 rounds
    each: a shape's first call is not timed, and a line caps a timing at 3x its estimate until it has learnt the slope), over
    a flat target call of 1 s and acceptance 0.8 per draft."""
    auto = AutoDraftLen(8, 16)
    auto.one_call = {"peagle"}
    auto.verify_cost = lambda rows, width: 1.0 + 0.01 * (width - 1)
    auto.accepted, auto.reached = {"peagle": 80.0}, {"peagle": 100.0}
    for _ in range(30):
        for k in range(1, 9):
            auto.record_draft("peagle", rows, k, seconds_at(k))
    return auto


def test_a_one_call_drafter_is_priced_by_its_drafts_where_its_rounds_show_a_slope():
    """A round of k drafts is one call, but the call computes k rows: nearly free at batch 1, not at batch 16 on a CPU
    (the 325M pair: a round of 8 drafts 1.19x a round of 1 at batch 1, 3.02x at batch 16). One price for every k (the
    rounds' average: 1.23 s below) underprices long rounds; the line raises their price, and never lowers a short one's."""
    flat = one_call_auto(1, lambda k: 0.1)
    assert flat.drafting_costs("peagle", 1, 8, flat.draft_cost("peagle", 1, 0.0)) == pytest.approx([0.0] + [0.1] * 8)
    assert flat.choose("peagle", 0, 0, 8, rows=1) == 8
    steep = one_call_auto(16, lambda k: 0.1 + 0.3 * (k - 1))  # k = 8: 2.2 s of drafting, 22x k = 1's
    t_draft = steep.draft_cost("peagle", 16, 0.0)
    assert t_draft == pytest.approx(1.23, abs=0.1)  # the one price
    line = [0.1 + 0.3 * j for j in range(8)]
    assert steep.drafting_costs("peagle", 16, 8, t_draft)[1:] == pytest.approx([max(t_draft, c) for c in line], rel=0.01)
    # at acceptance ~0.8 (81 / 102 with the prior) tokens 1 + 0.8 + 0.64 + ... for max(1.23, 0.1 + 0.3 (k - 1)) s of
    # drafting and 1 + 0.01 k of verification: k = 4 about 1.47 tokens/s, k = 5 1.55, k = 6 1.47; at one price k = 8 (1.84)
    assert steep.choose("peagle", 0, 0, 8, rows=16) == 5
    # a tree of the same call (a chain of 8 nodes), its first 4 nodes kept 80 rounds in 100, the next 4 50: all 8 make
    # 6.09 tokens for 2.2 + 1.08 s (1.86/s), 5 nodes 4.62 for 1.3 + 1.05 s (1.97/s), 4 nodes 4.15 for 1.23 + 1.04 s (1.83/s);
    # 2 nodes are priced at the average, as at one price
    steep.trees["peagle"] = DraftTree.chain(8)
    for kept in [8] * 50 + [4] * 30 + [0] * 20:
        steep.record_tree("peagle", np.arange(8), np.arange(kept))
    assert steep.choose_nodes("peagle", 8, 1.0, 16).tolist() == [0, 1, 2, 3, 4]
    assert steep.drafting_cost("peagle", 16, 2, t_draft) == pytest.approx(t_draft)
    assert steep.pays_at("peagle", 16) and not steep.pays_at("peagle", 16, acceptance=0.15)  # (one price agrees on these)


def test_a_batch_size_timed_at_one_length_borrows_the_nearest_line():
    """Where auto declines, a batch size drafts in probes only (k = 1) and never times a second length: it takes the
    nearest batch size's line, scaled to its own k = 1 cost; with no line anywhere every k costs one call."""
    auto = one_call_auto(16, lambda k: 0.1 + 0.3 * (k - 1))
    for _ in range(5):  # batch 12's probes (the first call of the shape is not timed)
        auto.record_draft("peagle", 12, 1, 0.08)
    t_draft = auto.draft_cost("peagle", 12, 0.0)
    assert t_draft == pytest.approx(0.08)
    assert auto.drafting_costs("peagle", 12, 8, t_draft)[1:] == pytest.approx([0.8 * (0.1 + 0.3 * j) for j in range(8)], rel=0.02)
    assert auto.drafting_cost("peagle", 12, 4, t_draft) == pytest.approx(0.8 * 1.0, rel=0.02)  # 16's shape, 12's k = 1 cost
    for _ in range(5):  # batch 8 timed at k = 4 only (a sticky k as a batch drains): the line meets it there, not at k = 1
        auto.record_draft("peagle", 8, 4, 0.4)
    assert auto.drafting_costs("peagle", 8, 8, auto.draft_cost("peagle", 8, 0.0))[4] == pytest.approx(0.4, rel=0.02)
    assert auto.drafting_cost("peagle", 8, 8, 0.4) == pytest.approx(0.4 * 2.2, rel=0.02)
    fresh = AutoDraftLen(8, 16)
    fresh.one_call = {"peagle"}
    for _ in range(3):
        fresh.record_draft("peagle", 4, 4, 0.5)
    assert fresh.drafting_costs("peagle", 4, 3, fresh.draft_cost("peagle", 4, 0.0)) == pytest.approx([0.0, 0.5, 0.5, 0.5])
    assert fresh.drafting_costs("eagle", 4, 3, 0.2) == pytest.approx([0.0, 0.2, 0.4, 0.6])  # a chain drafter: a step a draft


# -- P-EAGLE --peagle_refine auto: the refining calls chosen with the drafts --------------------------------------------
def test_what_fewer_refining_calls_would_have_drafted_is_judged_as_far_as_the_targets_tokens_go():
    """A chain refined twice carries the chains 0 and 1 calls would have drafted; each is judged against the tokens the
    target emitted: kept up to its first miss (missed), kept to its end (not missed), or matching every emitted token and
    going on, where the target's next token was never computed (censored: not missed). A settled chain (k - 1 calls)
    stands for every further call up to the cap."""
    d = Draft(np.array([1, 2, 3, 4]), fewer_calls=np.array([[1, 2, 9, 9], [1, 2, 3, 8]]))
    assert fewer_outcomes(d, [1, 2, 3, 5], cap=3) == [(2, True), (3, True), (3, True)]
    assert fewer_outcomes(d, [1, 2, 3, 4, 7], cap=3) == [(2, True), (3, True), (4, False)]  # all four kept: nothing missed
    censored = Draft(np.array([1, 6, 3, 4]), fewer_calls=np.array([[1, 5, 7, 7], [1, 5, 3, 8]]))
    assert fewer_outcomes(censored, [1, 5], cap=3) == [(2, False), (2, False), (1, True)]  # 1 5 match all the target said
    settled = Draft(np.array([1, 2]), fewer_calls=np.array([[1, 3]]))  # k = 2: one call settles it
    assert fewer_outcomes(settled, [1, 2, 4], cap=3) == [(1, True), (2, False), (2, False), (2, False)]
    assert fewer_outcomes(d.prefix(2), [1, 2, 4], cap=3) == [(2, False)] * 4  # cut by the batch's width: settled too


def refining_auto(share: float, seed: int = 0) -> AutoDraftLen:
    """A one-call drafter refining up to 3 calls a round (flat rounds of 0.1 s over a 1 s target call), whose 400 greedy
    rounds of 4 drafts kept position 1 at 0.8, and each later position at 0.4 with no refining call, 0.85 with one or
    more (each round judged at every n, as record_fewer is fed); a refining call costs ``share`` of the round's one call."""
    auto = one_call_auto(1, lambda k: 0.1)
    auto.refining = {"peagle": 3}
    rng = np.random.default_rng(seed)
    for _ in range(400):
        u = rng.random(4)
        outcomes = []
        for n in range(4):
            ok = u < np.array([0.8] + [0.4 if n == 0 else 0.85] * 3)
            kept = int(np.argmin(ok)) if not ok.all() else 4
            outcomes.append((kept, kept < 4))
        auto.record_fewer("peagle", 3, outcomes, 4)
        auto.record_round("peagle", 4, outcomes[3][0])
    for _ in range(3):  # the first call of a shape is not timed
        auto.record_refine("peagle", 1, 2, 2 * share * 0.1, 0.1)
    return auto


def test_refining_calls_are_chosen_where_what_they_buy_pays_for_them():
    """What n refining calls buy is measured on the same rounds as none (record_fewer): one call lifts positions 2..4
    from 0.4 to 0.85, so a round of 4 drafts keeps about 2.55 drafts refined against 1.30. Cheap calls (a tenth of the
    one call's cost) are made; calls costing 20 target steps are not; a fixed draft length only chooses the calls."""
    cheap = refining_auto(0.1)
    a = cheap.acceptance("peagle", 0, 0)
    blind, once, thrice = (cheap.expected_refined("peagle", a, 4, n)[4] for n in (0, 1, 3))
    assert blind == pytest.approx(1 + 0.8 + 0.8 * 0.4 + 0.8 * 0.16 + 0.8 * 0.064, rel=0.12)
    assert once == pytest.approx(blind + 2.55 - 1.30, rel=0.08) and thrice == pytest.approx(once)
    # a request the one call drafts worse for gains what the method gains, not less (what a call buys varies by prompt,
    # not with how well the one call drafts it: docs/benchmarks.md)
    low = [cheap.expected_refined("peagle", a / 2, 4, n)[4] for n in (0, 1)]
    assert low[0] < blind - 0.5 and low[1] - low[0] == pytest.approx(once - blind)
    assert cheap.refine_share("peagle", 1) == pytest.approx(0.1)
    k, n = cheap.choose_refined("peagle", 0, 0, 8, rows=1)
    assert n >= 1 and k >= 4, (k, n)
    dear = refining_auto(200.0)  # a refining call at 20 s
    assert dear.choose_refined("peagle", 0, 0, 8, rows=1)[1] == 0
    assert cheap.choose_refined("peagle", 0, 0, 8, rows=1, draft_len=2) in ((2, 0), (2, 1))
    assert cheap.choose_refined("peagle", 0, 0, 8, rows=1, draft_len=1) == (1, 0)  # a single draft is never refined
    assert cheap.refine_share("peagle", 4) == pytest.approx(0.1)  # the nearest batch size's share
    assert AutoDraftLen(8, 16).refine_share("peagle", 4) == 1.0  # none timed: a refining call costs what the one call does
    assert not cheap.exploring_refines("peagle")
    described = cheap.describe("peagle", 1)
    assert described["refine_rounds"] == 400 and described["refined_tokens_k2_4"][1][-1] > described["refined_tokens_k2_4"][0][-1] + 1.0
    assert described["refines_timed"] == {2: [2, pytest.approx(2 * 0.1 * 0.1 * 1e3)]}  # 2 calls, 0.02 s: the first round not timed


def test_refining_calls_can_pay_where_the_one_call_does_not():
    """pays_at (may_draft's check, once a round): a one call at 1.4 target steps does not pay at the method's acceptance
    (its own chain, unrefined: 4 drafts make about 2.3 tokens in 2.43 steps), but one refining call at a tenth of it
    lifts them to about 3.5 in 2.57 steps: the request may draft. Calls that cost 20 target steps do not pay, nor does
    the one call; a perfect drafter's check prices the one call alone."""
    for share, pays in ((0.1, True), (200.0, False)):
        auto = refining_auto(share)
        auto.verify_cost = lambda rows, width: 1.0 + 0.01 * (width - 1)
        auto.drafting_costs = lambda method, rows, limit, t_draft: [0.0] + [1.4] * limit
        a = auto.acceptance("peagle", 0, 0)
        assert auto.expected_refined("peagle", a, 4, 0)[4] < 2.43 < auto.expected_refined("peagle", a, 4, 1)[4]
        assert auto.pays_at("peagle", 1, a) is pays
        assert auto.pays_at("peagle", 1)  # a perfect drafter's 9 tokens pay for the one call


def test_only_rounds_that_measured_every_number_of_calls_end_the_exploring():
    """A round that made fewer than the most calls (and was not settled) measured only the fewer: the method keeps
    exploring until REFINE_EXPLORE rounds measured them all. Each round counts the unrefined chain's acceptance at each
    position, and each n's drafts kept more than none's among the first k drafts."""
    auto = AutoDraftLen(8, 16)
    auto.refining = {"peagle": 3}
    for _ in range(20):
        auto.record_fewer("peagle", 1, [(1, True), (3, True)], 4)
    assert auto.exploring_refines("peagle")
    for _ in range(20):  # single drafts (probes): settled, but never refined
        auto.record_fewer("peagle", 0, [(0, True)] * 4, 1)
    assert auto.exploring_refines("peagle")
    for _ in range(REFINE_EXPLORE):
        auto.record_fewer("peagle", 3, [(1, True)] * 4, 4)
    assert not auto.exploring_refines("peagle")
    assert auto.unrefined_reached["peagle"][:3] == [40 + REFINE_EXPLORE, 20 + REFINE_EXPLORE, 0]  # kept 1, missed the 2nd
    assert auto.unrefined_accepted["peagle"][:2] == [20 + REFINE_EXPLORE, 0]
    assert auto.gain_rounds["peagle"][1] == [40 + REFINE_EXPLORE] + [20 + REFINE_EXPLORE] * 3 + [0] * 4  # a single draft: no gain
    assert auto.gain_sum["peagle"][1][:4] == [0, 20, 20, 0]  # 3 kept against 1: positions 2 and 3 kept more often


def test_a_censored_draft_counts_at_its_chance_beyond_the_targets_tokens():
    """With no call the draft kept 2 and matched all the target said (censored); refined once it kept 1 and missed. The
    gain at position 2 is -1 (known), at 3 and 4 minus the unrefined draft's chance of getting there (the unrefined
    acceptance there, from the counts): neither a miss (which would favour refining) nor left out."""
    auto = AutoDraftLen(8, 16)
    auto.refining = {"peagle": 1}
    for _ in range(8):  # unrefined drafts that kept 3 of 4: positions 1-3 kept 8 in 8, position 4 missed 8 in 8
        auto.record_fewer("peagle", 0, [(3, True), (3, True)], 4)
    auto.gain_sum["peagle"][1] = [0.0] * 8
    auto.record_fewer("peagle", 1, [(2, False), (1, True)], 4)
    p3, p4 = 9 / 10, 1 / 10  # (kept + 1) / (reached + 2) at positions 3 and 4
    assert auto.gain_sum["peagle"][1][:4] == pytest.approx([0.0, -1.0, -p3, -p3 * p4])
    assert auto.unrefined_reached["peagle"][:4] == [8 + 1, 8 + 1, 8, 8] and auto.unrefined_accepted["peagle"][:3] == [9, 9, 8]


def test_a_fixed_number_of_refining_calls_is_priced_in_the_round_and_auto_times_them_apart():
    """A round's refining calls (Proposer.refined) are timed apart from its one call: for a drafter whose calls auto
    chooses, as a share of that call; for a fixed number of calls, added back to the round's price."""
    from types import SimpleNamespace

    from specdec.runtime.draft_policy import AutoDraftPolicy
    from specdec.runtime.request import AUTO

    for refining in ({}, {"peagle": 3}):
        cost = AutoDraftLen(8, 16)
        cost.one_call, cost.refining = {"peagle"}, refining
        policy = AutoDraftPolicy(cost)
        policy.begin([SimpleNamespace(draft_len=AUTO, method="peagle")], 1)
        for _ in range(2):  # (a shape's first call is not timed)
            policy.proposed("peagle", 1, 4, 0.1, 0, 0.0, (2, 0.05))
        if refining:
            assert cost.draft_s[("peagle", 1)] == pytest.approx(0.1) and cost.refine_share("peagle", 1) == pytest.approx(0.25)
        else:
            assert cost.draft_s[("peagle", 1)] == pytest.approx(0.15) and not cost.refine_ratio


def test_only_requests_whose_drafts_measure_refining_explore_it():
    """While the method explores, a greedy request refines as far as its chain goes; a sampled one (its draws say
    nothing of what fewer calls would have drafted) takes the number the cost model expects to pay, and a single draft
    none, whatever it took before."""
    from types import SimpleNamespace

    from specdec.runtime.draft_policy import AutoDraftPolicy
    from specdec.runtime.metrics import Metrics
    from specdec.runtime.sampling import SamplingConfig

    cost = AutoDraftLen(8, 16)
    cost.one_call, cost.refining = {"peagle"}, {"peagle": 7}
    policy = AutoDraftPolicy(cost)
    policy.begin([], 3)

    def request(sampling):
        return SimpleNamespace(draft_len=4, method="peagle", metrics=Metrics(requests=1), processor=None, refine_calls=None,
                               auto_refine=None, config=SimpleNamespace(sampling=sampling, max_output_len=64), output_ids=[1])

    greedy, hot = request(SamplingConfig()), request(SamplingConfig(temperature=0.8))
    policy.refine_calls(greedy, 4, 1)
    policy.refine_calls(hot, 4, 1)
    assert cost.exploring_refines("peagle") and greedy.refine_calls == 3 and hot.refine_calls == 0
    policy.refine_calls(greedy, 1, 1)
    assert greedy.refine_calls == 0


def test_the_batch_width_reads_what_a_requests_refining_calls_bought():
    """Once a chain was refined, the batch's call width (batch_cap) weighs its drafts at what its calls bought (they are
    paid for already), not at the unrefined acceptance (0.4 past the first draft here, 0.85 refined). Measured before:
    auto refining at batch 4 on the 325M pair had its refined chains cut short (acceptance 1.62 against 1.83 unrefined)."""
    from types import SimpleNamespace

    from specdec.runtime.draft_policy import AutoDraftPolicy
    from specdec.runtime.metrics import Metrics
    from specdec.runtime.request import AUTO

    cost = refining_auto(0.1)
    policy = AutoDraftPolicy(cost)
    chain = Draft(np.arange(100, 104))
    r = SimpleNamespace(draft_len=AUTO, method="peagle", metrics=Metrics(requests=1), refine_calls=1)
    refined = policy.expected_curve(r, chain)
    a = cost.acceptance("peagle", 0, 0)
    assert refined == pytest.approx(cost.expected_refined("peagle", a, 4, 1))
    r.refine_calls = 0
    unrefined = policy.expected_curve(r, chain)
    assert unrefined == pytest.approx(cost.expected_refined("peagle", a, 4, 0)) and refined[4] > unrefined[4] + 1
