"""EAGLE-3 and P-EAGLE modules with a draft vocabulary of their own (``d2t``, as the published EAGLE-3 heads ship).

lm_head row i scores target token i + d2t[i]; the module engine spreads those logits over the target's vocabulary,
-inf where the module cannot draft. A reordered vocabulary must draft exactly as the module it was made from; a
smaller one exactly so while every token that module drafts is in it; greedy output is the target's whatever the
vocabulary; a d2t that sends a draft id outside the vocabulary or two ids to one token is refused at build.
"""

import json

import numpy as np
import pytest
import torch
from checkpoints import make_checkpoint, write_eagle_module, write_peagle_module
from conftest import spec_build
from engine_runs import open_cpu_executor, run_until_done, torch_one_thread  # noqa: F401 (a fixture)
from safetensors.torch import load_file, save_file

from specdec.builder.build import build_engine
from specdec.formats.engine_format import eagle_module_dir, load_engine_dir
from specdec.formats.errors import SpecdecError
from specdec.runtime.backends.onnxruntime.cpu import OrtExecutor
from specdec.runtime.engine import Engine, SpeculationConfig
from specdec.runtime.proposers.eagle import EagleProposer
from specdec.runtime.proposers.peagle import PEagleProposer
from specdec.runtime.request import GenerationConfig
from specdec.runtime.sampling import SamplingConfig

PROMPTS = [[5, 6, 7, 8, 9, 10], [11, 12, 13], [20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30]]
VOCAB = 96  # make_checkpoint's
TREE = "[[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0]]"
PROPOSERS = {"eagle": EagleProposer, "peagle": PEagleProposer}


def draft_vocab_module(src, out, targets, t2d: bool = True, d2t=None):
    """A copy of module ``src`` whose lm_head scores only ``targets`` (target id of each draft id), in that order."""
    out.mkdir()
    tensors = load_file(src / "model.safetensors")
    tensors["lm_head.weight"] = tensors["lm_head.weight"][torch.as_tensor(targets)].contiguous()
    tensors["d2t"] = torch.as_tensor(targets, dtype=torch.int64) - torch.arange(len(targets)) if d2t is None else torch.as_tensor(d2t)
    if t2d:
        mask = torch.zeros(VOCAB, dtype=torch.bool)
        mask[torch.as_tensor(targets)] = True
        tensors["t2d"] = mask
    save_file(tensors, str(out / "model.safetensors"))
    cfg = json.loads((src / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**cfg, "draft_vocab_size": len(targets)}))
    return out


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    d = tmp_path_factory.mktemp("draft_vocab")
    ckpt = make_checkpoint(d / "base", num_hidden_layers=3, seed=0)
    write_eagle_module(ckpt, d / "eagle", aux_ids=[0, 2])
    write_peagle_module(ckpt, d / "peagle", aux_ids=[0, 2])
    return {"dir": d, "ckpt": ckpt}


def executors(base, mode: str, module_dir, name: str):
    out = base["dir"] / name
    if not out.exists():
        build_engine(base["ckpt"], out, spec_build(8, speculative_decoding_mode=mode), say=lambda _: None, **{f"{mode}_dir": module_dir})
    target = OrtExecutor(load_engine_dir(out), num_threads=1)
    return target, OrtExecutor(load_engine_dir(eagle_module_dir(target.engine)), num_threads=1)


def generate(target, module, mode, draft_len, sampling=SamplingConfig(), max_output_len=20, choices=None):
    """Outputs, stats and every draft the proposer made (its tokens); ``choices``: a draft tree."""
    proposer = PROPOSERS[mode](target, module, choices) if module is not None else None
    drafted: list[int] = []
    if proposer is not None:
        propose = proposer.propose

        def recording(reqs, lens):
            out = propose(reqs, lens)
            drafted.extend(int(t) for d in out for t in d.tokens)
            return out

        proposer.propose = recording
    engine = Engine(target, [proposer] if proposer else [], SpeculationConfig(mode if proposer else "none", draft_len))
    ids = [engine.add_request(p, GenerationConfig(max_output_len=max_output_len, sampling=sampling), seed_stream=i) for i, p in enumerate(PROMPTS)]
    done = run_until_done(engine)
    return [done[i].output_ids for i in ids], engine.stats, drafted


def module_logits(module: OrtExecutor, ids: np.ndarray, hidden: np.ndarray) -> np.ndarray:
    """One call of a module engine's network (its executor's session) on a fresh cache: every row's logits [1, S, vocab]."""
    sess = module.session
    s = ids.shape[1]
    feeds = {"input_ids": ids, "position_ids": np.arange(s, dtype=np.int64)[None], "logits_index": np.arange(s, dtype=np.int64)[None],
             "hidden_states": hidden}
    for inp in sess.get_inputs():
        if inp.name == "tree_mask":
            feeds[inp.name] = np.tril(np.ones((s, s), bool))[None]
        elif inp.name.startswith("past_"):
            feeds[inp.name] = np.zeros([1 if d == "batch" else module.engine.config.build.kv_capacity if d == "kv_capacity" else d
                                        for d in inp.shape], np.float32)
    return sess.run(["logits"], feeds)[0]


@pytest.mark.parametrize("mode", ["eagle", "peagle"])
def test_a_reordered_draft_vocabulary_drafts_as_the_module(base, mode):
    """d2t as a permutation of the whole vocabulary: the same logits column for column, so the same drafts, acceptance
    and output as the module it was made from."""
    targets = np.random.default_rng(1).permutation(VOCAB)
    src = base["dir"] / mode
    t, m = executors(base, mode, src, f"{mode}-full")
    t2, m2 = executors(base, mode, draft_vocab_module(src, base["dir"] / f"{mode}-perm-module", targets), f"{mode}-perm")
    rng = np.random.default_rng(2)
    ids, hidden = rng.integers(4, VOCAB, (1, 7)), rng.standard_normal((1, 7, 64)).astype(np.float32)
    np.testing.assert_allclose(module_logits(m2, ids, hidden), module_logits(m, ids, hidden), rtol=1e-5, atol=1e-5)
    want, stats, drafts = generate(t, m, mode, 4)
    got, stats2, drafts2 = generate(t2, m2, mode, 4)
    assert got == want and drafts2 == drafts
    assert (stats2.drafted, stats2.accepted) == (stats.drafted, stats.accepted) and stats.drafted > 0
    # a tree (each node a top-k pick of its parent's row) and draft_len=auto: the same drafts too
    for k, choices in ((len(json.loads(TREE)), TREE), ("auto", None)):
        want, stats, drafts = generate(t, m, mode, k, choices=choices)
        got, stats2, drafts2 = generate(t2, m2, mode, k, choices=choices)
        assert got == want and drafts2 == drafts and stats2.accepted == stats.accepted and stats.drafted > 0, k


def test_a_smaller_draft_vocabulary_scores_only_its_tokens(base):
    """48 of the 96 tokens: their logits as the full module's, -inf at the rest, in every row; while every token the
    full module drafts is among them the drafts are the same, and greedy output is the target's either way."""
    src = base["dir"] / "eagle"
    t, m = executors(base, "eagle", src, "eagle-full")
    target_only, _, _ = generate(t, None, "none", 0)
    want, stats, drafts = generate(t, m, "eagle", 4)
    rest = [i for i in np.random.default_rng(3).permutation(VOCAB) if i not in set(drafts)]
    targets = np.array(sorted(set(drafts)) + rest[: 48 - len(set(drafts))])
    assert len(targets) == 48
    t2, m2 = executors(base, "eagle", draft_vocab_module(src, base["dir"] / "eagle-48-module", targets), "eagle-48")
    rng = np.random.default_rng(4)
    ids, hidden = rng.integers(4, VOCAB, (1, 9)), rng.standard_normal((1, 9, 64)).astype(np.float32)
    full, small = module_logits(m, ids, hidden), module_logits(m2, ids, hidden)
    assert small.shape == full.shape == (1, 9, VOCAB)
    outside = np.setdiff1d(np.arange(VOCAB), targets)
    np.testing.assert_allclose(small[..., targets], full[..., targets], rtol=1e-5, atol=1e-5)
    assert np.all(small[..., outside] == -np.inf)
    got, stats2, drafts2 = generate(t2, m2, "eagle", 4)
    assert got == want == target_only and drafts2 == drafts and (stats2.drafted, stats2.accepted) == (stats.drafted, stats.accepted)

    # a vocabulary without the module's favourite tokens drafts other ones, never one outside it, and stays exact
    few = np.array(rest[:24])
    t3, m3 = executors(base, "eagle", draft_vocab_module(src, base["dir"] / "eagle-few-module", few, t2d=False), "eagle-few")
    got, stats3, drafts3 = generate(t3, m3, "eagle", 4)
    assert got == target_only and stats3.drafted > 0 and set(drafts3) <= set(few.tolist())


def test_sampled_drafts_keep_to_the_draft_vocabulary(base):
    """Sampled chains: the draft distribution is zero outside the draft vocabulary and sums to one."""
    src = base["dir"] / "eagle"
    targets = np.arange(0, VOCAB, 2)  # the even tokens
    t, m = executors(base, "eagle", draft_vocab_module(src, base["dir"] / "eagle-even-module", targets), "eagle-even")
    proposer = EagleProposer(t, m)
    engine = Engine(t, [proposer], SpeculationConfig("eagle", 3))
    rid = engine.add_request(PROMPTS[1], GenerationConfig(max_output_len=6, sampling=SamplingConfig(temperature=1.5, random_seed=1)))
    engine.step()
    (draft,) = proposer.propose([engine.requests[rid]], [3])
    assert draft.probs is not None and draft.probs.shape == (3, VOCAB)
    np.testing.assert_allclose(draft.probs.sum(-1), 1.0, rtol=1e-5)
    assert np.all(draft.probs[:, 1::2] == 0) and all(int(x) % 2 == 0 for x in draft.tokens)
    outs, stats, _ = generate(t, m, "eagle", 3, sampling=SamplingConfig(temperature=0.9, random_seed=1))
    assert all(len(o) == 20 for o in outs) and stats.drafted > 0


@pytest.mark.parametrize(
    "case, match",
    [
        ("outside", "sends draft id 0 to target id -1"),
        ("past_end", "outside the vocabulary"),
        ("twice", "sends two draft ids to target id 5"),
        ("t2d", "t2d does not mark the target ids d2t maps to"),
        ("rows", "lm_head.weight has shape"),
        ("no_d2t", "missing tensor"),
        ("float_d2t", "d2t is stored as floating point"),
        ("float_t2d", "t2d must be a bool"),
    ],
)
def test_a_bad_draft_vocabulary_is_refused_at_build(base, tmp_path, case, match):
    src, targets = base["dir"] / "eagle", np.arange(10, 42)  # 32 draft ids
    if case == "twice":
        targets[4] = 5
        targets[3] = 5
    d2t = targets - np.arange(32)
    if case == "outside":
        d2t[0] = -11  # draft id 0 -> target id -1
    elif case == "past_end":
        d2t[31] = VOCAB
    module = draft_vocab_module(src, tmp_path / "module", targets, t2d=case not in ("outside", "past_end"), d2t=d2t)
    if case == "t2d":
        tensors = load_file(module / "model.safetensors")
        tensors["t2d"][0] = True
        save_file(tensors, str(module / "model.safetensors"))
    elif case == "rows":
        tensors = load_file(module / "model.safetensors")
        tensors["lm_head.weight"] = tensors["lm_head.weight"][:31].contiguous()
        save_file(tensors, str(module / "model.safetensors"))
    elif case == "no_d2t":
        tensors = load_file(module / "model.safetensors")
        del tensors["d2t"], tensors["t2d"]
        save_file(tensors, str(module / "model.safetensors"))
    elif case in ("float_d2t", "float_t2d"):
        tensors = load_file(module / "model.safetensors")
        name = case.split("_")[1]
        tensors[name] = tensors[name].float()
        save_file(tensors, str(module / "model.safetensors"))
    with pytest.raises(SpecdecError, match=match) as info:
        build_engine(base["ckpt"], tmp_path / "out", spec_build(4, speculative_decoding_mode="eagle"), say=lambda _: None, eagle_dir=module)
    assert "\n" not in str(info.value)
    assert not (tmp_path / "out").exists()


def test_a_draft_vocabulary_in_other_integer_widths_builds(base, tmp_path):
    """d2t exported as uint8 or int32 and t2d as a 0/1 uint8 mask read as int64 and bool: the same module as int64 and bool."""
    src, targets = base["dir"] / "eagle", np.arange(10, 42)
    module = draft_vocab_module(src, tmp_path / "module", targets)
    tensors = load_file(module / "model.safetensors")
    tensors["d2t"], tensors["t2d"] = tensors["d2t"].to(torch.uint8), tensors["t2d"].to(torch.uint8)
    save_file(tensors, str(module / "model.safetensors"))
    from specdec.formats.heads import load_heads

    heads = load_heads(module)
    assert heads.draft_targets().tolist() == targets.tolist() and heads.tensors["t2d"].dtype == bool
    build_engine(base["ckpt"], tmp_path / "out", spec_build(4, speculative_decoding_mode="eagle"), say=lambda _: None, eagle_dir=module)


@pytest.mark.usefixtures("torch_one_thread")
@pytest.mark.parametrize("mode", ["eagle", "peagle"])
def test_the_torch_backend_spreads_a_draft_vocabulary_alike(base, mode):
    """The torch engine of a smaller draft vocabulary (its module's draft_to_target map) drafts what the onnxruntime
    engine of the full module drafts, while every such token is in it."""
    src = base["dir"] / mode
    t, m = executors(base, mode, src, f"{mode}-full")
    want, stats, drafts = generate(t, m, mode, 4)
    rest = [i for i in range(VOCAB) if i not in set(drafts)]
    module = draft_vocab_module(src, base["dir"] / f"{mode}-torch-module", np.array(sorted(set(drafts)) + rest[::3]))
    out = base["dir"] / f"{mode}-torch"
    build_engine(base["ckpt"], out, spec_build(8, speculative_decoding_mode=mode, backend="torch", dtype="float32"), say=lambda _: None,
                 **{f"{mode}_dir": module})
    target = open_cpu_executor(out, "torch")
    layouts = [e.config.extra["torch"]["layout_version"] for e in (target.engine, load_engine_dir(eagle_module_dir(target.engine)))]
    assert layouts == [1, 2]  # the module's draft_to_target: a specdec reading layout 1 only refuses it
    got, stats2, drafts2 = generate(target, open_cpu_executor(eagle_module_dir(target.engine), "torch"), mode, 4)
    assert got == want and drafts2 == drafts and stats2.accepted == stats.accepted


@pytest.mark.parametrize("kernels", ["ort", "specdec"])
def test_a_quantized_lm_head_over_a_draft_vocabulary(base, tmp_path, kernels):
    """--quantize_draft_heads --quantize_lm_head: the draft rows are rounded as the full module's same rows are (per row),
    so 40 of them (not a multiple of a kernel's 16-column tile) give the full quantized module's logits there, -inf elsewhere."""
    src, targets = base["dir"] / "eagle", np.random.default_rng(5).permutation(VOCAB)[:40]
    module = draft_vocab_module(src, tmp_path / "module", targets)
    build = spec_build(4, speculative_decoding_mode="eagle", quantization="int4_wo", group_size=32, quantize_draft_heads=True,
                       quantize_lm_head=True, cpu_kernels=kernels)
    logits = {}
    for name, head in (("full", src), ("draft", module)):
        build_engine(base["ckpt"], tmp_path / name, build, say=lambda _: None, eagle_dir=head)
        mod = OrtExecutor(load_engine_dir(tmp_path / name / "eagle"), num_threads=1)
        assert "lm_head" in mod.engine.config.build.weight_only["layers"]
        rng = np.random.default_rng(6)
        logits[name] = module_logits(mod, rng.integers(4, VOCAB, (1, 5)), rng.standard_normal((1, 5, 64)).astype(np.float32))
    np.testing.assert_allclose(logits["draft"][..., targets], logits["full"][..., targets], rtol=1e-5, atol=1e-5)
    assert np.all(logits["draft"][..., np.setdiff1d(np.arange(VOCAB), targets)] == -np.inf)
