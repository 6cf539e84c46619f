"""The losses say what the docs say: Medusa head i at t is scored on token t+2+i, EAGLE at t on the base's
distribution for token t+2; written here as plain loops over positions on full logits."""

import math

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
