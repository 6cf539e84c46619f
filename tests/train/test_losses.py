"""The losses say what the docs say: Medusa head i at t is scored on token t+2+i, EAGLE at t on the base's
distribution for token t+2; written here as plain loops over positions on full logits."""

import math
import warnings

import torch
import torch.nn.functional as F
from transformers import LlamaConfig

from specdec.train.eagle import Eagle3Module, eagle_llama_config, eagle_loss
from specdec.train.medusa import MedusaHeads, medusa_loss

torch.set_num_threads(1)
B, T, H, V = 2, 9, 16, 23


def test_medusa_loss_scores_head_i_on_token_t_plus_2_plus_i():
    torch.manual_seed(0)
    heads = MedusaHeads(H, V, num_heads=3, num_layers=1)
    with torch.no_grad():
        for p in heads.parameters():
            p.normal_()
    hidden, ids = torch.randn(B, T, H), torch.randint(0, V, (B, T))
    mask = torch.ones(B, T, dtype=torch.bool)
    mask[0, :4] = False  # a prompt
    mask[1, 7:] = False  # padding
    loss, hits = medusa_loss(heads, hidden, ids, mask)
    full = heads(hidden)  # [heads, batch, seq, vocab]
    expected = 0.0
    for i in range(3):
        ces, correct = [], 0
        for b in range(B):
            for t in range(T - 2 - i):
                if mask[b, t + 2 + i]:
                    ces.append(F.cross_entropy(full[i, b, t], ids[b, t + 2 + i]).item())
                    correct += int(full[i, b, t].argmax() == ids[b, t + 2 + i])
        expected += sum(ces) / len(ces) * 0.2 * 0.8**i
        assert hits[i] == (correct, len(ces))
    assert math.isclose(loss.item(), expected, rel_tol=1e-5)


def test_eagle_loss_is_kl_to_the_bases_next_next_distribution():
    torch.manual_seed(1)
    base_cfg = LlamaConfig(vocab_size=V, hidden_size=H, intermediate_size=32, num_attention_heads=2, num_key_value_heads=1,
                           max_position_embeddings=64)
    base_head = torch.nn.Linear(H, V, bias=False)
    module = Eagle3Module(eagle_llama_config(base_cfg, 1), num_aux=2, base_lm_head=base_head.weight.detach())
    hidden, base_hidden = torch.randn(B, T - 1, H), torch.randn(B, T, H)
    mask = torch.ones(B, T, dtype=torch.bool)
    mask[1, :5] = False
    loss, hits = eagle_loss(module, hidden, base_hidden, base_head, mask)
    kls, same = [], 0
    for b in range(B):
        for t in range(T - 2):  # position t predicts token t+2: the base at t+1 says how
            if mask[b, t + 2]:
                p = F.log_softmax(base_head(base_hidden[b, t + 1]), -1).detach()
                q = F.log_softmax(module.lm_head(hidden[b, t]), -1).detach()
                kls.append((p.exp() * (p - q)).sum().item())
                same += int(p.argmax() == q.argmax())
    assert math.isclose(loss.item(), sum(kls) / len(kls), rel_tol=1e-5)
    assert hits == (same, len(kls))
    assert module.lm_head.weight.requires_grad is False and torch.equal(module.lm_head.weight, base_head.weight)


# -- EAGLE-3 training-time test (TTT): step j is drafting depth j -------------------------------------------

def tiny_eagle(layers: int = 2, seed: int = 2) -> tuple[Eagle3Module, torch.nn.Linear]:
    torch.manual_seed(seed)
    base_cfg = LlamaConfig(vocab_size=V, hidden_size=H, intermediate_size=32, num_attention_heads=2, num_key_value_heads=1,
                           max_position_embeddings=64)
    base_head = torch.nn.Linear(H, V, bias=False)
    module = Eagle3Module(eagle_llama_config(base_cfg, layers), num_aux=2, base_lm_head=base_head.weight.detach())
    with torch.no_grad():  # larger than the init's 0.02 so that attention and the fed-back h matter
        for p in module.trainable_parameters():
            p.normal_(0, 0.3)
    return module.eval(), base_head


def incremental(module: Eagle3Module, fused: torch.Tensor, embeds: torch.Tensor) -> torch.Tensor:
    """Drafting's view, written out: one causal run over rows whose input hidden states are given.

    fused: [n, hidden] (fc(aux) for real pairs, a fed-back h for drafted rows); embeds: [n, hidden]; positions 0..n-1.
    Returns the pre-norm outputs [n, hidden] (what the runtime feeds back as hidden_out)."""
    n = fused.shape[0]
    h, e = fused.unsqueeze(0), embeds.unsqueeze(0)
    rope = module.rotary_emb(h, torch.arange(n).unsqueeze(0))
    mask = torch.zeros(1, 1, n, n).masked_fill(~torch.tril(torch.ones(n, n, dtype=torch.bool)), torch.finfo(torch.float32).min)
    first = module.layers[0]
    x = torch.cat([first.input_layernorm(e), first.hidden_norm(h)], dim=-1)
    h = h + first.self_attn(hidden_states=x, position_embeddings=rope, attention_mask=mask)[0]
    h = h + first.mlp(first.post_attention_layernorm(h))
    for layer in module.layers[1:]:
        h = layer(h, attention_mask=mask, position_embeddings=rope)
    return h[0]


@torch.no_grad()
def test_ttt_steps_equal_incremental_drafting():
    module, _ = tiny_eagle(layers=2)
    aux, embeds = torch.randn(B, T - 1, 2 * H), torch.randn(B, T - 1, H)  # row r: features at r, embedding of token r+1
    attn = torch.ones(B, T - 1, dtype=torch.bool)
    attn[1, 6:] = False  # padding on the second sequence
    steps = module.ttt_hidden(aux, embeds, attn, steps=3)
    logits = [module.lm_head(s) for s in steps]  # each [B, T-1, V]
    fused = module.fc(aux)
    for b, rows in ((0, range(T - 1)), (1, range(6))):
        for r in rows:
            real = incremental(module, fused[b, : r + 1], embeds[b, : r + 1])  # step 1: the real pairs 0..r
            assert torch.allclose(logits[0][b, r], module.lm_head(module.norm(real[r])), atol=1e-5)
            if r >= 1:  # depth 2 at r: real pairs 0..r-1, then (their last h, embedding of token r+1)
                h1 = incremental(module, fused[b, :r], embeds[b, :r])[-1]
                d2 = incremental(module, torch.cat([fused[b, :r], h1[None]]), embeds[b, : r + 1])
                assert torch.allclose(logits[1][b, r], module.lm_head(module.norm(d2[-1])), atol=1e-5), (b, r)
            if r >= 2:  # depth 3 at r: real pairs 0..r-2, then two drafted rows, each fed the previous one's h
                h1 = incremental(module, fused[b, : r - 1], embeds[b, : r - 1])[-1]
                h2 = incremental(module, torch.cat([fused[b, : r - 1], h1[None]]), embeds[b, :r])[-1]
                d3 = incremental(module, torch.cat([fused[b, : r - 1], h1[None], h2[None]]), embeds[b, : r + 1])
                assert torch.allclose(logits[2][b, r], module.lm_head(module.norm(d3[-1])), atol=1e-5), (b, r)


@torch.no_grad()
def test_ttt_steps_pass_the_cache_by_the_installed_transformers_name():
    """transformers 5.24 renamed the layers' past_key_values= to cache= and drops the old name in 5.40: no deprecated call."""
    module, _ = tiny_eagle(layers=2)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        warnings.simplefilter("error", DeprecationWarning)
        steps = module.ttt_hidden(torch.randn(B, T - 1, 2 * H), torch.randn(B, T - 1, H), steps=2)
    assert len(steps) == 2


def test_ttt_one_step_is_the_depth_1_pass_and_loss_counts_per_step():
    module, base_head = tiny_eagle(layers=1)
    aux, embeds = torch.randn(B, T - 1, 2 * H), torch.randn(B, T - 1, H)
    base_hidden = torch.randn(B, T, H)
    mask = torch.ones(B, T, dtype=torch.bool)
    mask[1, :3] = False
    (one,) = module.ttt_hidden(aux, embeds, None, steps=1)
    assert torch.equal(one, module.hidden(aux, embeds))
    steps = module.ttt_hidden(aux, embeds, None, steps=3)
    assert torch.equal(steps[0], one)  # later steps do not change step 1
    for j, hidden in enumerate(steps, start=1):
        _, (_, counted) = eagle_loss(module, hidden, base_hidden, base_head, mask, step=j)
        # rows r >= j-1 with token r+2 counted: sequence 0 has rows 0..T-3, sequence 1 rows 1..T-3 (tokens 3.. count)
        assert counted == sum(1 for b in range(B) for r in range(j - 1, T - 2) if mask[b, r + 2])
