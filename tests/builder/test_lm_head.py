"""The LM head as transformers reads the checkpoint (builder/lm_head.py), case by case against the installed
transformers: where it decodes with a matrix of the checkpoint, the engine's logits are its logits; where it refuses
or initialises a random head, specdec-build refuses in one line and leaves nothing behind."""

import json
import shutil

import numpy as np
import pytest
import torch
import transformers
from checkpoints import make_checkpoint
from conftest import build_and_load, cli_build
from fuzzing import assert_clean, fuzz_settings
from hypothesis import event, given, strategies as st
from safetensors.torch import load_file, save_file

HEAD, EMBED = "lm_head.weight", "model.embed_tokens.weight"


@pytest.fixture(scope="module")
def untied(tmp_path_factory):
    return make_checkpoint(tmp_path_factory.mktemp("lm-head") / "untied", tie_word_embeddings=False)


def variant(src, dst, tie, head):
    """src with tie_word_embeddings=tie and its head: "keep", "drop", "embedding" (the embedding's values), "rows"/"cols" (cut)."""
    shutil.copytree(src, dst)
    t = load_file(dst / "model.safetensors")
    if head == "drop":
        del t[HEAD]
    elif head == "embedding":
        t[HEAD] = t[EMBED].clone()
    elif head == "rows":
        t[HEAD] = t[HEAD][:50].clone()
    elif head == "cols":
        t[HEAD] = t[HEAD][:, :32].clone()
    save_file(t, dst / "model.safetensors", metadata={"format": "pt"})
    cfg = json.loads((dst / "config.json").read_text())
    cfg["tie_word_embeddings"] = tie
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst, t


def hf_logits(ckpt, ids):
    model = transformers.AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32).eval()
    with torch.no_grad():
        return model, model(torch.tensor([ids])).logits[0].numpy()


IDS = [1, 7, 30, 52, 9, 77, 12, 40]


@pytest.mark.parametrize("tie,head,decodes", [
    (True, "keep", HEAD),  # different values: transformers does not tie, and warns; so does specdec-build
    (True, "embedding", EMBED),  # the same values: tied, one copy in the engine
    (True, "drop", EMBED),
    (False, "keep", HEAD),
])
def test_where_transformers_decodes_the_engine_decodes_the_same(untied, tmp_path, tie, head, decodes):
    ckpt, stored = variant(untied, tmp_path / "ckpt", tie, head)
    model, want = hf_logits(ckpt, IDS)
    assert torch.equal(model.lm_head.weight, stored[decodes])  # what transformers decodes with
    r = cli_build(ckpt, tmp_path / "engine")
    assert r.exit_code == 0, r.output
    warned = "warning: config.json says tie_word_embeddings is true, but the checkpoint's lm_head.weight differs" in r.output
    assert warned == (tie and head == "keep")
    config = json.loads((tmp_path / "engine" / "config.json").read_text())
    assert config["model"]["tie_word_embeddings"] == (decodes == EMBED)
    ex = build_and_load(ckpt, tmp_path / "engine2")
    got = ex.forward(ex.new_cache(1), [IDS], all_logits=True).logits[0]
    np.testing.assert_allclose(got, want, atol=2e-4, rtol=0)


@pytest.mark.parametrize("tie,head,says", [
    (False, "drop", "tie_word_embeddings is false, and the checkpoint holds no lm_head.weight"),  # transformers: a random head
    (False, "rows", "lm_head.weight in model.safetensors has 50 rows but config.json's vocab_size is 96"),  # transformers: size mismatch
    (True, "rows", "lm_head.weight in model.safetensors has 50 rows but config.json's vocab_size is 96"),
    (False, "cols", "lm_head.weight in model.safetensors has shape [96, 32]"),
])
def test_where_transformers_refuses_or_invents_a_head_the_build_refuses(untied, tmp_path, tie, head, says):
    ckpt, stored = variant(untied, tmp_path / "ckpt", tie, head)
    try:
        model = transformers.AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32)
    except RuntimeError as err:  # a size mismatch
        assert "ignore_mismatched_sizes" in str(err)
    else:  # no head stored: a freshly initialised one, no matrix of the checkpoint
        assert head == "drop" and not any(torch.equal(model.lm_head.weight, w) for w in stored.values() if w.shape == model.lm_head.weight.shape)
    r = cli_build(ckpt, tmp_path / "engine")
    assert_clean(r, tmp_path / "engine")
    assert r.exit_code == 1 and says in r.stderr, r.stderr


# -- fuzzed against transformers as the oracle ---------------------------------------------------------------------------
HEADS = ["keep", "drop", "embedding", "rows", "cols", "transposed", "flat", "scaled", "bf16"]


def vary(src, dst, tie, head):
    """``variant`` and more heads: transposed, 1-D, the embedding scaled (other values of one shape), stored as bfloat16."""
    if head not in ("transposed", "flat", "scaled", "bf16"):
        _, t = variant(src, dst, bool(tie), head)
    else:
        shutil.copytree(src, dst)
        t = load_file(dst / "model.safetensors")
        t[HEAD] = {"transposed": lambda: t[HEAD].T.contiguous(), "flat": lambda: t[HEAD].flatten().clone(),
                   "scaled": lambda: t[EMBED] * 1.5, "bf16": lambda: t[HEAD].to(torch.bfloat16)}[head]()
        save_file(t, dst / "model.safetensors", metadata={"format": "pt"})
    cfg = json.loads((dst / "config.json").read_text())
    if tie is None:
        cfg.pop("tie_word_embeddings", None)
    else:
        cfg["tie_word_embeddings"] = tie
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst, t


@pytest.mark.fuzz
@fuzz_settings(6)
@given(tie=st.sampled_from([True, False, None]), head=st.sampled_from(HEADS))
def test_the_build_reads_the_head_as_transformers_does(untied, tmp_path_factory, tie, head):
    """Where transformers decodes with a matrix the checkpoint holds, the engine's logits are its logits; where it refuses
    the checkpoint or decodes with a head it invented, the build refuses in one line."""
    d = tmp_path_factory.mktemp("head")
    ckpt, stored = vary(untied, d / "ckpt", tie, head)
    try:
        model, want = hf_logits(ckpt, IDS)
        meant = any(w.shape == model.lm_head.weight.shape and torch.equal(model.lm_head.weight, w.float()) for w in stored.values())
    except RuntimeError:
        model, meant = None, False
    event(f"transformers {'decodes a stored matrix' if meant else 'refuses or invents'}")
    r = cli_build(ckpt, d / "engine")
    if not meant:
        assert_clean(r, d / "engine")
        assert r.exit_code == 1, r.output
        return
    assert r.exit_code == 0, r.output
    ex = build_and_load(ckpt, d / "engine2")
    got = ex.forward(ex.new_cache(1), [IDS], all_logits=True).logits[0]
    np.testing.assert_allclose(got, want, atol=2e-4, rtol=0)


def test_a_head_stored_in_another_dtype_with_the_embeddings_values_is_tied(untied, tmp_path):
    """The embedding in float32, the head the same values in bfloat16: compared chunk by chunk as float32 (neither read
    whole), equal, so tied; one value changed, so not (with the warning)."""
    from specdec.builder.architectures import model_config_from_hf
    from specdec.builder.checkpoint import load_checkpoint
    from specdec.builder.lm_head import resolve_lm_head

    def built(change: bool):
        d = tmp_path / f"ckpt-{change}"
        shutil.copytree(untied, d)
        t = load_file(d / "model.safetensors")
        t[EMBED] = t[EMBED].to(torch.bfloat16).float()  # values a bfloat16 holds exactly
        t[HEAD] = t[EMBED].to(torch.bfloat16)
        if change:
            t[HEAD][-1, -1] += 1
        save_file(t, d / "model.safetensors", metadata={"format": "pt"})
        cfg = json.loads((d / "config.json").read_text())
        cfg["tie_word_embeddings"] = True
        (d / "config.json").write_text(json.dumps(cfg))
        said = []
        ckpt = load_checkpoint(d)
        return resolve_lm_head(model_config_from_hf(ckpt.hf_config), ckpt, said.append), said

    model, said = built(False)
    assert model.tie_word_embeddings and not said
    model, said = built(True)
    assert not model.tie_word_embeddings and "differs from" in said[0]
