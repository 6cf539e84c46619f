"""P-EAGLE builds: an eagle target's features and a module engine that drafts a block in ONE causal call.

The module engine (OUT/eagle, mode peagle_module) is the EAGLE-3 module's network where the token id vocab_size
marks a placeholder row: it reads fc(mask_hidden) and the embedding of ptd_token_id. Fed the real pairs and then
placeholders, its logits equal train/peagle.py's PEagleModule on drafting's rows (what its training pass computes),
in both lowerings, in one call or with the real pairs already in its cache."""

import numpy as np
import pytest
import torch
from checkpoints import load_hf, make_checkpoint, write_eagle_module, write_peagle_module
from conftest import spec_build
from test_eagle_build import run_onnx

from specdec.builder.build import build_engine
from specdec.formats.engine_format import eagle_module_dir, extra_io, load_engine_dir
from specdec.formats.errors import BuildConfigError
from specdec.train.base import run_base
from specdec.train.peagle import parallel_layout

AUX_IDS = [0, 2]


@pytest.fixture(scope="module")
def peagle(tmp_path_factory):
    d = tmp_path_factory.mktemp("peagle")
    ckpt = make_checkpoint(d / "base", num_hidden_layers=3, seed=0)
    module = write_peagle_module(ckpt, d / "module", aux_ids=AUX_IDS, depths=4)  # 3 vectors: a 5-token block reuses the last
    constant = write_peagle_module(ckpt, d / "constant", aux_ids=AUX_IDS, placeholders="constant")
    return {"dir": d, "ckpt": ckpt, "module": module, "constant": constant, "hf": load_hf(ckpt)}


def run_module(engine_dir, ids: np.ndarray, hidden: np.ndarray, past=None, start: int = 0) -> dict[str, np.ndarray]:
    """One causal call of a P-EAGLE module (run_onnx checks its inputs are these: no tree_mask)."""
    return run_onnx(engine_dir, {"input_ids": ids, "hidden_states": hidden}, past=past, start=start, tree_mask=False)


@pytest.mark.parametrize("lowering, form", [("portable", "module"), ("ort_cpu", "module"), ("ort_cpu", "constant")])
def test_peagle_module_drafts_a_block_in_one_call_as_torch_does(peagle, lowering, form, tmp_path):
    """Anchored placeholders (ours: fed the anchor's features, depth d's vector added) and vLLM's constant ones."""
    out = tmp_path / "e"
    build_engine(peagle["ckpt"], out, spec_build(6, speculative_decoding_mode="peagle", lowering=lowering), say=lambda _: None,
                 peagle_dir=peagle["dir"] / form)
    target, module = load_engine_dir(out), load_engine_dir(eagle_module_dir(load_engine_dir(out)))
    b, m = target.config.build, module.config.build
    assert (b.speculative_decoding_mode, b.tree_attention, list(b.eagle_aux_layer_ids)) == ("peagle", True, AUX_IDS)
    assert (m.speculative_decoding_mode, m.tree_attention, m.lowering) == ("peagle_module", False, lowering)
    assert [t.name for t in extra_io(module.config.model, m)[0]] == ["hidden_states"] and not extra_io(module.config.model, m)[1]

    torch_module, hf, vocab = peagle[form], peagle["hf"], module.config.model.vocab_size
    ids = torch.randint(4, vocab, (2, 10), generator=torch.Generator().manual_seed(3))
    got = run_onnx(out, {"input_ids": ids.numpy()})
    with torch.no_grad():
        base = run_base(hf, ids, torch.ones_like(ids), AUX_IDS)
        fused = torch_module.fc(base.aux_hidden)  # [2, 10, hidden]
    np.testing.assert_allclose(got["eagle_hidden"], fused.numpy(), atol=1e-4)

    # the real pairs 0..8 (features at p, token p+1), then 4 placeholders: drafting positions 1..5 in one call
    k = 5
    pairs, embeds = base.aux_hidden[:, :-1], hf.model.embed_tokens(ids[:, 1:])  # [2, 9, ...]
    feed_ids = np.concatenate([ids[:, 1:].numpy(), np.broadcast_to(vocab + np.arange(k - 1), (2, k - 1))], axis=1)  # depth d: vocab + d - 1
    anchor = fused[:, 8:9].numpy().repeat(k - 1, axis=1)  # each placeholder is fed the anchor's (the last pair's) features
    feed_hidden = np.concatenate([fused[:, :-1].numpy(), anchor], axis=1)
    one_call = run_module(eagle_module_dir(target), feed_ids, feed_hidden)
    valid = torch.ones(2, 9, dtype=torch.bool)
    loss_mask = torch.ones(2, 9 + k + 1, dtype=torch.bool)  # room for every depth of the last anchor
    layout = parallel_layout(valid, loss_mask, k, 0.7, 0.2, None)
    with torch.no_grad():
        rows = torch_module.lm_head(torch_module.parallel_hidden(pairs, embeds, layout))  # [2, 9 + M, vocab]
    for b in range(2):
        last = [8] + [9 + j for j in range(layout.used.shape[1]) if layout.used[b, j] and layout.anchors[b, j] == 8]  # anchor 8, depths 0..4
        assert len(last) == k
        np.testing.assert_allclose(one_call["logits"][b, -k:], rows[b, last].numpy(), atol=3e-4)

    # the same block drafted on a cache that already holds the real pairs 0..7: one call of pair 8 + placeholders
    first = run_module(eagle_module_dir(target), feed_ids[:, :8], feed_hidden[:, :8])
    block = run_module(eagle_module_dir(target), feed_ids[:, 8:], feed_hidden[:, 8:], past=first, start=8)
    np.testing.assert_allclose(block["logits"], one_call["logits"][:, 8:], atol=3e-4)


def test_peagle_refusals(peagle, tmp_path):
    with pytest.raises(BuildConfigError, match="--speculative_decoding_mode peagle needs --peagle_dir DIR"):
        build_engine(peagle["ckpt"], tmp_path / "a", spec_build(4, speculative_decoding_mode="peagle"), say=lambda _: None)
    with pytest.raises(BuildConfigError,
                       match="holds a P-EAGLE module .*, not an EAGLE-3 module: use --speculative_decoding_mode peagle --peagle_dir"):
        build_engine(peagle["ckpt"], tmp_path / "b", spec_build(4, speculative_decoding_mode="eagle"), say=lambda _: None,
                     eagle_dir=peagle["dir"] / "module")
    write_eagle_module(peagle["ckpt"], tmp_path / "eagle3", aux_ids=AUX_IDS)
    with pytest.raises(BuildConfigError, match="holds an EAGLE-3 module, not a P-EAGLE module .*: use --speculative_decoding_mode eagle --eagle_dir"):
        build_engine(peagle["ckpt"], tmp_path / "c", spec_build(4, speculative_decoding_mode="peagle"), say=lambda _: None,
                     peagle_dir=tmp_path / "eagle3")
    with pytest.raises(BuildConfigError, match="--peagle_dir needs --speculative_decoding_mode peagle"):
        build_engine(peagle["ckpt"], tmp_path / "d", spec_build(4), say=lambda _: None, peagle_dir=peagle["dir"] / "module")
    with pytest.raises(BuildConfigError, match="--peagle_dir .*missing does not exist or is not a directory: it takes a P-EAGLE module"):
        build_engine(peagle["ckpt"], tmp_path / "e", spec_build(4, speculative_decoding_mode="peagle"), say=lambda _: None,
                     peagle_dir=tmp_path / "missing")
    assert not any(p.name in "abcde" for p in tmp_path.iterdir())  # refused before anything was written


@pytest.mark.parametrize("form", ["module", "constant"])
def test_the_torch_backend_builds_a_peagle_target_and_its_module(peagle, form, tmp_path):
    """The module's placeholder rows in the torch backend's files (formats/torch_layout.py): the base's embedding with
    ptd_token_id's row appended, and fc(mask_hidden) per depth (row 0 zeros) under the form's name; the target's fc."""
    from specdec.formats.heads import load_heads
    from specdec.formats.safetensors_io import SafetensorsFile

    out = tmp_path / "t"
    build_engine(peagle["ckpt"], out, spec_build(4, speculative_decoding_mode="peagle", backend="torch"), say=lambda _: None,
                 peagle_dir=peagle["dir"] / form)
    target, module = load_engine_dir(out), load_engine_dir(eagle_module_dir(load_engine_dir(out)))
    assert (target.config.build.speculative_decoding_mode, module.config.build.speculative_decoding_mode) == ("peagle", "peagle_module")
    assert not module.config.build.tree_attention and "eagle_fc.weight" in SafetensorsFile(out / "model.safetensors").entries
    heads = load_heads(peagle["dir"] / form)
    top = SafetensorsFile(eagle_module_dir(target) / "model.safetensors")
    embed, base = np.array(top.raw("embed")), peagle["hf"].get_input_embeddings().weight.detach().numpy()
    np.testing.assert_array_equal(embed, np.concatenate([base, base[heads.mask_token_id][None]]))
    name = "placeholders.anchored" if form == "module" else "placeholders.constant"
    assert [e for e in top.entries if e.startswith("placeholders.")] == [name]
    vectors = np.array(top.raw(name))  # [depths + 1, hidden]
    assert not vectors[0].any()
    np.testing.assert_allclose(vectors[1:], heads.placeholder_features(), rtol=1e-6)
