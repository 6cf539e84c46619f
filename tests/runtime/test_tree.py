"""Tree verification: the tree_mask input, per-node positions, KV compaction, and the choices format.

The engine-level property: after the target scores a tree in one call and the K/V of a
non-contiguous accepted path are compacted, every later logit equals that of decoding the
path token by token from scratch, at every depth, alone and in a ragged batch.
"""

import numpy as np
import pytest
from checkpoints import make_checkpoint
from conftest import build_and_load, spec_build

from specdec.formats.errors import EngineError, RequestError
from specdec.runtime.tree import DraftTree, accept_tree_greedy, accept_tree_token_compare, parse_choices

# A tree of 7 drafts under the root r (the last accepted token), in verification order:
#   r -> a(0) -> c(2) -> f(5)
#          \ -> d(3)
#   r -> b(1) -> e(4) -> g(6)
PARENTS = np.array([-1, -1, 0, 0, 1, 2, 4])
PROMPTS = [[5, 6, 7, 8, 9, 10, 11], [30, 31, 32]]


# ort_cuda: its masked attention built in float32, which the CPU runs with the inputs the CUDA executor feeds it
@pytest.fixture(scope="module", params=["ort_cpu", "portable", "ort_cuda"])
def tree_target(request, tmp_path_factory):
    d = tmp_path_factory.mktemp(f"tree_{request.param}")
    ckpt = make_checkpoint(d / "ckpt", num_hidden_layers=2, seed=0)
    dtype = {"ort_cuda": "float32"}.get(request.param, "auto")
    return build_and_load(ckpt, d / "engine", spec_build(8, tree_attention=True, lowering=request.param, dtype=dtype))


def _rows(parents: np.ndarray) -> np.ndarray:
    """Drafts' parents -> the call's parents (row 0 = the root)."""
    return np.concatenate([[-1], parents + 1])


def _scratch(ex, tokens: list[int]) -> np.ndarray:
    """Logits of every position of ``tokens`` decoded in one plain (chain) call on a fresh cache: [len, vocab]."""
    return ex.forward(ex.new_cache(1), [tokens], all_logits=True).logits[0].copy()


def _paths(parents):
    """Every root-to-node path (node indices), the empty path included."""
    out = [[]]
    for j in range(len(parents)):
        p, path = j, []
        while p != -1:
            path.insert(0, p)
            p = parents[p]
        out.append(path)
    return out


def test_tree_rows_equal_each_nodes_own_context(tree_target):
    """Each node's logits are those of its ancestors' tokens decoded as a sequence (the tree mask and positions = depth)."""
    ex, prompt = tree_target, PROMPTS[0]
    rng = np.random.default_rng(0)
    tokens = rng.integers(1, ex.vocab_size, len(PARENTS))
    cache = ex.new_cache(1)
    ex.forward(cache, [prompt[:-1]], all_logits=False)
    logits = ex.forward(cache, [[prompt[-1], *tokens]], all_logits=True, parents=[_rows(PARENTS)]).logits[0].copy()
    for path in _paths(PARENTS):
        want = _scratch(ex, prompt + tokens[path].tolist())[-1]
        row = 0 if not path else path[-1] + 1
        np.testing.assert_allclose(logits[row], want, atol=1e-5, err_msg=str(path))


def test_compacted_path_continues_like_decoding_it_from_scratch(tree_target):
    """Accept each path (every depth, contiguous or not), compact its K/V, then decode 3 more tokens."""
    ex, prompt = tree_target, PROMPTS[0]
    rng = np.random.default_rng(1)
    tokens = rng.integers(1, ex.vocab_size, len(PARENTS))
    for path in _paths(PARENTS):
        cache = ex.new_cache(1)
        ex.forward(cache, [prompt[:-1]], all_logits=False)
        start = int(cache.lengths[0])
        ex.forward(cache, [[prompt[-1], *tokens]], all_logits=True, parents=[_rows(PARENTS)])
        ex.compact_slot(cache, 0, start, [0] + [j + 1 for j in path])
        assert cache.lengths[0] == len(prompt) + len(path)
        seq = prompt + tokens[path].tolist()
        for nxt in (3, 4, 5):
            got = ex.forward(cache, [[nxt]], all_logits=True).logits[0, 0].copy()
            seq.append(nxt)
            np.testing.assert_allclose(got, _scratch(ex, seq)[-1], atol=1e-5, err_msg=str(path))


def test_ragged_batch_with_different_paths(tree_target):
    """Two rows of different lengths, one a tree and one a chain, accept different paths; both continue exactly."""
    ex = tree_target
    rng = np.random.default_rng(2)
    tokens = rng.integers(1, ex.vocab_size, len(PARENTS))
    chain = rng.integers(1, ex.vocab_size, 2)
    cache = ex.new_cache(2)
    ex.forward(cache, [p[:-1] for p in PROMPTS], all_logits=False)
    starts = cache.lengths.copy()
    ex.forward(cache, [[PROMPTS[0][-1], *tokens], [PROMPTS[1][-1], *chain]], all_logits=True, parents=[_rows(PARENTS), None])
    path = [1, 4, 6]  # b, e, g: not contiguous in the call
    ex.compact_slot(cache, 0, int(starts[0]), [0, 2, 5, 7])
    cache.rollback(1, int(starts[1]) + 2)  # the chain keeps its first draft
    seqs = [PROMPTS[0] + tokens[path].tolist(), PROMPTS[1] + chain[:1].tolist()]
    for nxt in ([7, 8], [9, 10]):
        got = ex.forward(cache, [[nxt[0]], [nxt[1]]], all_logits=True).logits[:, 0].copy()
        for row in range(2):
            seqs[row].append(nxt[row])
            np.testing.assert_allclose(got[row], _scratch(ex, seqs[row])[-1], atol=1e-5)


def test_a_chain_through_the_tree_input_is_the_plain_engines_chain(tree_target, tmp_path):
    """Without parents a tree engine computes what a plain engine computes (a lower-triangular tree_mask), bit for bit."""
    ex = tree_target
    ckpt = make_checkpoint(tmp_path / "ckpt", num_hidden_layers=2, seed=0)
    plain = build_and_load(ckpt, tmp_path / "plain", spec_build(8, lowering=ex.build.lowering))
    for e in (ex, plain):
        cache = e.new_cache(1)
        e.forward(cache, [PROMPTS[0]], all_logits=False)
        e.out = e.forward(cache, [[1, 2, 3, 4]], all_logits=True).logits.copy()
    np.testing.assert_array_equal(ex.out, plain.out)
    with pytest.raises(EngineError, match="without tree attention"):
        plain.forward(plain.new_cache(1), [[1, 2]], all_logits=True, parents=[np.array([-1, 0])])


def test_choices_parse_in_tensorrt_llm_format():
    tree = parse_choices("[[1], [0], [0, 0], [1, 0], [0, 1], [0, 0, 0]]")
    assert tree.paths == ((0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0))
    assert tree.parents.tolist() == [-1, -1, 0, 0, 1, 2]
    assert tree.depths.tolist() == [1, 1, 2, 2, 2, 3] and tree.depth == 3
    assert [tree.top_k(d) for d in (1, 2, 3)] == [2, 2, 1]
    assert DraftTree.chain(3).parents.tolist() == [-1, 0, 1]
    for bad, match in (("[[0], [0, 0, 0]]", "missing"), ("[[0], [0]]", "twice"), ("[0, 1]", "non-empty list"),
                       ("[[0],", "not a JSON list"), ("[]", "non-empty list"), ("[[-1]]", "top-k indices")):
        with pytest.raises(RequestError, match=match) as info:
            parse_choices(bad)
        assert "\n" not in str(info.value)


def test_greedy_tree_acceptance_takes_the_longest_matching_path():
    vocab = 10
    tokens = np.array([4, 5, 6, 7, 8, 9, 3])  # a, b, c, d, e, f, g (PARENTS)

    def logits(picks):
        out = np.zeros((len(PARENTS) + 1, vocab))
        out[np.arange(len(picks)), picks] = 1.0
        return out

    # root picks 5 (b), b picks 8 (e), e picks 3 (g), g picks 2 (bonus)
    assert accept_tree_greedy(tokens, PARENTS, logits([5, 0, 8, 0, 0, 3, 0, 2])) == ([1, 4, 6], 2)
    # root picks 4 (a), a picks 7 (d), d's row picks 1
    assert accept_tree_greedy(tokens, PARENTS, logits([4, 7, 0, 0, 1, 0, 0, 0])) == ([0, 3], 1)
    # root picks a token no child has: nothing accepted, that token is the correction
    assert accept_tree_greedy(tokens, PARENTS, logits([2, 0, 0, 0, 0, 0, 0, 0])) == ([], 2)


def test_bad_parents_are_refused_before_the_mask_is_touched(tree_target):
    """A refused tree leaves the call shape's reused tree_mask as it was: the next chain call is the plain one."""
    ex = tree_target
    with pytest.raises(RequestError, match="parents"):
        ex.forward(ex.new_cache(1), [[1, 2, 3]], all_logits=True, parents=[np.array([-1, 2, 0])])
    chain = ex.forward(ex.new_cache(1), [[1, 2, 3]], all_logits=True).logits.copy()
    explicit = ex.forward(ex.new_cache(1), [[1, 2, 3]], all_logits=True, parents=[np.array([-1, 0, 1])]).logits.copy()
    np.testing.assert_array_equal(chain, explicit)


def test_sampled_tree_acceptance_emits_the_targets_own_draws():
    """Token compare down a tree: the first token emitted is distributed as the root row's distribution, and after a
    draw that a child holds the walk goes into that child, whose row gives the next token (chi-square goodness of fit
    over 4000 draws, p > 0.001); a greedy request takes the greedy path."""
    from distributions import chi_square_critical

    from specdec.runtime.sampling import SamplingConfig, TargetDraws

    vocab = 10
    tokens = np.array([4, 5, 6, 7, 8, 9, 3])  # a, b, c, d, e, f, g (PARENTS)
    rows = np.full((len(PARENTS) + 1, vocab), -4.0)
    rows[0, [4, 5, 2]] = [1.0, 0.5, 0.0]  # the root: a, b or a token no child holds
    rows[1, [6, 7, 1]] = [0.2, 0.8, 0.0]  # a's row: c, d or a token no child holds
    probs = np.exp(rows) / np.exp(rows).sum(-1, keepdims=True)
    cfg = SamplingConfig(temperature=1.0)
    firsts, after_a = np.zeros(vocab), np.zeros(vocab)
    for seed in range(4000):
        path, nxt = accept_tree_token_compare(tokens, PARENTS, rows, cfg, TargetDraws(seed).at(0))
        emitted = [int(tokens[j]) for j in path] + [nxt]
        assert all(PARENTS[b] == a for a, b in zip([-1, *path], path, strict=False))  # a path down the tree
        firsts[emitted[0]] += 1
        if path and path[0] == 0:
            after_a[emitted[1]] += 1
    for counts, p in ((firsts, probs[0]), (after_a, probs[1])):
        expected = counts.sum() * p
        stat = float((((counts - expected) ** 2) / expected).sum())
        assert stat < chi_square_critical(vocab - 1), (stat, counts, expected)
    assert firsts[4] > 0 and after_a[7] > 0  # both walks went down
    greedy = accept_tree_token_compare(tokens, PARENTS, rows, SamplingConfig(), TargetDraws(0).at(0))
    assert greedy == accept_tree_greedy(tokens, PARENTS, rows) == ([0, 3], 0)


def _drawn_tree_case(rng: np.random.Generator, q_root: np.ndarray, q_next: np.ndarray, p_next: np.ndarray, p_root: np.ndarray):
    """A sampled tree as a drafter draws it: 3 children of the root drawn without replacement from q_root, 2 under the
    first of them and 1 under the second from q_next[their parent's token], 1 under the first grandchild. The target's
    row at a node depends on its token alone (p_next[token]; the root's p_root). (tokens, parents, probs, logits)."""
    from specdec.runtime.sampling import sample_distinct

    parents = [-1, -1, -1, 0, 0, 1, 3]  # siblings adjacent, parents first: drawing at a parent's first child fills them in order
    tokens, probs = [], []
    for j, parent in enumerate(parents):
        if parent not in parents[:j]:
            q = q_root if parent < 0 else q_next[tokens[parent]]
            drawn = sample_distinct(q, parents.count(parent), rng)
            assert len(drawn) == parents.count(parent)
            tokens += drawn
            probs += [q] * len(drawn)
    logits = np.log(np.vstack([p_root] + [p_next[t] for t in tokens]))
    return np.array(tokens, np.int64), np.array(parents, np.int64), np.array(probs), logits


def test_recursive_rejection_sampling_down_a_drawn_tree_keeps_the_target_distribution():
    """Children drawn without replacement from q (far from the target's p) and tested in turn, each against p's
    residual after its elder siblings: the first two tokens emitted (the second from the next call's target draw where
    the walk stopped at the root) are distributed as p(t1) p(t2 | t1) (chi-square goodness of fit over 12,000 trees,
    p > 0.001, and the first token's alone). Without the residual update, the removal of drawn siblings from q, or a
    uniform of each sibling's own, this fails."""
    from distributions import chi_square_critical

    from specdec.runtime.sampling import SamplingConfig, TargetDraws
    from specdec.runtime.tree import accept_tree_rejection_sampling

    vocab, cfg = 5, SamplingConfig(temperature=1.0)
    gen = np.random.default_rng(7)
    p_root = np.array([0.05, 0.4, 0.3, 0.15, 0.1])
    q_root = np.array([0.5, 0.1, 0.25, 0.05, 0.1])  # favours token 0, which the target rarely picks
    p_next = gen.dirichlet(np.ones(vocab), size=vocab)
    q_next = gen.dirichlet(np.ones(vocab) * 0.5, size=vocab)
    counts = np.zeros((vocab, vocab))
    went_down = 0
    for seed in range(12000):
        tokens, parents, probs, logits = _drawn_tree_case(gen, q_root, q_next, p_next, p_root)
        path, nxt = accept_tree_rejection_sampling(tokens, parents, probs, logits, cfg, TargetDraws(seed).at(0))
        emitted = [int(tokens[j]) for j in path] + [nxt]
        assert all(parents[b] == a for a, b in zip([-1, *path], path, strict=False))  # a path down the tree
        if len(emitted) == 1:
            emitted.append(int(gen.choice(vocab, p=p_next[emitted[0]])))  # the next call's draw
        went_down += len(path) > 0
        counts[emitted[0], emitted[1]] += 1
    expected = counts.sum() * p_root[:, None] * p_next
    stat = float(((counts - expected) ** 2 / expected).sum())
    assert stat < chi_square_critical(vocab * vocab - 1), stat
    firsts, expected_firsts = counts.sum(1), counts.sum() * p_root  # the first token alone: a sharper test of the root's rule
    stat = float(((firsts - expected_firsts) ** 2 / expected_firsts).sum())
    assert stat < chi_square_critical(vocab - 1), stat
    assert went_down > 6000  # most walks kept a drawn child


def test_a_drawn_chain_is_rejection_sampling():
    """A tree with one child per node is a chain: recursive rejection sampling takes the same uniforms as speculative
    sampling's and keeps the same drafts and next token, draft for draft."""
    from specdec.runtime.acceptance import accept_rejection_sampling
    from specdec.runtime.sampling import SamplingConfig, TargetDraws, processed_probs, sample
    from specdec.runtime.tree import accept_tree_rejection_sampling

    gen = np.random.default_rng(3)
    cfg = SamplingConfig(temperature=0.8, top_k=6)
    for seed in range(300):
        k = int(gen.integers(1, 6))
        rows = gen.normal(size=(k + 1, 12)) * 2
        q = processed_probs(gen.normal(size=(k, 12)) * 2 + rows[:k] * gen.random(), cfg)
        drafts = np.array([sample(q[j], gen) for j in range(k)], np.int64)
        chain = accept_rejection_sampling(drafts, q, rows, cfg, TargetDraws(seed).at(4))
        path, nxt = accept_tree_rejection_sampling(drafts, np.arange(-1, k - 1), q, rows, cfg, TargetDraws(seed).at(4))
        assert (len(path), nxt) == chain and path == list(range(len(path)))
