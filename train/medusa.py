"""Medusa heads: extra LM heads on the base model's last hidden state, each guessing one token further ahead.

Module names follow ModelOpt's HFMedusaModel (see layout.py), so ``state_dict()``
is already the exported layout: ``medusa_heads.{i}.{j}.linear.{weight,bias}`` and
``medusa_heads.{i}.{num_layers}.weight``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

# ModelOpt's HFMedusaModel.forward defaults: head i's loss is weighted 0.2 * 0.8**i.
HEADS_COEFFICIENT = 0.2
DECAY_COEFFICIENT = 0.8


class ResBlock(nn.Module):
    """x + SiLU(linear(x)); zero-initialised weight, so a fresh block is the identity (as Medusa and ModelOpt do)."""

    def __init__(self, hidden_size: int):
        super().__init__()
        self.linear = nn.Linear(hidden_size, hidden_size)
        nn.init.zeros_(self.linear.weight)
        self.act = nn.SiLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.act(self.linear(x))


class MedusaHeads(nn.Module):
    def __init__(self, hidden_size: int, vocab_size: int, num_heads: int, num_layers: int, base_lm_head: torch.Tensor | None = None):
        super().__init__()
        self.num_heads, self.num_layers = num_heads, num_layers
        self.medusa_heads = nn.ModuleList(
            nn.Sequential(*[ResBlock(hidden_size) for _ in range(num_layers)], nn.Linear(hidden_size, vocab_size, bias=False))
            for _ in range(num_heads)
        )
        if base_lm_head is not None:
            # Medusa starts every head from a copy of the base LM head: with identity ResBlocks a fresh
            # head already predicts something sensible (the next token), which trains far faster than random.
            with torch.no_grad():
                for head in self.medusa_heads:
                    head[-1].weight.copy_(base_lm_head)

    def forward(self, last_hidden: torch.Tensor) -> torch.Tensor:
        # last_hidden: [batch, seq, hidden] (after the base's final norm) -> logits: [heads, batch, seq, vocab]
        return torch.stack([head(last_hidden) for head in self.medusa_heads])


def medusa_loss(heads: MedusaHeads, last_hidden: torch.Tensor, input_ids: torch.Tensor, loss_mask: torch.Tensor,
                heads_coefficient: float = HEADS_COEFFICIENT, decay: float = DECAY_COEFFICIENT) -> tuple[torch.Tensor, list[tuple[int, int]]]:
    """ModelOpt's Medusa loss, sum over heads of CE_i * heads_coefficient * decay**i, and (correct top-1, counted) per head.

    Head i at position t predicts token t + 2 + i (the base itself predicts t + 1); only positions whose target
    token counts (``loss_mask``) go through the head, so the [positions, vocab] logits stay as small as they can.
    last_hidden: [batch, seq, hidden]; input_ids, loss_mask: [batch, seq].
    """
    total, hits = last_hidden.new_zeros(()), []
    seq = input_ids.shape[1]
    for i, head in enumerate(heads.medusa_heads):
        shift = 2 + i
        valid = loss_mask[:, shift:].bool()  # [batch, seq - shift]
        if not bool(valid.any()):
            hits.append((0, 0))
            continue
        logits = head(last_hidden[:, : seq - shift][valid])  # [counted, vocab]
        labels = input_ids[:, shift:][valid]
        total = total + F.cross_entropy(logits, labels) * heads_coefficient * decay**i
        hits.append((int((logits.detach().argmax(-1) == labels).sum()), int(labels.numel())))
    return total, hits
