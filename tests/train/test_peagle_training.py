"""P-EAGLE's training pass is its drafting pass: every row of the one-sequence training layout equals a causal run
over what drafting feeds (the real pairs up to the anchor, then its placeholders), and its loss scores each row on the
base's distribution for the token that row predicts."""

import math

import pytest
import torch
import torch.nn.functional as F
from test_losses import incremental
from transformers import LlamaConfig

from specdec.train.eagle import eagle_llama_config
from specdec.train.peagle import PEagleModule, batch_generator, parallel_layout, peagle_loss, reading_blocks

torch.set_num_threads(1)
B, T, H, V, K = 2, 12, 16, 23, 4


def tiny_peagle(layers: int = 2, seed: int = 3, anchored: bool = True) -> tuple[PEagleModule, torch.nn.Linear]:
    torch.manual_seed(seed)
    base_cfg = LlamaConfig(vocab_size=V, hidden_size=H, intermediate_size=32, num_attention_heads=2, num_key_value_heads=1,
                           max_position_embeddings=64)
    base_head = torch.nn.Linear(H, V, bias=False)
    module = PEagleModule(eagle_llama_config(base_cfg, layers), num_aux=2, base_lm_head=base_head.weight.detach(), mask_embedding=torch.randn(H),
                          anchored=anchored, placeholders=2)  # 2 vectors for 3 placeholder depths: the deepest reuses the last
    with torch.no_grad():  # away from the init's 0.02 so that attention, the placeholders and their order matter
        for p in module.trainable_parameters():
            p.normal_(0, 0.3)
    return module.eval(), base_head


def inputs(seed: int = 4):
    g = torch.Generator().manual_seed(seed)
    aux, embeds = torch.randn(B, T - 1, 2 * H, generator=g), torch.randn(B, T - 1, H, generator=g)
    valid = torch.ones(B, T - 1, dtype=torch.bool)
    valid[1, 8:] = False  # the second sequence is 9 tokens long
    loss_mask = torch.zeros(B, T, dtype=torch.bool)
    loss_mask[0, 3:] = True  # a 3-token prompt
    loss_mask[1, 2:9] = True
    return aux, embeds, valid, loss_mask



def counted_rows(module, base_head, hidden, base_hidden, layout, valid, loss_mask) -> dict:
    """{(batch, anchor, depth): (the base's, the module's log-probabilities)} for every row whose token counts: real row
    r is anchor r at depth 0; a row at (p, d) guesses token p + d + 2, which the base says how at token - 1."""
    rows = {(b, r, 0): r for b in range(B) for r in range(T - 1) if valid[b, r]}
    rows |= {(b, int(layout.anchors[b, j]), int(layout.depths[b, j])): T - 1 + j
             for b in range(B) for j in range(layout.used.shape[1]) if layout.used[b, j]}
    return {(b, p, d): (F.log_softmax(base_head(base_hidden[b, p + d + 1]), -1).detach(), F.log_softmax(module.lm_head(hidden[b, row]), -1).detach())
            for (b, p, d), row in rows.items() if p + d + 2 < T and loss_mask[b, p + d + 2]}


@pytest.mark.parametrize("anchored,truth,reads", [(True, False, None), (False, False, None), (True, True, None), (True, False, "true"),
                                                  (True, False, "drafts")],
                         ids=["anchored", "constant", "true-tokens", "refine-true-tokens", "refine-drafts"])
@torch.no_grad()
def test_every_training_row_is_what_drafting_computes(anchored, truth, reads):
    """Real row r: EAGLE-3's causal run over the real pairs 0..r. Placeholder (p, d): the real pairs 0..p, then d
    placeholders at positions p+1..p+d (placeholder e reads depth e's vector, plus the anchor's features when
    anchored, and the mask token's embedding), its output the last row. ``reads_true_tokens`` (the bound): placeholder
    e reads token p+e+1's embedding instead, as a k-call drafter reads its accepted drafts. ``layout.reads`` (a refining
    module, --peagle_refine): the blocks drawn read the true tokens in training, or the drafts given (a refining call)."""
    module, _ = tiny_peagle(anchored=anchored)
    module.reads_true_tokens = truth
    aux, embeds, valid, loss_mask = inputs()
    layout = parallel_layout(valid, loss_mask, K, 0.7, 0.2, None)
    drafts = None
    if reads:
        layout.reads = reading_blocks(layout, torch.Generator().manual_seed(1))
        assert 0 < int(layout.reads.sum()) < int(layout.used.sum())  # some blocks read, some are blind
        if reads == "drafts":
            drafts = torch.randn(B, layout.used.shape[1], H, generator=torch.Generator().manual_seed(2))  # [B, M, H]
    out = module.parallel_hidden(aux, embeds, layout, read_embeds=drafts)  # [B, T' + M, H], normed
    slot = {(b, int(layout.anchors[b, j]), int(layout.depths[b, j])): j for b in range(B) for j in range(layout.used.shape[1]) if layout.used[b, j]}
    fused, ph = module.fc(aux), module.placeholder_hidden()
    checked = 0
    for b in range(B):
        n = int(valid[b].sum())
        for r in range(n):
            want = module.norm(incremental(module, fused[b, : r + 1], embeds[b, : r + 1])[-1])
            assert torch.allclose(out[b, r], want, atol=1e-5), (b, r)
        for j in range(int(layout.used[b].sum())):
            p, d = int(layout.anchors[b, j]), int(layout.depths[b, j])
            vectors = torch.stack([ph[min(e, len(ph)) - 1] for e in range(1, d + 1)])  # [d, H]: depth e's vector
            h = torch.cat([fused[b, : p + 1], vectors + (fused[b, p] if anchored else 0)])
            read = truth or (reads is not None and bool(layout.reads[b, j]))
            if read and drafts is not None:  # placeholder e reads the draft given at its own slot
                read_rows = torch.stack([drafts[b, slot[b, p, e]] for e in range(1, d + 1)])
            else:
                read_rows = embeds[b, p + 1 : p + d + 1]
            e = torch.cat([embeds[b, : p + 1], read_rows if read else module.mask_embedding.expand(d, H)])
            want = module.norm(incremental(module, h, e)[-1])
            assert torch.allclose(out[b, T - 1 + j], want, atol=1e-5), (b, p, d)
            checked += 1
    assert checked > 10


def test_reading_blocks_reads_whole_blocks_half_the_anchors_as_a_function_of_the_batch():
    """--peagle_refine: a block reads its tokens whole or not at all (a refining call reads every draft of the first), about
    half the anchors, drawn from the batch's generator (a resumed run draws the same)."""
    valid, loss_mask = torch.ones(B, 40, dtype=torch.bool), torch.ones(B, 41, dtype=torch.bool)
    layout = parallel_layout(valid, loss_mask, K, 1.0, 1.0, None)
    ids = torch.randint(0, V, (B, 41), generator=torch.Generator().manual_seed(0))
    reads = reading_blocks(layout, batch_generator(ids, seed=0))
    assert torch.equal(reads, reading_blocks(layout, batch_generator(ids, seed=0)))
    assert not bool((reads & ~layout.used).any())
    for b in range(B):
        by_anchor: dict[int, set[bool]] = {}
        for j in range(layout.used.shape[1]):
            if layout.used[b, j]:
                by_anchor.setdefault(int(layout.anchors[b, j]), set()).add(bool(reads[b, j]))
        assert all(len(v) == 1 for v in by_anchor.values()), "a block half read"
        share = sum(v == {True} for v in by_anchor.values()) / len(by_anchor)
        assert 0.25 < share < 0.75, share


def test_full_layout_keeps_every_counted_anchor_and_sampling_is_nested():
    aux, embeds, valid, loss_mask = inputs()
    full = parallel_layout(valid, loss_mask, K, 0.7, 0.2, None)
    for b in range(B):
        got = {(int(p), int(d)) for p, d, u in zip(full.anchors[b], full.depths[b], full.used[b], strict=False) if u}
        want = {(p, d) for d in range(1, K) for p in range(T - 1) if valid[b, p] and p + d + 2 < T and loss_mask[b, p + d + 2]
                and all(loss_mask[b, p + e + 2] for e in range(1, d))}
        assert got == want, b
    ids = torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(0))
    sampled = parallel_layout(valid, loss_mask, K, 0.5, 0.0, batch_generator(ids, seed=0))
    again = parallel_layout(valid, loss_mask, K, 0.5, 0.0, batch_generator(ids, seed=0))
    assert torch.equal(sampled.anchors, again.anchors) and torch.equal(sampled.depths, again.depths)  # a function of the batch
    for b in range(B):
        rows = {(int(p), int(d)) for p, d, u in zip(sampled.anchors[b], sampled.depths[b], sampled.used[b], strict=False) if u}
        assert rows < {(int(p), int(d)) for p, d, u in zip(full.anchors[b], full.depths[b], full.used[b], strict=False) if u}
        assert all(d == 1 or (p, d - 1) in rows for p, d in rows), "a placeholder without the ones before it"
        per_depth = [sum(1 for _, d in rows if d == k) for k in range(1, K)]
        assert per_depth == sorted(per_depth, reverse=True) and per_depth[0] >= 1


def test_loss_is_kl_to_the_base_at_the_predicted_token_weighted_per_depth():
    module, base_head = tiny_peagle(layers=1)
    aux, embeds, valid, loss_mask = inputs()
    base_hidden = torch.randn(B, T, H, generator=torch.Generator().manual_seed(5))
    layout = parallel_layout(valid, loss_mask, K, 0.7, 0.2, None)
    hidden = module.parallel_hidden(aux, embeds, layout)
    decay = 0.8
    loss, hits = peagle_loss(module, hidden, layout, base_hidden, base_head, loss_mask, K, decay)
    per_depth: list[list[float]] = [[] for _ in range(K)]
    same = [0] * K
    for (_, _, d), (want, got) in counted_rows(module, base_head, hidden, base_hidden, layout, valid, loss_mask).items():
        per_depth[d].append(float((want.exp() * (want - got)).sum()))
        same[d] += int(want.argmax() == got.argmax())
    expected = sum(sum(k) / len(k) * decay**d for d, k in enumerate(per_depth)) / sum(decay**d for d in range(K))
    assert math.isclose(loss.item(), expected, rel_tol=1e-5)
    assert hits == [(same[d], len(per_depth[d])) for d in range(K)]
    loss.backward()
    assert module.mask_hidden.grad is not None and module.mask_hidden.grad.abs().sum() > 0  # the placeholder learns
    assert module.lm_head.weight.grad is None


@pytest.mark.parametrize("depths", [1, 3])
@torch.no_grad()
def test_real_rows_are_eagle_3s_depth_1_pass(depths):
    """Placeholders never leak into the real rows: those are EAGLE-3's depth-1 pass whatever the depths (1: none)."""
    module, _ = tiny_peagle(layers=1)
    aux, embeds, valid, loss_mask = inputs()
    layout = parallel_layout(valid, loss_mask, depths, 0.7, 0.2, None)
    assert bool(layout.used.any()) == (depths > 1)
    out = module.parallel_hidden(aux, embeds, layout)
    assert torch.allclose(out[:, : T - 1][valid], module.hidden(aux, embeds, valid)[valid], atol=1e-5)


@pytest.mark.parametrize("gate", ["greedy", "soft"])
def test_gated_loss_weighs_each_position_by_how_right_its_block_was_before_it(gate):
    """--peagle_gate: placeholder (p, d)'s KL weighs the product over the block's earlier rows (real row p, then
    placeholders (p, 1..d-1)) of whether (greedy) or how likely (soft) the module's guess there was the base's top-1; a
    row whose token is not counted weighs 1 in that product, and each depth's sum is divided by its rows."""
    module, base_head = tiny_peagle(layers=1)
    module.lm_head.weight.data *= 20  # confident guesses: soft gates near 1 and near 0, as greedy's
    aux, embeds, valid, loss_mask = inputs()
    layout = parallel_layout(valid, loss_mask, K, 0.7, 0.2, None)
    hidden = module.parallel_hidden(aux, embeds, layout)
    base_head.weight.data.copy_(module.lm_head.weight)
    base_hidden = torch.randn(B, T, H, generator=torch.Generator().manual_seed(5))
    base_hidden[:, 1:T:2] = hidden[:, 0 : T - 1 : 2].detach()  # the base agrees with every even real row: blocks right and wrong
    decay = 0.8
    loss, _ = peagle_loss(module, hidden, layout, base_hidden, base_head, loss_mask, K, decay, gate=gate)
    kl, right = {}, {}
    for key, (want, got) in counted_rows(module, base_head, hidden, base_hidden, layout, valid, loss_mask).items():
        kl[key] = float((want.exp() * (want - got)).sum())
        top = int(want.argmax())
        right[key] = float(int(got.argmax()) == top) if gate == "greedy" else float(got[top].exp())
    gates = {(b, p, d): math.prod(right.get((b, p, e), 1.0) for e in range(d)) for b, p, d in kl}
    at_1 = [g for (b, p, d), g in gates.items() if d == 1 and (b, p, 0) in right]  # blocks whose position 1 counts
    assert min(at_1) < 0.5 < max(at_1)  # some blocks right at position 1, some wrong
    per_depth: list[list[float]] = [[] for _ in range(K)]
    for key, value in kl.items():
        per_depth[key[2]].append(value * gates[key])
    expected = sum(sum(k) / len(k) * decay**d for d, k in enumerate(per_depth)) / sum(decay**d for d in range(K))
    assert math.isclose(loss.item(), expected, rel_tol=1e-5)
    loss.backward()
    assert module.mask_hidden.grad is not None and module.mask_hidden.grad.abs().sum() > 0


def test_an_unknown_gate_is_refused_before_training():
    from specdec.train.errors import TrainConfigError
    from specdec.train.trainer import TrainConfig

    with pytest.raises(TrainConfigError, match="--peagle_gate 'hard' is not one of none, greedy, soft"):
        TrainConfig(mode="peagle", model="m", data="d", output_dir="o", peagle_gate="hard").validate()
