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


def medusa_targets(input_ids: torch.Tensor, loss_mask: torch.Tensor, head: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Head ``head`` at position t predicts token t + 2 + head (the base itself predicts t + 1).

    Returns labels and a validity mask, both [batch, seq - 2 - head] for positions 0 .. seq - 3 - head.
    """
    shift = 2 + head
    return input_ids[:, shift:], loss_mask[:, shift:]


def medusa_loss(logits: torch.Tensor, input_ids: torch.Tensor, loss_mask: torch.Tensor,
                heads_coefficient: float = HEADS_COEFFICIENT, decay: float = DECAY_COEFFICIENT) -> tuple[torch.Tensor, list[float]]:
    """ModelOpt's Medusa loss: sum over heads of CE_i * heads_coefficient * decay**i; also each head's plain CE."""
    # logits: [heads, batch, seq, vocab]; input_ids, loss_mask: [batch, seq]
    total, per_head = logits.new_zeros(()), []
    seq = input_ids.shape[1]
    for i in range(logits.shape[0]):
        shift = 2 + i
        if seq <= shift:
            per_head.append(float("nan"))
            continue
        labels, valid = medusa_targets(input_ids, loss_mask, i)
        lg = logits[i, :, : seq - shift]
        ce = F.cross_entropy(lg.reshape(-1, lg.shape[-1]), labels.reshape(-1), reduction="none")
        weight = valid.reshape(-1).float()
        ce_i = (ce * weight).sum() / weight.sum().clamp(min=1)
        per_head.append(ce_i.item())
        total = total + ce_i * heads_coefficient * decay**i
    return total, per_head


@torch.no_grad()
def medusa_hits(logits: torch.Tensor, input_ids: torch.Tensor, loss_mask: torch.Tensor) -> list[tuple[int, int]]:
    """(correct top-1, counted) per head, on the positions the loss counts."""
    out, seq = [], input_ids.shape[1]
    for i in range(logits.shape[0]):
        shift = 2 + i
        if seq <= shift:
            out.append((0, 0))
            continue
        labels, valid = medusa_targets(input_ids, loss_mask, i)
        pred = logits[i, :, : seq - shift].argmax(-1)
        out.append((int(((pred == labels) & valid).sum()), int(valid.sum())))
    return out
