"""A draft with another tokenizer (runtime/proposers/cross_tokenizer.py): exact greedy output, drafts that
survive when the draft agrees with the target, and characters split across tokens."""

import json

import numpy as np
import pytest
import torch
import transformers
from checkpoints import make_checkpoint
from conftest import build_and_load, spec_build
from test_suffix_engine import run

from specdec.formats.tokenizer import Tokenizer
from specdec.runtime.engine import Engine, SpeculationConfig
from specdec.runtime.proposers.cross_tokenizer import CrossTokenizerProposer
from specdec.runtime.proposers.draft_model import DraftModelProposer
from specdec.runtime.request import GenerationConfig
from specdec.runtime.sampling import SamplingConfig
from specdec.runtime.token_bytes import TokenBytes, _byte_level_alphabet, complete_prefix

MAX_DRAFT = 4
TEXTS = ["hé 日本 😀 ab", "def f(x):\n    return x", "😀😀", "naïve"]
EXTRA = ["<|x|>", "<|y|>"]
SPELLED = [c for c, _ in sorted(_byte_level_alphabet().items(), key=lambda cb: cb[1])]  # byte b's printable spelling


def _byte_level(specials: list[str], order: list[int]):
    """A byte-level BPE tokenizer: the special tokens first, then the 256 bytes in ``order`` (a permutation)."""
    from tokenizers import Tokenizer as HF, decoders, models, pre_tokenizers

    spelled = SPELLED
    vocab = {s: i for i, s in enumerate(specials)}
    for b in order:
        vocab[spelled[b]] = len(vocab)
    tok = HF(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(specials)
    return tok, vocab


def _save(tok, d, bos):
    tok.save(str(d / "tokenizer.json"))
    (d / "tokenizer_config.json").write_text(json.dumps({"bos_token": bos, "eos_token": bos}))


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """A target with a 258-token byte tokenizer and two drafts with another (260 tokens, ids permuted, the
    special tokens first): 'mirror' is the target's weights under that permutation (its drafts are the
    target's own choices), 'other' a random model."""
    d = tmp_path_factory.mktemp("xtok")
    rng = np.random.default_rng(0)
    target_dir = make_checkpoint(d / "target", num_hidden_layers=2, vocab_size=258, seed=0, bos_token_id=256, eos_token_id=256, pad_token_id=257)
    t_tok, _ = _byte_level_after(list(range(256)), ["<|endoftext|>", "<|pad|>"])
    _save(t_tok, target_dir, "<|endoftext|>")
    perm = rng.permutation(256).tolist()
    d_tok, _ = _byte_level(["<|pad|>", "<|endoftext|>", *EXTRA], perm)
    # draft id of target id t: bytes b -> 4 + position of b in perm; endoftext 256 -> 1, pad 257 -> 0
    where = {b: 4 + i for i, b in enumerate(perm)}
    to_draft = [where[b] for b in range(256)] + [1, 0]
    hf = transformers.AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32)
    with torch.no_grad():  # special tokens stand for no text, so no draft can propose one: the target never picks them
        hf.lm_head.weight[256:] = 0.0  # (a logit of 0 never beats the best of 256 random ones)
    hf.save_pretrained(target_dir, safe_serialization=True)
    cfg = hf.config.to_dict()
    cfg.update(vocab_size=260, bos_token_id=1, eos_token_id=1, pad_token_id=0)
    mirror = transformers.LlamaForCausalLM(transformers.LlamaConfig(**cfg)).eval()
    state = hf.state_dict()
    for name in ("model.embed_tokens.weight", "lm_head.weight"):
        w = torch.zeros(260, state[name].shape[1])
        w[to_draft] = state[name]
        w[2:4] = state[name][257]  # the unused specials: as pad (never picked)
        state[name] = w
    mirror.load_state_dict(state)
    mirror.save_pretrained(d / "mirror", safe_serialization=True)
    _save(d_tok, d / "mirror", "<|endoftext|>")
    # 'other': a BPE with merges (text is cut in other places than on the target's side), a random model
    merged = _trained_bpe(300)
    other = make_checkpoint(d / "other", num_hidden_layers=1, hidden_size=32, intermediate_size=64, vocab_size=merged.get_vocab_size(), seed=3)
    _save(merged, other, "<|endoftext|>")
    return {
        "target": build_and_load(target_dir, d / "te", spec_build(MAX_DRAFT)),
        "mirror": build_and_load(d / "mirror", d / "me", spec_build(0)),
        "other": build_and_load(other, d / "oe", spec_build(0)),
    }


def _trained_bpe(size):
    from tokenizers import Tokenizer as HF, decoders, models, pre_tokenizers, trainers

    tok = HF(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=size, special_tokens=["<|pad|>", "<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(TEXTS * 20 + ["the quick brown fox jumps over the lazy dog " * 5, "日本語のテキスト 😀👍 ünïcödé"], trainer=trainer)
    return tok


def _byte_level_after(order, specials):
    """The target's layout: the 256 bytes first (id = byte), then the special tokens."""
    from tokenizers import Tokenizer as HF, decoders, models, pre_tokenizers

    vocab = {SPELLED[b]: i for i, b in enumerate(order)}
    for s in specials:
        vocab[s] = len(vocab)
    tok = HF(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(specials)
    return tok, vocab


def adapter(target, draft):
    t_tok, d_tok = Tokenizer(target.engine.path), Tokenizer(draft.engine.path)
    return CrossTokenizerProposer(DraftModelProposer(draft), TokenBytes(t_tok), TokenBytes(d_tok), t_tok.eos_token_id, d_tok.eos_token_id)


def prompts(target):
    tok = Tokenizer(target.engine.path)
    return [[tok.eos_token_id] + tok.encode(t) for t in TEXTS]


@pytest.mark.parametrize("draft", ["mirror", "other"])
def test_greedy_cross_tokenizer_is_exact(pair, draft):
    target = pair["target"]
    ps = prompts(target)
    assert any(len(t.encode()) > len(t) for t in TEXTS)  # multi-byte characters, one byte a token on the target side
    cfg = GenerationConfig(max_output_len=24)
    want = run(Engine(target), ps, cfg)
    tb = TokenBytes(Tokenizer(target.engine.path))
    assert any(b >= 0x80 for w in want for b in tb.bytes_of(w))  # the outputs hold non-ASCII bytes too, one a token
    for k in (1, MAX_DRAFT, "auto"):
        engine = Engine(target, [adapter(target, pair[draft])], SpeculationConfig("draft", k))
        assert run(engine, ps[:1], cfg) == want[:1], (draft, k)  # alone
        assert run(engine, ps, cfg) == want, (draft, k)  # a ragged batch
        if draft == "other" and k == MAX_DRAFT:  # step by step: the draft's tokens spell every whole character it was synced to
            proposer = adapter(target, pair[draft])
            engine = Engine(target, [proposer], SpeculationConfig("draft", k))
            for p in ps:
                engine.add_request(p, cfg)
            while engine.has_unfinished():
                engine.step()
                for t in proposer.texts.values():
                    synced = bytes(t.data[: t.synced])
                    assert proposer.draft_bytes.bytes_of(t.ids) == synced[: t.ends[-1]] and t.ends[-1] == complete_prefix(synced)
        if draft == "mirror" and k == MAX_DRAFT:
            assert engine.stats.accepted / engine.stats.drafted > 0.9, (engine.stats.accepted, engine.stats.drafted)


def test_sampled_requests_draft_argmax_and_stay_seeded(pair):
    """Sampled requests are verified by token compare: the same seed gives the same tokens as target-only."""
    target = pair["target"]
    ps = prompts(target)
    cfg = GenerationConfig(max_output_len=16, sampling=SamplingConfig(temperature=0.8, random_seed=5))
    base = run(Engine(target), ps, cfg)
    engine = Engine(target, [adapter(target, pair["mirror"])], SpeculationConfig("draft", 3))
    got = run(engine, ps, cfg)
    assert engine.stats.accepted > 0
    # token compare samples the target's token at each position from its own distribution with the request's
    # RNG, drafts or not: the same draws as target-only
    assert got == base


def test_token_bytes_spell_split_characters():
    tok, _ = _byte_level_after(list(range(256)), ["<|endoftext|>"])
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as d:
        _save(tok, Path(d), "<|endoftext|>")
        tb = TokenBytes(Tokenizer(d))
    data = "日😀".encode()
    assert tb.bytes_of(tb.encode_bytes(data)) == data
    assert tb.encode_bytes(data[1:]) == list(data[1:])  # the rest of a split character: byte tokens
    assert tb.bytes_of(tb.encode_bytes(data[:5])) == data[:3]  # a partial character at the end waits
    assert complete_prefix(data[:5]) == 3 and complete_prefix(data) == 7 and complete_prefix(b"ab\xe6") == 2
    assert tb.bytes_of([256, 65]) == b"A"  # a special token stands for no text


def test_load_engine_chooses_cross_tokenizer_mode_and_says_so(pair):
    from specdec.runtime import DraftTargetConfig, load_engine

    target = pair["target"]
    engine = load_engine(target.engine.path, pair["mirror"].engine.path, DraftTargetConfig(3, [0], [0], False), num_threads=1)
    assert isinstance(engine.proposers["draft"], CrossTokenizerProposer)
    assert engine.pairing.mode == "cross_tokenizer" and "260 tokens" in engine.pairing.note and "258 tokens" in engine.pairing.note
    ps = prompts(target)
    cfg = GenerationConfig(max_output_len=16)
    assert run(engine, ps, cfg) == run(Engine(target), ps, cfg)
    assert engine.stats.accepted > 0


def test_pairing_refuses_only_what_cannot_work(pair, tmp_path):
    import shutil

    from specdec.formats.engine_format import load_engine_dir
    from specdec.formats.errors import EngineError
    from specdec.runtime.pairing import pair as choose

    target, mirror = pair["target"].engine, pair["mirror"].engine
    bare = tmp_path / "bare"  # the target without its tokenizer: 258 ids, where the draft's tokenizer uses 260
    shutil.copytree(target.path, bare)
    cfg = json.loads((bare / "config.json").read_text())
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (bare / name).unlink(missing_ok=True)
        cfg["files"].pop(name, None)
    (bare / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(EngineError) as err:
        choose(load_engine_dir(bare), mirror)
    assert "no tokenizer.json to draft through text" in str(err.value) and "\n" not in str(err.value)
    assert choose(target, target).mode == "shared"  # the same tokenizer: ids as they are
    assert choose(target, mirror, allow_mismatch=True).mode == "shared"  # ids as they are (the engine's check_pair warns)


def test_ids_a_draft_cannot_read_are_refused_even_when_the_mismatch_is_allowed(pair):
    """allow_mismatch takes a draft's ids as the target's; where the target's tokenizer writes ids past the draft's vocabulary, the
    draft could not read them (an out-of-range gather), and keeping the target to the shared ids would change its output: refused."""
    from specdec.formats.errors import EngineError
    from specdec.runtime.pairing import PairWarning, check_pair, pair as choose

    big, small = pair["mirror"].engine, pair["target"].engine  # 260 ids, its tokenizer using them all; 258
    for check in (check_pair, choose):  # pair(), the check made before anything opens (specdec-eval's too), refuses it as well
        with pytest.raises(EngineError, match="cannot read the target's tokens past id 257.*Leave out --allow_vocab_mismatch"):
            check(big, small, allow_mismatch=True)
    with pytest.warns(PairWarning, match="different tokenizers"):  # the other way round the draft reads every target token
        assert check_pair(small, big, allow_mismatch=True) == 258


def test_use_logits_with_a_draft_of_another_tokenizer_is_said_not_dropped(pair):
    from specdec.runtime import DraftTargetConfig, load_engine
    from specdec.runtime.pairing import PairWarning

    with pytest.warns(PairWarning, match="use_logits=True is not used with a draft of another tokenizer"):
        engine = load_engine(pair["target"].engine.path, pair["mirror"].engine.path, DraftTargetConfig(3, [0], [0], True), num_threads=1)
    assert isinstance(engine.proposers["draft"], CrossTokenizerProposer)
