"""Invariant 2: greedy speculative decoding emits exactly target-only's tokens.

Draft-target for every draft length up to the engine's max, n-gram, batch 1
and ragged batches; identity draft = 100% acceptance; clean stops.
"""

import re

import numpy as np
import pytest
from checkpoints import make_checkpoint
from conftest import build_and_load, spec_build, spec_pair

from specdec.formats.config_strings import DraftTargetConfig, NGramConfig
from specdec.runtime.loading import load_orchestrator
from specdec.runtime.orchestrator import GenerationConfig, Orchestrator
from specdec.runtime.pairing import PairWarning
from specdec.runtime.proposers.draft_model import DraftModelProposer
from specdec.runtime.proposers.ngram import NGramProposer
from specdec.runtime.sampling import SamplingConfig

MAX_DRAFT = 5
PROMPTS = [[5, 6, 7, 8, 9, 10], [11, 12, 13], [20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30]]
REPETITIVE = [[40, 41, 42, 43, 44, 45, 40, 41, 42, 43, 44, 45, 40, 41], [7, 8, 9, 7, 8, 9, 7, 8]]


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    return spec_pair(tmp_path_factory.mktemp("orch"), MAX_DRAFT)


def run(orch, prompts, **cfg):
    return orch.generate(prompts, GenerationConfig(**{"max_output_len": 40, **cfg}))


@pytest.mark.parametrize("draft_len", range(1, MAX_DRAFT + 1))
@pytest.mark.parametrize("prompts", [PROMPTS[:1], PROMPTS], ids=["batch1", "ragged-batch3"])
def test_draft_target_greedy_equals_target_only(engines, draft_len, prompts):
    base, _ = run(Orchestrator(engines["target"]), prompts)
    spec, m = run(Orchestrator(engines["target"], DraftModelProposer(engines["draft"]), draft_len), prompts)
    assert [o.output_ids for o in spec] == [o.output_ids for o in base]
    assert m.drafted > 0


@pytest.mark.parametrize("threshold", [0.3, 0.9])
def test_confidence_threshold_drafts_less_and_changes_nothing(engines, threshold):
    base, _ = run(Orchestrator(engines["target"]), PROMPTS)
    fixed, m_fixed = run(Orchestrator(engines["target"], DraftModelProposer(engines["draft"]), 5), PROMPTS)
    adaptive, m = run(Orchestrator(engines["target"], DraftModelProposer(engines["draft"], confidence_threshold=threshold), 5), PROMPTS)
    assert [o.output_ids for o in adaptive] == [o.output_ids for o in base]
    assert m.drafted < m_fixed.drafted


def test_identity_draft_accepts_everything(engines):
    """Also checks the draft-cache gap: after a round where every draft is accepted the draft
    has not fed its last draft; if that token were lost, its next drafts would be wrong."""
    spec, m = run(Orchestrator(engines["target"], DraftModelProposer(engines["identity"]), 4), PROMPTS)
    base, _ = run(Orchestrator(engines["target"]), PROMPTS)
    assert [o.output_ids for o in spec] == [o.output_ids for o in base]
    assert m.acceptance_rate == 1.0
    assert m.mean_acceptance_length > 3.5  # 4 drafts + bonus per round, less the truncated last rounds


def test_row_output_is_the_same_alone_or_in_a_batch(engines):
    orch = Orchestrator(engines["target"], DraftModelProposer(engines["draft"]), 3)
    together, _ = run(orch, PROMPTS)
    for prompt, out in zip(PROMPTS, together, strict=True):
        alone, _ = run(orch, [prompt])
        assert alone[0].output_ids == out.output_ids


@pytest.mark.parametrize("prompts", [REPETITIVE, PROMPTS], ids=["repetitive", "plain"])
def test_ngram_greedy_equals_target_only(engines, prompts):
    base, _ = run(Orchestrator(engines["target"]), prompts, max_output_len=48)
    spec, m = run(Orchestrator(engines["target"], NGramProposer(MAX_DRAFT, 2), MAX_DRAFT), prompts, max_output_len=48)
    assert [o.output_ids for o in spec] == [o.output_ids for o in base]
    assert m.drafted > 0


def test_ngram_accepts_drafts_on_copy_heavy_output(engines):
    """A sharpened random model falls into loops; n-gram drafts must then be accepted."""
    _, m = run(Orchestrator(engines["target"], NGramProposer(MAX_DRAFT, 3), MAX_DRAFT), REPETITIVE, max_output_len=60)
    assert m.accepted > 0


def test_max_seq_len_stop_is_clean(engines):
    """max_seq_len=96: a 40-token prompt can grow by 56 tokens, then stops with its reason."""
    prompt = list(range(3, 43))
    orch = Orchestrator(engines["target"], DraftModelProposer(engines["identity"]), 5)
    out, _ = run(orch, [prompt], max_output_len=500)
    assert out[0].finish_reason == "max_seq_len"
    assert len(prompt) + len(out[0].output_ids) == 96
    base, _ = run(Orchestrator(engines["target"]), [prompt], max_output_len=500)
    assert base[0].output_ids == out[0].output_ids


def test_end_id_and_stop_words(engines):
    base, _ = run(Orchestrator(engines["target"]), PROMPTS[:1])
    ids = base[0].output_ids
    orch = Orchestrator(engines["target"], DraftModelProposer(engines["identity"]), 4)
    out, _ = run(orch, PROMPTS[:1], end_ids=(ids[9],))
    cut = ids.index(ids[9]) + 1
    assert out[0].output_ids == ids[:cut] and out[0].finish_reason == "end_id"
    out, _ = run(orch, PROMPTS[:1], stop_words=(tuple(ids[12:14]),))
    assert out[0].output_ids[-2:] == ids[12:14] and out[0].finish_reason == "stop_words"
    out, _ = run(orch, PROMPTS[:1], max_output_len=7)
    assert out[0].output_ids == ids[:7] and out[0].finish_reason == "length"


def test_more_prompts_than_max_batch_run_in_chunks(engines):
    prompts = [[3 + i, 4 + i, 5 + i] for i in range(9)]  # max_batch_size is 4
    orch = Orchestrator(engines["target"], DraftModelProposer(engines["draft"]), 3)
    out, m = run(orch, prompts, max_output_len=10)
    base, _ = run(Orchestrator(engines["target"]), prompts, max_output_len=10)
    assert [o.output_ids for o in out] == [o.output_ids for o in base]
    assert m.requests == 9 and m.output_tokens == 90


def test_same_seed_same_output_with_sampling(engines):
    def sample_run(seed):
        orch = Orchestrator(engines["target"], DraftModelProposer(engines["draft"], use_logits=True), 3)
        return [o.output_ids for o in run(orch, PROMPTS, sampling=SamplingConfig(temperature=1.0, random_seed=seed))[0]]

    assert sample_run(1) == sample_run(1)
    assert sample_run(1) != sample_run(2)


def test_padded_vocabularies_share_the_tokenizer_range(tmp_path):
    """A draft whose vocabulary is padded differently (96 vs 128) still works, comparing over the shared ids; with no
    tokenizer to show that the ids agree, the pairing says so (naming both sizes) before the first round."""
    t = build_and_load(make_checkpoint(tmp_path / "t", vocab_size=128, seed=3), tmp_path / "te", spec_build(4))
    d_ckpt = make_checkpoint(tmp_path / "d", vocab_size=96, seed=3)
    build_and_load(d_ckpt, tmp_path / "de", spec_build(0))
    with pytest.warns(PairWarning, match="vocabularies of 96 and 128 ids, and neither holds a tokenizer.json"):
        orch = load_orchestrator(t.engine.path, tmp_path / "de", DraftTargetConfig(3, [0], [0], False))
    assert orch.vocab_limit == 96
    out, m = run(orch, PROMPTS)
    assert all(max(o.output_ids) < 96 for o in out) and m.drafted > 0
    # sampled, its drafts verified by token compare but over the 96 shared ids: not target-only's tokens for the seed,
    # as specdec-run's --baseline and specdec-bench's sweep say (Engine.sample_differs)
    assert orch.engine.sample_differs() == "sampled over the 96 ids draft and target share"
    from specdec.bench.sweep import run_sweep

    data = [{"input_ids": p, "output_len": 8} for p in PROMPTS]
    with pytest.warns(PairWarning):
        sweep = run_sweep(t.engine.path, ["none", "draft"], tmp_path / "de", [2], 2, data, threads=1, warmup=0, cost_reps=2,
                          sampling=SamplingConfig(temperature=0.9, random_seed=1))
    assert [r["identical_expected"] for r in sweep["rows"]] == [True, False]


@pytest.mark.parametrize("method", ["draft_rejection_sampling", "ngram_token_compare"])
def test_end_to_end_sampling_distribution(tmp_path, method):
    """Sampling through real engines: two tokens decided in one speculative round vs the exact target joint.

    draft_rejection_sampling: a draft model, use_logits=True. ngram_token_compare:
    deterministic n-gram drafts from a repetitive prompt, accepted by comparing with
    the target's own samples (the deterministic-draft rule).
    """
    V = 8
    tck = make_checkpoint(tmp_path / "t", vocab_size=V, seed=5, bos_token_id=0, eos_token_id=0, pad_token_id=0)
    dck = make_checkpoint(tmp_path / "d", vocab_size=V, seed=6, num_hidden_layers=1, bos_token_id=0, eos_token_id=0, pad_token_id=0)
    target = build_and_load(tck, tmp_path / "te", spec_build(2, max_batch_size=8))
    build_and_load(dck, tmp_path / "de", spec_build(0, max_batch_size=8))
    sampling = SamplingConfig(temperature=1.0, random_seed=11)
    prompt = [1, 2, 3, 1, 2, 3, 1, 2, 3] if method.startswith("ngram") else [1, 2, 3]

    def dist(ctx):
        c = target.new_cache(1)
        p = np.exp(target.forward(c, [ctx], all_logits=False).logits[0, 0].astype(np.float64))
        return p / p.sum()

    # exact P(t2, t3) = sum_t1 P(t1) P(t2 | t1) P(t3 | t1, t2): both come out of one draft-2 round
    p1 = dist(prompt)
    joint = np.zeros((V, V))
    for t1 in range(V):
        p2 = dist(prompt + [t1])
        for t2 in range(V):
            joint[t2] += p1[t1] * p2[t2] * dist(prompt + [t1, t2])
    n = 4000
    if method.startswith("ngram"):
        orch = load_orchestrator(target.engine.path, ngram=NGramConfig(2, 2, [0]), sampling=sampling)
    else:
        orch = load_orchestrator(target.engine.path, tmp_path / "de", DraftTargetConfig(2, [0], [0], True), sampling=sampling)
    outs, m = orch.generate([prompt] * n, GenerationConfig(max_output_len=4, sampling=sampling))
    counts = np.zeros((V, V))
    for o in outs:
        counts[o.output_ids[1], o.output_ids[2]] += 1
    assert m.drafted > 0 and 0 < m.accepted < m.drafted
    expected = joint * n
    mask = expected > 5  # chi-square needs enough expected counts per cell
    chi2 = float((((counts - expected) ** 2) / expected)[mask].sum())
    df = int(mask.sum()) - 1
    # 99.9% quantile of chi-square(df) ~ df + 3.1*sqrt(2 df) + 5 (Wilson-Hilferty, rounded up)
    assert chi2 < df + 3.1 * np.sqrt(2 * df) + 5, (chi2, df)


def test_generate_reports_the_rounds_deciding_apart_from_the_loops_own_time(engines):
    """generate()'s Metrics carry the engine's decide_s over the call (each round's decisions once, as its engine times:
    draft_len=auto's choices, a fixed length's trivial one), so other_s is what is neither an engine call nor a decision,
    and the summary's parts add up to its total."""
    for draft_len in ("auto", 4):
        orch = Orchestrator(engines["target"], DraftModelProposer(engines["draft"]), draft_len)
        before = orch.engine.stats.decide_s
        _, m = run(orch, PROMPTS)
        assert m.decide_s > 0 and m.decide_s == pytest.approx(orch.engine.stats.decide_s - before)
        assert m.other_s == pytest.approx(m.total_s - m.target_s - m.draft_s - m.decide_s)
        line = m.summary().splitlines()[1]
        parts = [float(x) for x in re.findall(r"([0-9.]+)s\b", line)]
        assert f"deciding drafts {m.decide_s:.3f}s" in line and parts[0] == pytest.approx(sum(parts[1:]), abs=0.003)


def test_configs_built_in_python_get_the_checks_their_flags_get():
    """A typed config or a GenerationConfig made in Python is checked as the CLI's strings are: stop words as text (read character
    by character, matching nothing), a negative draft length, an n-gram pattern of 0 tokens ran before, without a word."""
    from specdec.formats.config_strings import DraftTargetConfig, NGramConfig
    from specdec.formats.errors import ConfigStringError, RequestError
    from specdec.runtime.prefix_cache import PrefixCacheConfig

    for bad in (("QOr",), "QOr", [["Q", "O"]], ((),), ((5, -1),)):
        with pytest.raises(RequestError, match="stop_words=.* must be a tuple of token-id sequences"):
            GenerationConfig(stop_words=bad)
    assert GenerationConfig(stop_words=((53, 51, 86),), end_ids=[2]).stop_words == ((53, 51, 86),)
    for bad in (2, ("2",), (True,)):
        with pytest.raises(RequestError, match="end_ids=.* must be a tuple of token ids"):
            GenerationConfig(end_ids=bad)
    with pytest.raises(ConfigStringError, match="max_draft_len and max_matching_ngram_size must be >= 1, got 4 and 0"):
        NGramConfig(4, 0, [0])
    with pytest.raises(ConfigStringError, match="--ngram_min_match 3: .* at most max_matching_ngram_size \\(2\\)"):
        NGramConfig(4, 2, [0], min_matching_ngram_size=3)
    with pytest.raises(ConfigStringError, match="draft_len must be >= 1, got -1"):
        DraftTargetConfig(-1, [0], [0], False)
    with pytest.raises(RequestError, match="prefix_cache_slots=4 with prefix caching off"):
        PrefixCacheConfig(enabled=False, slots=4)
