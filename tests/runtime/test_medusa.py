"""Medusa chain drafting: heads built into the target engine (medusa_logits), drafted by MedusaProposer.

Parity: the network's medusa_logits equal train/medusa.py's MedusaHeads (torch) on the Hugging Face model's
post-norm hidden states, in both lowerings. Exactness: greedy Medusa output is the target's own greedy output
at every draft length, alone and in a ragged batch.
"""

import json
import subprocess
import sys

import numpy as np
import pytest
import torch
from checkpoints import load_hf, make_checkpoint
from conftest import build_and_load, spec_build
from distributions import assert_drawn_tree, chi_square_critical, homogeneity, keeps_target_distribution, sampled_pairs
from engine_runs import run_until_done

from specdec.builder.build import build_engine
from specdec.formats.errors import CheckpointError, EngineError, SpecdecError
from specdec.runtime.engine import Engine, SpeculationConfig
from specdec.runtime.proposers.medusa import MedusaProposer
from specdec.runtime.request import GenerationConfig
from specdec.runtime.sampling import SamplingConfig
from specdec.train.export import medusa_config, save_heads
from specdec.train.medusa import MedusaHeads

NUM_HEADS, NUM_LAYERS = 3, 1
PROMPTS = [[5, 6, 7, 8, 9, 10], [11, 12, 13], [20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30]]


def write_heads(ckpt, out, num_heads=NUM_HEADS, num_layers=NUM_LAYERS, seed=1, copy_lm_head=False, **config_overrides):
    """Medusa heads in ModelOpt's layout (specdec-train's export): random ResBlocks (not the identity a fresh
    head starts as), or (copy_lm_head) identity ResBlocks and the base's LM head, which draft repeats of the next token."""
    base_cfg = json.loads((ckpt / "config.json").read_text())
    hf = load_hf(ckpt)
    torch.manual_seed(seed)
    heads = MedusaHeads(base_cfg["hidden_size"], base_cfg["vocab_size"], num_heads, num_layers, hf.lm_head.weight.detach())
    if not copy_lm_head:
        with torch.no_grad():
            for p in heads.parameters():
                p.copy_(torch.randn_like(p) * (0.3 if p.dim() == 1 or p.shape[0] == p.shape[1] else 3.0 / p.shape[1] ** 0.5))
    save_heads(heads, {**medusa_config(base_cfg, num_heads, num_layers, {"test": True}), **config_overrides}, out)
    return heads, hf


@pytest.fixture(scope="module")
def medusa(tmp_path_factory):
    d = tmp_path_factory.mktemp("medusa")
    ckpt = make_checkpoint(d / "target", num_hidden_layers=2, seed=0)
    heads, hf = write_heads(ckpt, d / "heads")
    write_heads(ckpt, d / "copy_heads", copy_lm_head=True)
    return {"dir": d, "ckpt": ckpt, "heads": heads, "hf": hf}


def _build_medusa(ckpt, heads_dir, out, **kw):
    build_engine(ckpt, out, spec_build(8, speculative_decoding_mode="medusa", **kw), say=lambda _: None, medusa_dir=heads_dir)


@pytest.fixture(scope="module")
def engines(medusa):
    d = medusa["dir"]
    from specdec.formats.engine_format import load_engine_dir
    from specdec.runtime.backends.onnxruntime.cpu import OrtExecutor

    out = {}
    for name, heads in (("random", "heads"), ("copy", "copy_heads")):
        _build_medusa(medusa["ckpt"], d / heads, d / f"e_{name}")
        out[name] = OrtExecutor(load_engine_dir(d / f"e_{name}"), num_threads=1)
    return out


@pytest.mark.parametrize("lowering", ["ort_cpu", "portable"])
def test_medusa_logits_match_the_heads(medusa, lowering, tmp_path):
    from specdec.formats.engine_format import load_engine_dir
    from specdec.runtime.backends.onnxruntime.cpu import OrtExecutor

    _build_medusa(medusa["ckpt"], medusa["dir"] / "heads", tmp_path / "e", lowering=lowering)
    engine = load_engine_dir(tmp_path / "e")
    assert engine.config.build.speculative_decoding_mode == "medusa"
    assert (engine.config.build.medusa_num_heads, engine.config.build.medusa_num_layers) == (NUM_HEADS, NUM_LAYERS)
    ex = OrtExecutor(engine, num_threads=1)
    prompt = PROMPTS[2]
    out = ex.forward(ex.new_cache(1), [prompt], all_logits=True)
    logits, got = out.logits.copy(), out.extras["medusa_logits"].copy()  # [1, L, vocab], [1, L, heads, vocab]
    with torch.no_grad():
        out = medusa["hf"](torch.tensor([prompt]), output_hidden_states=True)
        hidden = out.hidden_states[-1]  # after the final norm: what lm_head and the heads read
        want = medusa["heads"](hidden).permute(1, 2, 0, 3).numpy()  # [heads, 1, L, V] -> [1, L, heads, V]
    assert got.shape == (1, len(prompt), NUM_HEADS, 96)
    np.testing.assert_allclose(logits, out.logits.numpy(), atol=2e-4)
    np.testing.assert_allclose(got, want, atol=2e-4)
    # the context phase (last row only) returns that row's heads
    out = ex.forward(ex.new_cache(1), [prompt], all_logits=False)
    np.testing.assert_allclose(out.extras["medusa_logits"][0, 0], want[0, -1], atol=2e-4)


def _generate(target, prompts, method, draft_len, max_output_len=24, choices=None, sampling=SamplingConfig(temperature=0.0)):
    proposers = [MedusaProposer(target, choices)] if method == "medusa" else []
    engine = Engine(target, proposers, SpeculationConfig(method, draft_len))
    cfg = GenerationConfig(max_output_len=max_output_len, sampling=sampling)
    ids = [engine.add_request(p, cfg) for p in prompts]
    done = run_until_done(engine)
    return [done[i].output_ids for i in ids], engine.stats


@pytest.mark.parametrize("heads", ["random", "copy"])
def test_greedy_medusa_is_exact(engines, heads):
    target = engines[heads]
    accepted = 0
    for prompts in ([PROMPTS[0]], PROMPTS):  # alone, and a ragged batch of 3
        want, _ = _generate(target, prompts, "none", 0)
        for k in [*range(1, NUM_HEADS + 1), "auto"]:
            got, stats = _generate(target, prompts, "medusa", k)
            assert got == want, (heads, len(prompts), k)
            accepted += stats.accepted
    if heads == "copy":
        assert accepted > 0  # the acceptance path ran, not only rejections


def _run_mixed(target, proposers, prompts, methods, k):
    """Each prompt with its method; per request (output ids, drafted, accepted)."""
    engine = Engine(target, proposers, SpeculationConfig("none", 0))
    ids = [engine.add_request(p, GenerationConfig(max_output_len=24, method=m, draft_len=k)) for p, m in zip(prompts, methods, strict=True)]
    done = run_until_done(engine)
    return [(done[i].output_ids, done[i].metrics.drafted, done[i].metrics.accepted) for i in ids]


def test_medusa_drafts_from_its_own_target_call_when_the_target_runs_in_between(engines):
    """The heads Medusa drafts from come with the target call they belong to (StepOutput at the prefill, TargetOutput
    after each verification), never from whatever the executor ran last. Here a draft model that is the target's
    own executor (a cache of its own) prefills its request right after the target's prefill and before Medusa reads
    it: every request's output and acceptance are those of the same engine with Medusa reading first."""
    from specdec.runtime.proposers.draft_model import DraftModelProposer

    target = engines["copy"]  # heads that draft well: acceptance says whether the right heads were read
    methods = ["medusa", "draft", "medusa"]
    first = _run_mixed(target, [MedusaProposer(target), DraftModelProposer(target)], PROMPTS, methods, NUM_HEADS)
    between = _run_mixed(target, [DraftModelProposer(target), MedusaProposer(target)], PROMPTS, methods, NUM_HEADS)
    want, _ = _generate(target, PROMPTS, "none", 0)
    assert [out for out, _, _ in between] == want
    assert between == first
    assert sum(accepted for (_, _, accepted), m in zip(between, methods, strict=True) if m == "medusa") > 0


def test_a_calls_outputs_survive_a_call_on_another_cache(engines):
    """A StepOutput's arrays belong to its cache: a call of the same shape on another cache leaves them as they were."""
    ex = engines["random"]
    out = ex.forward(ex.new_cache(1), [PROMPTS[0]], all_logits=True)
    logits, heads = out.logits.copy(), out.extras["medusa_logits"].copy()
    other = ex.forward(ex.new_cache(1), [PROMPTS[2][: len(PROMPTS[0])]], all_logits=True)  # same shape, other tokens
    assert not np.allclose(other.extras["medusa_logits"], heads)
    np.testing.assert_array_equal(out.logits, logits)
    np.testing.assert_array_equal(out.extras["medusa_logits"], heads)


def test_a_medusa_target_verifies_other_drafts(engines):
    """A Medusa target is also a draft_tokens_external target: n-gram drafts on it keep the greedy output."""
    from specdec.runtime.proposers.ngram import NGramProposer

    target = engines["random"]
    want, _ = _generate(target, PROMPTS, "none", 0)
    engine = Engine(target, [NGramProposer(NUM_HEADS, 2), MedusaProposer(target)], SpeculationConfig("ngram", 2))
    cfg = GenerationConfig(max_output_len=24)
    ids = [engine.add_request(p, cfg if i != 1 else GenerationConfig(max_output_len=24, method="medusa", draft_len=3)) for i, p in enumerate(PROMPTS)]
    done = run_until_done(engine)
    assert [done[i].output_ids for i in ids] == want


def test_load_engine_takes_a_medusa_targets_drafter_from_the_mode_table(engines):
    """A chain of every head (at most max_draft_len) by default, a tree's nodes with --medusa_choices; with_tree keeps the
    target; the draft lengths a server offers per method come from the same place."""
    from specdec.runtime.loading import load_engine, method_draft_lens
    from specdec.runtime.proposers.own import own_drafter
    from specdec.runtime.tree import parse_choices

    path = engines["random"].engine.path
    engine = load_engine(path, num_threads=1)
    proposer = engine.proposers["medusa"]
    assert own_drafter("medusa") is MedusaProposer and type(proposer) is MedusaProposer
    assert (proposer.max_chain_len, proposer.default_draft_len) == (NUM_HEADS, NUM_HEADS)
    assert engine.speculation == SpeculationConfig("medusa", NUM_HEADS) and method_draft_lens(engine) == {"medusa": NUM_HEADS}
    treed = proposer.with_tree(parse_choices("[[0], [1], [0, 0]]", "--medusa_choices"))
    assert (treed.target, treed.default_draft_len) == (proposer.target, 3)
    assert load_engine(path, num_threads=1, medusa_choices="[[0], [1], [0, 0]]").speculation.draft_len == 3
    assert own_drafter("draft_tokens_external") is None


def test_medusa_proposer_needs_a_medusa_target(tmp_path, medusa):
    plain = build_and_load(medusa["ckpt"], tmp_path / "plain", spec_build(2))
    with pytest.raises(EngineError, match="speculative_decoding_mode medusa"):
        MedusaProposer(plain)


@pytest.mark.parametrize(
    "case, match",
    [
        ("no_dir", "needs --medusa_dir"),
        ("no_dir_no_len", "needs --medusa_dir"),
        ("missing_dir", "does not exist"),
        ("hidden", "hidden_size"),
        ("vocab", "vocab_size"),
        ("wrong_mode", "needs --speculative_decoding_mode medusa"),
    ],
)
def test_bad_medusa_builds_say_why(medusa, tmp_path, case, match):
    d, ckpt = medusa["dir"], medusa["ckpt"]
    heads_dir, build = d / "heads", spec_build(NUM_HEADS, speculative_decoding_mode="medusa")
    if case == "no_dir":
        heads_dir = None
    elif case == "no_dir_no_len":  # the flag missing is what is said, not the draft length it would have set
        heads_dir, build = None, spec_build(0, speculative_decoding_mode="medusa")
    elif case == "missing_dir":
        heads_dir = tmp_path / "nowhere"
    elif case in ("hidden", "vocab"):
        other = make_checkpoint(tmp_path / "other", num_hidden_layers=1,
                                **({"hidden_size": 32, "intermediate_size": 64} if case == "hidden" else {"vocab_size": 80}))
        heads_dir = tmp_path / "other_heads"
        write_heads(other, heads_dir)
    elif case == "wrong_mode":
        build = spec_build(NUM_HEADS)
    with pytest.raises((SpecdecError, CheckpointError), match=match) as info:
        build_engine(ckpt, tmp_path / "out", build, say=lambda _: None, medusa_dir=heads_dir)
    assert "\n" not in str(info.value)
    assert not (tmp_path / "out").exists()


def test_cli_builds_a_medusa_engine(medusa, tmp_path):
    out = tmp_path / "engine"
    code = "from specdec.cli.build import main; main()"
    args = ["--checkpoint_dir", str(medusa["ckpt"]), "--output_dir", str(out), "--speculative_decoding_mode", "medusa",
            "--medusa_dir", str(medusa["dir"] / "heads"), "--max_seq_len", "96", "--max_batch_size", "2"]
    done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    build = json.loads((out / "config.json").read_text())["build"]
    # the default draft length is the tree's node budget, 8, not the number of heads (a tree verifies more nodes than heads)
    assert (build["speculative_decoding_mode"], build["max_draft_len"], build["medusa_num_heads"], build["tree_attention"]) == ("medusa", 8,
                                                                                                                                NUM_HEADS, True)
    bad = subprocess.run([sys.executable, "-c", code, *args[:4], "--speculative_decoding_mode", "medusa", "--max_seq_len", "96", "--force"],
                         capture_output=True, text=True)
    assert bad.returncode != 0 and "needs --medusa_dir" in bad.stderr and len(bad.stderr.strip().splitlines()) == 1, bad.stderr


def test_chain_is_the_heads_on_the_last_kept_row(engines, medusa):
    """Each round's chain is [argmax head 0..k-1] on the hidden state that picked the request's last token
    (head i guesses t+2+i, train/medusa.py), checked against the torch heads on the whole sequence."""
    target, seen = engines["random"], []

    class Recording(MedusaProposer):
        def propose(self, requests, draft_lens):
            got = super().propose(requests, draft_lens)
            seen.extend((r.prompt_ids + r.output_ids, d.tokens.tolist()) for r, d in zip(requests, got, strict=True))
            return got

    engine = Engine(target, [Recording(target)], SpeculationConfig("medusa", NUM_HEADS))
    for p in PROMPTS:
        engine.add_request(p, GenerationConfig(max_output_len=16))
    while engine.has_unfinished():
        engine.step()
    assert len(seen) > 10 and sum(len(d) == NUM_HEADS for _, d in seen) > 5
    with torch.no_grad():
        for seq, drafts in seen:
            hidden = medusa["hf"](torch.tensor([seq]), output_hidden_states=True).hidden_states[-1]
            want = medusa["heads"](hidden[:, len(seq) - 2]).argmax(-1)[:, 0].tolist()  # the row that picked seq[-1]
            assert drafts and drafts == want[: len(drafts)], (seq, drafts, want)  # fewer near max_output_len


TREES = ["[[0], [1], [0, 0], [1, 0], [0, 1]]", "[[0], [1], [2], [0, 0], [0, 1], [1, 0], [0, 0, 0], [0, 0, 1]]"]


@pytest.mark.parametrize("heads", ["random", "copy"])
@pytest.mark.parametrize("choices", TREES)
def test_greedy_medusa_tree_is_exact(engines, heads, choices):
    """Tree drafting (--medusa_choices) verified in one call: the target's greedy output, alone and in a ragged batch."""
    target = engines[heads]
    nodes = len(json.loads(choices))
    for prompts in ([PROMPTS[0]], PROMPTS):
        want, _ = _generate(target, prompts, "none", 0)
        got, stats = _generate(target, prompts, "medusa", nodes, choices=choices)
        assert got == want, (heads, len(prompts), choices)
        assert stats.drafted > 0 and len(stats.drafted_at) <= 3  # per-depth counts: never deeper than the tree
        if heads == "copy":
            assert stats.accepted > 0


def test_tree_accepts_at_least_its_chain(engines):
    """A tree that holds the chain [[0], [0, 0], [0, 0, 0]] plus second choices accepts at least as much per round."""
    target = engines["copy"]
    _, chain = _generate(target, PROMPTS, "medusa", 3, choices="[[0], [0, 0], [0, 0, 0]]")
    _, tree = _generate(target, PROMPTS, "medusa", 8, choices=TREES[1])
    assert tree.mean_acceptance_length >= chain.mean_acceptance_length > 1.0


def test_every_request_drafts_the_tree_and_bad_trees_are_refused(engines):
    """Greedy and sampled requests in one batch both draft the tree: a greedy one the heads' top candidates, a sampled
    one each depth's draws without replacement from its head's processed distribution, with that distribution."""
    target = engines["copy"]
    proposer = MedusaProposer(target, TREES[0])
    engine = Engine(target, [proposer], SpeculationConfig("medusa", 5))
    greedy = engine.add_request(PROMPTS[0], GenerationConfig(max_output_len=8))
    sampled = engine.add_request(PROMPTS[1], GenerationConfig(max_output_len=8, sampling=SamplingConfig(temperature=0.8)))
    engine.step()
    tree, drawn = proposer.propose([engine.requests[greedy], engine.requests[sampled]], [5, 5])
    assert tree.parents.tolist() == drawn.parents.tolist() == [-1, -1, 0, 0, 1] and tree.probs is None
    assert_drawn_tree(drawn, 96)
    assert drawn.tokens[2] == drawn.tokens[4]  # [0, 0] and [1, 0]: depth 2's first draw under both parents
    with pytest.raises(EngineError, match="deep"):
        MedusaProposer(target, "[[0], [0, 0], [0, 0, 0], [0, 0, 0, 0]]")
    with pytest.raises(EngineError, match="more than the target engine's max_draft_len"):
        MedusaProposer(target, [[i] for i in range(9)])
    with pytest.raises(EngineError, match="vocabulary"):
        MedusaProposer(target, [[0], [500]])


@pytest.mark.parametrize("heads", ["random", "copy"])
@pytest.mark.parametrize("choices", TREES)
def test_sampled_medusa_tree_keeps_the_target_distribution(engines, heads, choices):
    """Sampled trees, verified by recursive rejection sampling: the first two output tokens over 1200 seeds are
    distributed as target-only sampling's (chi-square homogeneity test, p > 0.001), with heads whose guesses are
    random (most draws rejected: the residuals) and heads that copy the next token (most kept)."""
    target = engines[heads]
    keeps_target_distribution(target, lambda: MedusaProposer(target, choices), "medusa", len(json.loads(choices)), PROMPTS[1],
                              dict(temperature=1.5, top_k=4))


def test_sampled_medusa_chain_keeps_the_target_distribution(engines):
    """Sampled chains draw drafts from the heads' processed distributions and pass them with their probabilities
    (rejection sampling); the first two output tokens over 1200 seeds are distributed as target-only sampling's
    (chi-square homogeneity test, p > 0.001)."""
    target = engines["copy"]
    sampling = dict(temperature=1.5, top_k=4)
    proposer = MedusaProposer(target)
    engine = Engine(target, [proposer], SpeculationConfig("medusa", 2))
    rid = engine.add_request(PROMPTS[1], GenerationConfig(max_output_len=4, sampling=SamplingConfig(**sampling)))
    engine.step()
    (draft,) = proposer.propose([engine.requests[rid]], [2])
    assert draft.probs is not None and draft.probs.shape == (2, 96)
    np.testing.assert_allclose(draft.probs.sum(-1), 1.0)
    assert ((draft.probs > 0).sum(-1) <= 4).all()  # top_k applied to q as to p
    counts = {}
    for method in ("none", "medusa"):
        proposers = [MedusaProposer(target)] if method == "medusa" else []
        engine = Engine(target, proposers, SpeculationConfig(method, 2 if method == "medusa" else 0))
        counts[method] = sampled_pairs(engine, PROMPTS[1], sampling)
        if method == "medusa":
            assert engine.stats.accepted > 0
    stat, n_keys = homogeneity(counts["none"], counts["medusa"])
    assert n_keys >= 4 and stat < chi_square_critical(n_keys - 1), (stat, n_keys)


def test_a_modelopt_whole_model_export_builds_and_runs(medusa, tmp_path):
    """ModelOpt saves the whole model: the base's tensors and the heads' (``medusa_heads.{i}.{j}.linear.*``,
    ``medusa_heads.{i}.{layers}.weight``) in one file, the base's config.json plus a "medusa" block. Written here
    by hand (not by our exporter), float16: it builds, and greedy Medusa chains and trees equal target-only."""
    from safetensors.torch import load_file, save_file

    d = tmp_path / "modelopt"
    d.mkdir()
    tensors = {k: t.to(torch.float16) for k, t in load_file(str(medusa["ckpt"] / "model.safetensors")).items()}
    g = torch.Generator().manual_seed(3)
    hidden, vocab = 64, 96
    for i in range(2):
        tensors[f"medusa_heads.{i}.0.linear.weight"] = (torch.randn(hidden, hidden, generator=g) * 0.2).to(torch.float16)
        tensors[f"medusa_heads.{i}.0.linear.bias"] = (torch.randn(hidden, generator=g) * 0.1).to(torch.float16)
        tensors[f"medusa_heads.{i}.1.weight"] = tensors.get("lm_head.weight", tensors["model.embed_tokens.weight"]).clone()
    save_file(tensors, str(d / "model.safetensors"))
    cfg = json.loads((medusa["ckpt"] / "config.json").read_text())
    assert (cfg["hidden_size"], cfg["vocab_size"]) == (hidden, vocab)
    (d / "config.json").write_text(json.dumps({**cfg, "medusa": {"num_medusa_heads": 2, "num_medusa_layers": 1}}))
    _build_medusa(medusa["ckpt"], d, tmp_path / "e")
    from specdec.formats.engine_format import load_engine_dir
    from specdec.runtime.backends.onnxruntime.cpu import OrtExecutor

    target = OrtExecutor(load_engine_dir(tmp_path / "e"), num_threads=1)
    assert target.build.medusa_num_heads == 2 and target.extra_outputs == {"medusa_logits"}
    want, _ = _generate(target, PROMPTS, "none", 0)
    for k, choices in ((2, None), (4, "[[0], [1], [0, 0], [1, 0]]")):
        got, stats = _generate(target, PROMPTS, "medusa", k, choices=choices)
        assert got == want and stats.drafted > 0


@pytest.mark.parametrize("choices", [None, "[[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0]]"], ids=["chain", "tree"])
def test_greedy_medusa_with_penalties_and_bias_equals_target_only(engines, choices):
    """The logits processing chain on a Medusa target: each verified row (a tree node's too) processed with its own path."""
    settings = SamplingConfig(temperature=0.0, repetition_penalty=1.5, frequency_penalty=0.5, presence_penalty=0.2, logit_bias=((7, 2.0),))
    target = engines["copy"]
    want, _ = _generate(target, PROMPTS, "none", 0, sampling=settings)
    plain, _ = _generate(target, PROMPTS, "none", 0)
    assert want != plain  # the settings change the output
    got, stats = _generate(target, PROMPTS, "medusa", 6 if choices else NUM_HEADS, choices=choices, sampling=settings)
    assert got == want and stats.drafted > 0
