"""benchmarks/enlarge.py: a zero-padded enlargement computes the same function, reads all its bytes.

Tolerances: the enlarged model computes the same float32 sums plus exact zeros,
but over wider rows (RMSNorm averages over H, MatMuls block differently), so the
results differ by float32 rounding only: a few ulps of values of order 1-10 per
operation, about 1e-6 on these logits. 2e-5 leaves room for that and is far
below any real difference (a wrong eps or norm scale moves these logits by 0.1 and more).
"""

import importlib.util
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from checkpoints import is_linear, load_hf, make_checkpoint
from conftest import build_and_load, spec_build
from safetensors.numpy import load_file, save_file

from specdec.builder.weight_only import quantize_rtn

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("enlarge", ROOT / "benchmarks" / "enlarge.py")
enlarge = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(enlarge)

ATOL = 2e-5
# hidden 64 -> 128, heads 4/2 -> 8/4 (group 2 kept), FFN 128 -> 256, 2 + 2 layers
SIZES = dict(hidden_size=128, intermediate_size=256, num_heads=8, num_kv_heads=4, extra_layers=2)


@pytest.fixture(scope="module")
def pair(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("enlarge")
    # a large eps makes trap 1 (RMSNorm over the padded width) visible: unscaled, it moves logits by ~0.1
    small = make_checkpoint(root / "small", "LlamaForCausalLM", tie_word_embeddings=True, rms_norm_eps=1e-3)
    enlarge.enlarge_checkpoint(small, root / "big", **SIZES, progress=False)
    return small, root / "big"


def hf_logits(path: Path, ids: torch.Tensor) -> np.ndarray:
    with torch.no_grad():
        return load_hf(path)(ids).logits.numpy()


def greedy(ex, prompt: list[int], n: int) -> tuple[list[int], np.ndarray]:
    """Greedy tokens and their logits, one target step per token (forward's positional form)."""
    cache = ex.new_cache(1)
    logits = ex.forward(cache, [prompt], False).logits[0, -1].copy()
    tokens, rows = [], []
    for _ in range(n):
        rows.append(logits)
        tokens.append(int(logits.argmax()))
        logits = ex.forward(cache, [[tokens[-1]]], True).logits[0, -1].copy()
    return tokens, np.stack(rows)


def test_enlarged_llama_has_the_same_logits_in_transformers(pair):
    small, big = pair
    ids = torch.randint(0, 96, (2, 24), generator=torch.Generator().manual_seed(0))
    a, b = hf_logits(small, ids), hf_logits(big, ids)
    assert np.abs(a).max() > 1.0  # not trivially small logits
    np.testing.assert_allclose(b, a, rtol=0, atol=ATOL)


def test_engine_of_the_enlarged_checkpoint_decodes_the_same_tokens(pair, tmp_path):
    small, big = pair
    build = spec_build(max_batch_size=1)
    ex_small, ex_big = build_and_load(small, tmp_path / "small", build), build_and_load(big, tmp_path / "big", build)
    assert ex_big.model.num_layers == 4 and ex_big.model.hidden_size == 128
    prompt = [5, 17, 3, 88, 41, 9, 60, 23]
    want, want_logits = greedy(ex_small, prompt, 16)
    got, got_logits = greedy(ex_big, prompt, 16)
    assert got == want
    np.testing.assert_allclose(got_logits, want_logits, rtol=0, atol=ATOL)


def test_config_norms_and_padding(pair):
    small, big = pair
    cfg = json.loads((big / "config.json").read_text())
    src = json.loads((small / "config.json").read_text())
    assert (cfg["hidden_size"], cfg["intermediate_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]) == (128, 256, 8, 4)
    assert cfg["num_hidden_layers"] == 4 and cfg["head_dim"] == 16 and cfg["tie_word_embeddings"]
    assert cfg["rms_norm_eps"] == pytest.approx(src["rms_norm_eps"] * 64 / 128)
    assert (big / "tokenizer_config.json").is_file() == (small / "tokenizer_config.json").is_file()
    s, t = load_file(small / "model.safetensors"), load_file(big / "model.safetensors")
    assert "lm_head.weight" not in t  # tied embeddings stay tied
    # real weights in the leading corner, zeros elsewhere
    q = t["model.layers.1.self_attn.q_proj.weight"]
    np.testing.assert_array_equal(q[:64, :64], s["model.layers.1.self_attn.q_proj.weight"])
    assert not q[64:].any() and not q[:, 64:].any()
    o = t["model.layers.0.self_attn.o_proj.weight"]
    assert not o[64:].any() and not o[:, 64:].any()  # extra heads' columns and the padded rows
    down = t["model.layers.0.mlp.down_proj.weight"]
    assert not down[64:].any() and not down[:, 128:].any()
    assert not t["model.embed_tokens.weight"][:, 64:].any()
    # RMSNorm weights scaled by sqrt(h / H)
    for name in ("model.norm.weight", "model.layers.0.input_layernorm.weight", "model.layers.1.post_attention_layernorm.weight"):
        np.testing.assert_allclose(t[name][:64], s[name] * np.sqrt(0.5), rtol=1e-7)
        assert not t[name][64:].any()


def hidden_states(path: Path, ids: torch.Tensor) -> list[np.ndarray]:
    with torch.no_grad():
        return [h.numpy() for h in load_hf(path)(ids, output_hidden_states=True).hidden_states]


def rtn_bytes(w: np.ndarray) -> bytes:
    """An [out, in] weight's bytes after int4 round-to-nearest (group 32): what a MatMulNBits initializer holds."""
    q = quantize_rtn(w.T, 4, 32)
    return q.codes.tobytes() + q.scale.tobytes() + q.zero.tobytes()


def test_extra_layers_are_dead_but_distinct(pair):
    _, big = pair
    t = load_file(big / "model.safetensors")
    extra = {n: a for n, a in t.items() if n.startswith(("model.layers.2.", "model.layers.3."))}
    assert len(extra) == 2 * 9  # 7 linears + 2 norms per layer
    for i in (2, 3):
        w = {k.split(".", 3)[3]: a for k, a in extra.items() if k.startswith(f"model.layers.{i}.")}
        for key in ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "mlp.down_proj.weight"):
            assert np.all(w[key] != 0), key
        for key in ("input_layernorm.weight", "post_attention_layernorm.weight"):
            assert 0.3 < np.abs(w[key]).mean() < 1.0, key  # near sqrt(64/128), like the real norms
        # value dims: a random v row <-> zero o_proj columns for the q heads reading it (group 2, head_dim 16)
        live_v = np.any(w["self_attn.v_proj.weight"] != 0, axis=1)
        assert 0 < live_v.sum() < live_v.size
        live_q = np.repeat(live_v.reshape(4, 1, 16), 2, axis=1).reshape(-1)
        o = w["self_attn.o_proj.weight"]
        assert not o[:, live_q].any() and np.all(o[:, ~live_q] != 0)
        # FFN channels: a random gate row xor a random up row
        gate, up = (np.any(w[f"mlp.{k}_proj.weight"] != 0, axis=1) for k in ("gate", "up"))
        assert np.all(gate ^ up) and 0 < gate.sum() < gate.size
    digests = {a.tobytes() for a in t.values()}
    assert len(digests) == len(t)  # distinct in float


def test_extra_layers_add_exact_zeros(pair):
    _, big = pair
    ids = torch.randint(0, 96, (1, 24), generator=torch.Generator().manual_seed(2))
    hs = hidden_states(big, ids)  # embeddings, after layers 0, 1, 2, then 3 with the final norm applied
    assert np.abs(hs[2]).max() > 0.1
    np.testing.assert_array_equal(hs[3], hs[2])  # layer 2 is dead: bit for bit, not within a tolerance


def test_dead_layers_stay_dead_and_distinct_after_int4(pair, tmp_path):
    small, big = pair
    t = load_file(big / "model.safetensors")
    linears = {n: a for n, a in t.items() if is_linear(n)}
    assert len({rtn_bytes(a) for a in linears.values()}) == len(linears)  # no two share a prepacked copy
    # the checkpoint with every linear replaced by its int4 dequantization: extra layers still add exact zeros
    dq = dict(t)
    dq.update({n: np.ascontiguousarray(quantize_rtn(a.T, 4, 32).dequantized().T) for n, a in linears.items()})
    shutil.copytree(big, tmp_path / "int4")
    save_file(dq, tmp_path / "int4" / "model.safetensors", metadata={"format": "pt"})
    ids = torch.randint(0, 96, (1, 24), generator=torch.Generator().manual_seed(3))
    hs = hidden_states(tmp_path / "int4", ids)
    assert np.abs(hs[3] - hidden_states(big, ids)[3]).max() > 1e-4  # the quantization did change the real layers
    np.testing.assert_array_equal(hs[3], hs[2])


def test_threads_give_the_same_bytes(tmp_path):
    """The new layers are drawn in threads, each tensor from a generator seeded by its name: one thread and four write
    the same checkpoint, byte for byte."""
    small = make_checkpoint(tmp_path / "small", num_hidden_layers=1)
    files = []
    for workers in (1, 4):
        enlarge.enlarge_checkpoint(small, tmp_path / f"w{workers}", 128, 256, 8, 4, 3, progress=False, workers=workers)
        files.append((tmp_path / f"w{workers}" / "model.safetensors").read_bytes())
    assert files[0] == files[1] and len(files[0]) > 0


def test_parameter_count(pair):
    small, big = pair
    # per layer: q + k + v + o + gate/up/down + 2 norms; tied embedding once; final norm
    h, i, nh, kvh, hd, layers, vocab = 128, 256, 8, 4, 16, 4, 96
    per_layer = h * nh * hd + 2 * h * kvh * hd + nh * hd * h + 3 * h * i + 2 * h
    expected = layers * per_layer + vocab * h + h
    t = load_file(big / "model.safetensors")
    assert sum(a.size for a in t.values()) == expected
    assert enlarge.count_parameters(json.loads((big / "config.json").read_text())) == expected
    report = json.loads((big / "enlargement.json").read_text())
    assert report["num_parameters"] == expected
    assert report["source_parameters"] == sum(a.size for a in load_file(small / "model.safetensors").values())


def test_presets_give_the_documented_sizes():
    target = json.loads((ROOT / "examples/demo-pair/target/config.json").read_text())
    draft = json.loads((ROOT / "examples/demo-pair/draft/config.json").read_text())

    def enlarged(cfg: dict, preset: str) -> dict:
        sizes = enlarge.PRESETS[preset]
        return enlarge._enlarged_config(cfg, sizes, None, enlarge._check_sizes(cfg, sizes))

    big_t, big_d = enlarged(target, "target325m"), enlarged(draft, "draft")
    assert 320e6 < enlarge.count_parameters(big_t) < 330e6
    assert 0.05 < enlarge.count_parameters(big_d) / enlarge.count_parameters(big_t) < 0.10
    # x4 width: the norm scale sqrt(1/4) = 0.5 is exact in every float format
    assert big_t["hidden_size"] == 4 * target["hidden_size"] and big_d["hidden_size"] == 4 * draft["hidden_size"]
    # Llama-3.1-8B / -3.2-1B shapes (their config.json fields), from the demo target / draft
    shape = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim", "intermediate_size")
    t8, d1 = enlarged(target, "llama8b"), enlarged(draft, "llama1b")
    assert tuple(t8[k] for k in shape) == (4096, 32, 32, 8, 128, 14336)
    assert tuple(d1[k] for k in shape) == (2048, 16, 32, 8, 64, 8192)
    vocab = target["vocab_size"]
    layers_8b = enlarge.count_parameters(t8) - vocab * 4096 - 4096  # tied embedding, final norm
    assert layers_8b == 32 * (2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336 + 2 * 4096)  # 6.98B, as Llama-3.1-8B's layers
    # rotary stays the same function: theta' = theta ** (D / d) (head_dim 32 -> 128, 32 -> 64)
    assert t8["rope_parameters"]["rope_theta"] == pytest.approx(target["rope_parameters"]["rope_theta"] ** 4)
    assert d1["rope_parameters"]["rope_theta"] == pytest.approx(draft["rope_parameters"]["rope_theta"] ** 2)
    assert target["rope_parameters"]["rope_theta"] == 10000.0  # the source configs are not touched


def test_qwen3_gqa_with_qk_norm_and_bias_is_preserved(tmp_path):
    # Qwen3: RMSNorm per head (head_dim kept) and the same eps as the hidden norms; x4 hidden
    small = make_checkpoint(tmp_path / "small", "Qwen3ForCausalLM", head_dim=16, attention_bias=True)
    enlarge.enlarge_checkpoint(small, tmp_path / "big", 256, 384, 12, 6, 1, progress=False)
    ids = torch.randint(0, 96, (1, 20), generator=torch.Generator().manual_seed(1))
    np.testing.assert_allclose(hf_logits(tmp_path / "big", ids), hf_logits(small, ids), rtol=0, atol=ATOL)


@pytest.fixture(scope="module")
def wide_heads(pair, tmp_path_factory) -> Path:
    """The small Llama (4/2 heads x 16) as 8/2 heads x 64: head_dim x4, group 2 -> 4, as the llama8b preset does."""
    small, _ = pair
    out = tmp_path_factory.mktemp("wide") / "big"
    enlarge.enlarge_checkpoint(small, out, 128, 256, 8, 2, 1, head_dim=64, progress=False)
    return out


def test_wider_heads_and_a_larger_group_keep_the_function(pair, wide_heads, tmp_path):
    small, big = pair[0], wide_heads
    cfg = json.loads((big / "config.json").read_text())
    assert (cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]) == (8, 2, 64)
    assert cfg["rope_parameters"]["rope_theta"] == pytest.approx(1e16)  # 1e4 ** (64 / 16)
    t, s = load_file(big / "model.safetensors"), load_file(small / "model.safetensors")
    # real query head 1 (reads kv head 0) sits at head 1; real head 2 (kv head 1) at head 4: 2 // 2 * 4 + 0
    q, q_small = t["model.layers.0.self_attn.q_proj.weight"], s["model.layers.0.self_attn.q_proj.weight"]
    np.testing.assert_array_equal(q[4 * 64 : 4 * 64 + 8, :64], 2 * q_small[2 * 16 : 2 * 16 + 8])  # first half of head 2's dims, x sqrt(64/16)
    np.testing.assert_array_equal(q[4 * 64 + 32 : 4 * 64 + 40, :64], 2 * q_small[2 * 16 + 8 : 3 * 16])  # its second half at D/2
    assert not q[2 * 64 : 4 * 64].any()  # heads 2 and 3 are padding
    ids = torch.randint(0, 96, (2, 200), generator=torch.Generator().manual_seed(6))  # long: rotary at many positions
    np.testing.assert_allclose(hf_logits(big, ids), hf_logits(small, ids), rtol=0, atol=ATOL)
    build = spec_build(max_batch_size=1, max_input_len=120, max_seq_len=240)
    ex_small, ex_big = build_and_load(small, tmp_path / "small", build), build_and_load(big, tmp_path / "big", build)
    prompt = [int(x) for x in ids[0, :100]]
    want, want_logits = greedy(ex_small, prompt, 24)
    got, got_logits = greedy(ex_big, prompt, 24)
    assert got == want
    np.testing.assert_allclose(got_logits, want_logits, rtol=0, atol=ATOL)


def test_head_dim_cannot_grow_under_qk_norm(tmp_path):
    small = make_checkpoint(tmp_path / "small", "Qwen3ForCausalLM", head_dim=16)
    with pytest.raises(enlarge.EnlargeError, match="Qwen3's q_norm/k_norm average over head_dim"):
        enlarge.enlarge_checkpoint(small, tmp_path / "big", 128, 256, 8, 4, 0, head_dim=32, progress=False)
    assert not (tmp_path / "big").exists()


def test_bfloat16_stays_bfloat16_unless_asked(tmp_path):
    small = make_checkpoint(tmp_path / "small", dtype=torch.bfloat16, num_hidden_layers=1)
    enlarge.enlarge_checkpoint(small, tmp_path / "bf16", 128, 256, 8, 4, 1, progress=False)
    enlarge.enlarge_checkpoint(small, tmp_path / "f32", 128, 256, 8, 4, 1, dtype="float32", progress=False)

    def dtypes(path: Path) -> set[str]:
        raw = (path / "model.safetensors").read_bytes()
        header = json.loads(raw[8 : 8 + int.from_bytes(raw[:8], "little")])
        return {e["dtype"] for k, e in header.items() if k != "__metadata__"}

    assert dtypes(tmp_path / "bf16") == {"BF16"} and dtypes(tmp_path / "f32") == {"F32"}
    assert json.loads((tmp_path / "f32" / "config.json").read_text())["dtype"] == "float32"


def run_cli(capsys, *argv: str) -> tuple[int, str]:
    code = enlarge.main([*argv, "--quiet"])
    return code, capsys.readouterr().err


def test_cli_errors_are_one_line(pair, tmp_path, capsys):
    small, big = pair
    sizes = ["--hidden_size", "128", "--intermediate_size", "256", "--num_heads", "8", "--num_kv_heads", "4", "--extra_layers", "0"]

    code, err = run_cli(capsys, str(small), str(big), *sizes)
    assert code == 1 and "not empty; pass --force" in err and err.count("\n") == 1

    code, err = run_cli(capsys, str(small), str(tmp_path / "out"), *sizes[:6], "--num_kv_heads", "8", "--extra_layers", "0")
    assert code == 1 and "at least the source's group of 2" in err and err.count("\n") == 1

    code, err = run_cli(capsys, str(small), str(tmp_path / "out"), *sizes, "--head_dim", "8")
    assert code == 1 and "head_dim=8 is smaller than the source's head_dim=16" in err and err.count("\n") == 1

    code, err = run_cli(capsys, str(small), str(tmp_path / "out"), "--preset", "target325m", "--hidden_size", "32")
    assert code == 1 and "smaller than the source's hidden_size=64" in err

    code, err = run_cli(capsys, str(small), str(tmp_path / "out"), "--hidden_size", "128")
    assert code == 1 and "--intermediate_size" in err and "--preset" in err

    code, err = run_cli(capsys, str(tmp_path / "nowhere"), str(tmp_path / "out"), *sizes)
    assert code == 1 and "does not exist" in err

    other = tmp_path / "gpt2"
    other.mkdir()
    (other / "config.json").write_text(json.dumps({"architectures": ["GPT2LMHeadModel"]}))
    (other / "model.safetensors").write_bytes((small / "model.safetensors").read_bytes())
    code, err = run_cli(capsys, str(other), str(tmp_path / "out"), *sizes)
    assert code == 1 and "GPT2LMHeadModel" in err and "not supported" in err
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out.tmp-*"))  # nothing half-written


def test_cli_force_replaces_and_writes_atomically(pair, tmp_path, capsys):
    small, _ = pair
    out = tmp_path / "out"
    out.mkdir()
    (out / "stale.txt").write_text("old")
    code, err = run_cli(capsys, str(small), str(out), "--hidden_size", "64", "--intermediate_size", "128", "--num_heads", "4",
                        "--num_kv_heads", "2", "--extra_layers", "1", "--force")
    assert code == 0, err
    assert not (out / "stale.txt").exists() and (out / "model.safetensors").is_file()
    assert [p.name for p in tmp_path.iterdir()] == ["out"]  # no temp or backup dirs left


# --------------------------------------------------------------------------- heads: Medusa and EAGLE-3 on the enlarged base


def write_medusa_heads(base: Path, out: Path, num_heads: int = 3, num_layers: int = 2, seed: int = 1):
    """Random Medusa heads (ResBlocks not the identity, nonzero biases) for ``base``, in ModelOpt's layout."""
    from specdec.train.export import medusa_config, save_heads
    from specdec.train.medusa import MedusaHeads

    cfg = json.loads((base / "config.json").read_text())
    torch.manual_seed(seed)
    heads = MedusaHeads(cfg["hidden_size"], cfg["vocab_size"], num_heads, num_layers).eval()
    with torch.no_grad():
        for p in heads.parameters():
            p.copy_(torch.randn_like(p) * (0.3 if p.dim() == 1 else 2.0 / p.shape[1] ** 0.5))
    save_heads(heads, medusa_config(cfg, num_heads, num_layers, {"test": True}), out)
    return heads


def torch_tensors(heads_dir: Path) -> dict[str, torch.Tensor]:
    from specdec.formats.heads import load_heads

    return {k: torch.from_numpy(v) for k, v in load_heads(heads_dir).tensors.items()}


@pytest.fixture(scope="module")
def heads_pair(pair, tmp_path_factory):
    from checkpoints import write_eagle_module, write_peagle_module

    small, big = pair
    root = tmp_path_factory.mktemp("heads")
    medusa = write_medusa_heads(small, root / "medusa")
    eagle = write_eagle_module(small, root / "eagle", num_layers=2)  # aux ids [0, 1]: both real layers
    peagle = write_peagle_module(small, root / "peagle", num_layers=1, aux_ids=[0, 1])
    for name in ("medusa", "eagle", "peagle"):
        (root / name / "README.md").write_text(f"# {name} heads\n")
        assert enlarge.main(["--heads", str(root / name), "--base", str(big), str(root / f"big-{name}")]) == 0
    return {"small": small, "big": big, "root": root, "medusa": medusa, "eagle": eagle, "peagle": peagle}


def test_enlarged_medusa_heads_give_the_same_logits(heads_pair):
    from specdec.formats.heads import load_heads
    from specdec.train.base import load_base, run_base
    from specdec.train.medusa import MedusaHeads

    h = heads_pair
    loaded = load_heads(h["root"] / "big-medusa")
    assert (loaded.hidden_size, loaded.num_heads, loaded.num_layers) == (128, 3, 2)
    cfg = loaded.config
    base_cfg = json.loads((h["big"] / "config.json").read_text())
    assert all(cfg[k] == base_cfg[k] for k in ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "rms_norm_eps",
                                               "num_hidden_layers"))
    assert cfg["medusa"] == {"num_medusa_heads": 3, "num_medusa_layers": 2}
    big_heads = MedusaHeads(128, 96, 3, 2).eval()
    big_heads.load_state_dict(torch_tensors(h["root"] / "big-medusa"), strict=True)

    ids = torch.randint(0, 96, (2, 20), generator=torch.Generator().manual_seed(4))
    mask = torch.ones_like(ids)
    with torch.no_grad():
        want = h["medusa"](run_base(load_base(h["small"]), ids, mask).last_hidden).numpy()
        got = big_heads(run_base(load_base(h["big"]), ids, mask).last_hidden).numpy()
    assert np.abs(want).max() > 1.0
    np.testing.assert_allclose(got, want, rtol=0, atol=ATOL)
    assert "Enlarged" in (h["root"] / "big-medusa" / "README.md").read_text()


def test_enlarged_eagle_module_gives_the_same_logits(heads_pair):
    from specdec.formats.heads import load_heads
    from specdec.train.base import load_base, run_base
    from specdec.train.eagle import Eagle3Module, eagle_inputs, eagle_llama_config

    h = heads_pair
    loaded = load_heads(h["root"] / "big-eagle", base_num_layers=4)
    small_cfg = json.loads((h["root"] / "eagle" / "config.json").read_text())
    assert loaded.aux_layer_ids == [0, 1] and loaded.num_layers == 2  # same real layers, no dead ones added
    cfg = loaded.config
    assert (cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["intermediate_size"], cfg["head_dim"]) == (128, 8, 4, 256,
                                                                                                                                       16)
    assert cfg["rms_norm_eps"] == pytest.approx(small_cfg["rms_norm_eps"] * 64 / 128)
    assert cfg["rms_norm_eps"] == pytest.approx(json.loads((h["big"] / "config.json").read_text())["rms_norm_eps"])
    t = loaded.tensors
    # layer 0's q: the embedding half at columns 0..63, the hidden half at 128..191; fc: aux block a at a*128
    q_small = h["eagle"].layers[0].self_attn.q_proj.weight.detach().numpy()
    np.testing.assert_array_equal(t["layers.0.self_attn.q_proj.weight"][:64, 128:192], q_small[:, 64:])
    fc_small = h["eagle"].fc.weight.detach().numpy()
    np.testing.assert_array_equal(t["fc.weight"][:64, 128:192], fc_small[:, 64:])

    big_base = load_base(h["big"])
    module = Eagle3Module(eagle_llama_config(big_base.config, 2), 2, torch.from_numpy(t["lm_head.weight"])).eval()
    assert module.config.rms_norm_eps == pytest.approx(cfg["rms_norm_eps"])
    module.load_state_dict(torch_tensors(h["root"] / "big-eagle"), strict=True)

    ids = torch.randint(0, 96, (2, 20), generator=torch.Generator().manual_seed(5))
    mask = torch.ones_like(ids)

    def logits(base, m) -> np.ndarray:
        with torch.no_grad():
            aux = run_base(base, ids, mask, [0, 1]).aux_hidden
            return m(*eagle_inputs(ids, aux, base.model.embed_tokens)).numpy()

    want = logits(load_base(h["small"]), h["eagle"])
    assert np.abs(want).max() > 1.0
    np.testing.assert_allclose(logits(big_base, module), want, rtol=0, atol=ATOL)


def test_enlarged_peagle_module_gives_the_same_block(heads_pair):
    """Real rows and placeholder rows alike: the enlarged P-EAGLE module on the enlarged base gives the small one's logits."""
    from specdec.formats.heads import load_heads
    from specdec.train.base import load_base, run_base
    from specdec.train.eagle import eagle_inputs, eagle_llama_config
    from specdec.train.peagle import PEagleModule, parallel_layout

    h = heads_pair
    loaded = load_heads(h["root"] / "big-peagle", base_num_layers=4)
    assert loaded.mode == "peagle" and loaded.tensors["mask_hidden"].shape == (5, 2 * 128) and loaded.mask_token_id == 3
    big_base = load_base(h["big"])
    t = loaded.tensors
    module = PEagleModule(eagle_llama_config(big_base.config, 1), 2, torch.from_numpy(t["lm_head.weight"]), big_base.get_input_embeddings().weight[3],
                          anchored=True, placeholders=5).eval()
    module.load_state_dict(torch_tensors(h["root"] / "big-peagle") | {"mask_hidden": torch.from_numpy(t["mask_hidden"])[None]}, strict=True)
    ids = torch.randint(0, 96, (2, 12), generator=torch.Generator().manual_seed(6))
    mask = torch.ones_like(ids)
    layout = parallel_layout(mask[:, :-1].bool(), mask.bool(), 4, 0.7, 0.2, None)

    def block(base, m) -> np.ndarray:
        with torch.no_grad():
            aux = run_base(base, ids, mask, [0, 1]).aux_hidden
            return m.lm_head(m.parallel_hidden(*eagle_inputs(ids, aux, base.model.embed_tokens), layout)).numpy()

    want = block(load_base(h["small"]), h["peagle"])
    assert np.abs(want).max() > 1.0 and layout.used.sum() > 10
    np.testing.assert_allclose(block(big_base, module), want, rtol=0, atol=ATOL)


def test_heads_cli_errors_are_one_line(heads_pair, tmp_path, capsys):
    h = heads_pair
    code, err = run_cli(capsys, "--heads", str(h["root"] / "medusa"), "--base", str(h["small"]), str(tmp_path / "out"))
    assert code == 0, err  # the same width: a plain copy is allowed, the same tensors
    from specdec.formats.heads import load_heads

    src, copy = load_heads(h["root"] / "medusa"), load_heads(tmp_path / "out")
    assert src.tensors.keys() == copy.tensors.keys() and all(np.array_equal(src.tensors[k], copy.tensors[k]) for k in src.tensors)
    code, err = run_cli(capsys, "--heads", str(h["root"] / "big-medusa"), "--base", str(h["small"]), str(tmp_path / "out2"))
    assert code == 1 and "exceeds the base's 64" in err and err.count("\n") == 1
    code, err = run_cli(capsys, "--heads", str(h["root"] / "eagle"), "--base", str(h["big"]), str(h["root"] / "big-eagle"))
    assert code == 1 and "pass --force" in err
    with pytest.raises(SystemExit):
        enlarge.main(["--heads", str(h["root"] / "eagle"), str(tmp_path / "out3")])  # no --base


def test_eagle_module_on_wider_heads_gives_the_same_logits(heads_pair, wide_heads, tmp_path):
    from specdec.formats.heads import load_heads
    from specdec.train.base import load_base, run_base
    from specdec.train.eagle import Eagle3Module, eagle_inputs, eagle_llama_config

    h = heads_pair
    assert enlarge.main(["--heads", str(h["root"] / "eagle"), "--base", str(wide_heads), str(tmp_path / "wide-eagle"), "--quiet"]) == 0
    loaded = load_heads(tmp_path / "wide-eagle", base_num_layers=3)
    cfg = loaded.config
    assert (cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]) == (8, 2, 64)
    big_base = load_base(wide_heads)
    module = Eagle3Module(eagle_llama_config(big_base.config, 2), 2, torch.from_numpy(loaded.tensors["lm_head.weight"])).eval()
    module.load_state_dict(torch_tensors(tmp_path / "wide-eagle"), strict=True)
    ids = torch.randint(0, 96, (2, 60), generator=torch.Generator().manual_seed(7))
    mask = torch.ones_like(ids)

    def logits(base, m) -> np.ndarray:
        with torch.no_grad():
            return m(*eagle_inputs(ids, run_base(base, ids, mask, [0, 1]).aux_hidden, base.model.embed_tokens)).numpy()

    want = logits(load_base(h["small"]), h["eagle"])
    np.testing.assert_allclose(logits(big_base, module), want, rtol=0, atol=ATOL)
