"""load_heads reads NVIDIA ModelOpt's export layout (written here by hand: documented names, random weights) and
refuses checkpoints whose tensors disagree with their config, with one clear message each."""

import json

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from specdec.formats.errors import CheckpointError
from specdec.formats.heads import default_eagle_aux_layer_ids, eagle_tensor_names, load_heads, medusa_tensor_names

H, V, INTER, HEADS, KV, HEAD_DIM = 32, 50, 64, 4, 2, 8


def write(d, config: dict, tensors: dict, file="model.safetensors"):
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps(config))
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(d / file))
    return d


def medusa_by_hand(num_heads=3, num_layers=2, dtype=torch.float32) -> dict:
    """ModelOpt's HFMedusaModel names: medusa_heads.{i}.{j}.linear.{weight,bias}, medusa_heads.{i}.{num_layers}.weight."""
    g = torch.Generator().manual_seed(0)
    t = {}
    for i in range(num_heads):
        for j in range(num_layers):
            t[f"medusa_heads.{i}.{j}.linear.weight"] = torch.randn(H, H, generator=g).to(dtype)
            t[f"medusa_heads.{i}.{j}.linear.bias"] = torch.randn(H, generator=g).to(dtype)
        t[f"medusa_heads.{i}.{num_layers}.weight"] = torch.randn(V, H, generator=g).to(dtype)
    return t


def eagle_by_hand(layers=1, aux=3, prefix_layer0="layers.0.") -> dict:
    """ModelOpt's EagleExporter names for an EAGLE-3 module (layer 0 reads 2*H: [embedding, fused hidden])."""
    g = torch.Generator().manual_seed(1)
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    t = {"fc.weight": r(H, aux * H), "norm.weight": r(H), "lm_head.weight": r(V, H)}
    for i in range(layers):
        p, w = (prefix_layer0 if i == 0 else f"layers.{i}."), (2 * H if i == 0 else H)
        t |= {p + "input_layernorm.weight": r(H), p + "post_attention_layernorm.weight": r(H),
              p + "self_attn.q_proj.weight": r(HEADS * HEAD_DIM, w), p + "self_attn.k_proj.weight": r(KV * HEAD_DIM, w),
              p + "self_attn.v_proj.weight": r(KV * HEAD_DIM, w), p + "self_attn.o_proj.weight": r(H, HEADS * HEAD_DIM),
              p + "mlp.gate_proj.weight": r(INTER, H), p + "mlp.up_proj.weight": r(INTER, H), p + "mlp.down_proj.weight": r(H, INTER)}
    t[prefix_layer0 + "hidden_norm.weight"] = r(H)
    return t


def eagle_config(layers=1, aux=(1, 15, 28)) -> dict:
    return {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": H, "intermediate_size": INTER,
            "num_attention_heads": HEADS, "num_key_value_heads": KV, "head_dim": HEAD_DIM, "num_hidden_layers": layers,
            "vocab_size": V, "draft_vocab_size": V, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
            "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(aux), "use_aux_hidden_state": True,
                             "use_input_layernorm_in_first_layer": True, "use_last_layernorm": True}}


def medusa_config(num_heads=3, num_layers=2) -> dict:
    return {"architectures": ["LlamaForCausalLM"], "hidden_size": H, "vocab_size": V,
            "medusa": {"num_medusa_heads": num_heads, "num_medusa_layers": num_layers}}


def test_medusa_modelopt_full_checkpoint_loads_heads_only(tmp_path):
    # ModelOpt saves base + heads together in bfloat16; the base's tensors are not ours to read
    heads = medusa_by_hand(dtype=torch.bfloat16)
    base = {"model.embed_tokens.weight": torch.randn(V, H).bfloat16(), "lm_head.weight": torch.randn(V, H).bfloat16()}
    ckpt = load_heads(write(tmp_path / "m", medusa_config(), heads | base))
    assert (ckpt.mode, ckpt.num_heads, ckpt.num_layers, ckpt.hidden_size, ckpt.vocab_size) == ("medusa", 3, 2, H, V)
    assert set(ckpt.tensors) == set(heads) == set(medusa_tensor_names(3, 2))
    for name, t in heads.items():
        assert np.array_equal(ckpt.tensors[name], t.float().numpy()), name  # bfloat16 widened exactly


def test_medusa_sharded_with_index(tmp_path):
    heads = medusa_by_hand(num_heads=2, num_layers=1)
    d = tmp_path / "m"
    names = sorted(heads)
    write(d, medusa_config(2, 1), {n: heads[n] for n in names[:3]}, "model-00001-of-00002.safetensors")
    save_file({n: heads[n] for n in names[3:]}, str(d / "model-00002-of-00002.safetensors"))
    weight_map = {n: f"model-0000{1 if k < 3 else 2}-of-00002.safetensors" for k, n in enumerate(names)}
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    assert set(load_heads(d).tensors) == set(heads)


@pytest.mark.parametrize("layers", [1, 2])
def test_eagle3_modelopt_export_loads(tmp_path, layers):
    t = eagle_by_hand(layers)
    ckpt = load_heads(write(tmp_path / "e", eagle_config(layers), t), base_num_layers=32)
    assert (ckpt.mode, ckpt.num_layers, ckpt.aux_layer_ids) == ("eagle", layers, [1, 15, 28])
    assert set(ckpt.tensors) == set(eagle_tensor_names(layers))
    assert all(np.array_equal(ckpt.tensors[n], t[n].numpy()) for n in t)


def test_eagle3_legacy_midlayer_names_load_as_layers_0(tmp_path):
    # older ModelOpt exports and the official EAGLE-3 checkpoints call the single layer "midlayer"
    t = eagle_by_hand(1, prefix_layer0="midlayer.")
    ckpt = load_heads(write(tmp_path / "e", eagle_config(1), t))
    assert np.array_equal(ckpt.tensors["layers.0.self_attn.q_proj.weight"], t["midlayer.self_attn.q_proj.weight"].numpy())
    assert not any(n.startswith("midlayer") for n in ckpt.tensors)


def test_eagle3_with_a_smaller_draft_vocab_needs_d2t(tmp_path):
    cfg = eagle_config(1) | {"draft_vocab_size": 20}
    t = eagle_by_hand(1) | {"lm_head.weight": torch.randn(20, H)}
    with pytest.raises(CheckpointError, match="missing tensor.*d2t"):
        load_heads(write(tmp_path / "a", cfg, t))
    ckpt = load_heads(write(tmp_path / "b", cfg, t | {"d2t": torch.arange(20, dtype=torch.int64)}))
    assert ckpt.tensors["d2t"].dtype == np.int64 and ckpt.tensors["lm_head.weight"].shape == (20, H)
    assert ckpt.draft_targets().tolist() == list(range(0, 40, 2))  # draft id i scores target id i + d2t[i]
    mask = torch.zeros(cfg["vocab_size"], dtype=torch.bool)
    mask[0:40:2] = True  # t2d, the inverse map's mask, read as bool
    assert load_heads(write(tmp_path / "c", cfg, t | {"d2t": torch.arange(20, dtype=torch.int64), "t2d": mask})).tensors["t2d"].dtype == bool


@pytest.mark.parametrize("shape, form", [((1, 1, 3 * H), "constant"), ((3 * H,), "constant"), ((H,), "constant"), ((1, 4, 3 * H), "anchored")])
def test_peagle_is_an_eagle3_export_with_a_placeholder(tmp_path, shape, form):
    """vLLM speculators' P-EAGLE: the EAGLE-3 tensors plus mask_hidden ([1, 1, num_aux * hidden]; flat or already
    fused to [hidden] read too) and config.json's ptd_token_id; ours, anchored: one vector per depth. placeholder_features
    is fc(mask_hidden), [vectors, hidden]."""
    mask = torch.randn(*shape, generator=torch.Generator().manual_seed(2))
    t = eagle_by_hand(1) | {"mask_hidden": mask}
    cfg = eagle_config(1) | {"ptd_token_id": 7, "para_depths": 6} | ({"peagle_placeholders": "anchored"} if form == "anchored" else {})
    ckpt = load_heads(write(tmp_path / "p", cfg, t), base_num_layers=32)
    assert (ckpt.mode, ckpt.mask_token_id, ckpt.parallel_depths, ckpt.aux_layer_ids, ckpt.placeholder_form) == ("peagle", 7, 6, [1, 15, 28], form)
    flat = mask.reshape(-1, shape[-1]).numpy()
    want = flat if shape == (H,) else flat @ t["fc.weight"].numpy().T
    np.testing.assert_allclose(ckpt.placeholder_features(), want, rtol=1e-5, atol=1e-5)
    assert ckpt.placeholder_features().shape == ((4, H) if form == "anchored" else (1, H))


@pytest.mark.parametrize("change, match", [
    ({"ptd_token_id": None}, "has no ptd_token_id"),
    ({"ptd_token_id": V}, r"field 'ptd_token_id' is 50; expected an integer from 0 to 49"),
    ({"mask": torch.randn(2 * H)}, r"mask_hidden has shape \[64\], expected \[1, 1, 96\]"),
    ({"mask": torch.randn(1, 3, 3 * H)}, r"mask_hidden has shape \[1, 3, 96\], expected \[1, 1, 96\] .* for constant placeholders"),
    ({"peagle_placeholders": "sideways"}, "peagle_placeholders is 'sideways'; expected one of constant, anchored"),
    ({"mask": None}, "names ptd_token_id but model.safetensors has no mask_hidden"),
    ({"specdec_train": {"peagle_truth_tokens": True}}, r"trained with its placeholders reading the true tokens .* it cannot draft"),
])
def test_peagle_errors(tmp_path, change, match):
    cfg = eagle_config(1) | {"ptd_token_id": 3}
    t = eagle_by_hand(1) | {"mask_hidden": torch.randn(1, 1, 3 * H)}
    for key in ("peagle_placeholders", "specdec_train"):
        if key in change:
            cfg[key] = change[key]
    if "ptd_token_id" in change:
        cfg["ptd_token_id"] = change["ptd_token_id"]
        if change["ptd_token_id"] is None:
            del cfg["ptd_token_id"]
    if "mask" in change:
        t.pop("mask_hidden")
        if change["mask"] is not None:
            t["mask_hidden"] = change["mask"]
    with pytest.raises(CheckpointError, match=match):
        load_heads(write(tmp_path / "bad", cfg, t))


@pytest.mark.parametrize("case, match", [
    ("missing", r"missing tensor\(s\) medusa_heads.1.0.linear.bias"),
    ("shape", r"medusa_heads.0.2.weight has shape \[49, 32\], expected \[50, 32\]"),
    ("extra", r"unexpected tensor 'medusa_heads.3.0.linear.weight'"),
    ("heads", r"num_medusa_heads must be a positive integer, found 0"),
])
def test_medusa_config_and_tensors_must_agree(tmp_path, case, match):
    t, cfg = medusa_by_hand(), medusa_config()
    if case == "missing":
        del t["medusa_heads.1.0.linear.bias"]
    elif case == "shape":
        t["medusa_heads.0.2.weight"] = torch.randn(V - 1, H)
    elif case == "extra":
        t["medusa_heads.3.0.linear.weight"] = torch.randn(H, H)
    else:
        cfg["medusa"]["num_medusa_heads"] = 0
    with pytest.raises(CheckpointError, match=match):
        load_heads(write(tmp_path / case, cfg, t))


def test_eagle_errors(tmp_path):
    t = eagle_by_hand(1)
    with pytest.raises(CheckpointError, match=r"fc.weight has shape \[32, 96\], expected \[32, 64\]"):
        load_heads(write(tmp_path / "aux", eagle_config(1, aux=(1, 2)), t))
    with pytest.raises(CheckpointError, match="name layers the 16-layer base model lacks"):
        load_heads(write(tmp_path / "deep", eagle_config(1), t), base_num_layers=16)
    no_aux = eagle_config(1)
    no_aux["eagle_config"]["use_aux_hidden_state"] = False
    with pytest.raises(CheckpointError, match="EAGLE-1"):
        load_heads(write(tmp_path / "e1", no_aux, t))


def test_not_a_head_checkpoint(tmp_path):
    with pytest.raises(CheckpointError, match="does not exist"):
        load_heads(tmp_path / "nowhere")
    with pytest.raises(CheckpointError, match="neither Medusa heads"):
        load_heads(write(tmp_path / "plain", {"architectures": ["LlamaForCausalLM"]}, {"x": torch.zeros(1)}))
    pickled = tmp_path / "pickled"
    pickled.mkdir()
    (pickled / "config.json").write_text(json.dumps(medusa_config()))
    (pickled / "medusa_lm_head.pt").write_bytes(b"\x80\x04not loaded")
    with pytest.raises(CheckpointError, match="pickles, which specdec never loads"):
        load_heads(pickled)


def test_default_aux_layers_follow_modelopt():
    # ModelOpt: sorted({1, max(0, L//2 - 1), max(0, L - 4)}); tiny bases clamp 1 to their last layer
    assert default_eagle_aux_layer_ids(32) == [1, 15, 28]
    assert default_eagle_aux_layer_ids(80) == [1, 39, 76]
    assert default_eagle_aux_layer_ids(6) == [1, 2]
    assert default_eagle_aux_layer_ids(2) == [0, 1]
    assert default_eagle_aux_layer_ids(1) == [0]


def test_load_heads_needs_no_torch(tmp_path):
    # the builder reads heads with it, and the builder runs without torch
    import subprocess
    import sys

    d = write(tmp_path / "m", medusa_config(2, 1), medusa_by_hand(2, 1))
    code = ("import sys\n"
            "class Block:\n"
            "    def find_spec(self, name, path=None, target=None):\n"
            "        if name.split('.')[0] in ('torch', 'transformers', 'safetensors'):\n"
            "            raise ImportError(name)\n"
            "sys.meta_path.insert(0, Block())\n"
            "from specdec.train import load_heads\n"
            f"print(load_heads({str(d)!r}).num_heads)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "2", proc.stderr
