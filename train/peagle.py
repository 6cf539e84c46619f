"""P-EAGLE (parallel EAGLE): an EAGLE-3 module that drafts a whole block in ONE forward pass.

The module is train/eagle.py's Eagle3Module plus one learned vector, ``mask_hidden`` (in the fused layers' space,
[1, 1, num_aux * hidden], read through ``fc`` as the target's features are). Drafting k tokens after the last real
pair p (the target's features of token p with token p + 1, which predicts token p + 2) appends k - 1 placeholder
rows: placeholder d sits at rotary position p + d, reads ``fc(mask_hidden)`` in place of features and the base's
embedding of ``ptd_token_id`` in place of a token, and predicts token p + d + 2. Each placeholder attends to the real
pairs up to p and to the placeholders before it, never to a drafted token: the k guesses come out of one causal call
(runtime/proposers/peagle.py), and the module knows how far ahead each row is from the placeholders before it.

Training lays the same rows out in one sequence per batch row (vLLM speculators' P-EAGLE, arXiv:2602.01469): the
real pairs 0..T'-1 (depth 0, EAGLE-3's rows), then for each depth d = 1..K-1 placeholder rows (anchor p, depth d).
Anchors are sampled (COD: depth d keeps about max(ratio^d, ratio_min) of the answer's anchors, the memory of K
depths at the cost of about 2.4 at the defaults) with one difference: the sampling is NESTED (depth d's anchors are
a subset of depth d-1's), so that every placeholder row sees exactly the placeholders drafting feeds before it.
The mask (``parallel_mask``) is drafting's: a real row sees the real rows before it; placeholder (p, d) the real
rows up to p and placeholders (p, 1..d). Each row is distilled against the base's distribution for the token it
predicts, as EAGLE's loss does; depth d's mean weighs ``decay^d`` (with a gate, each row also weighs how right its
block's earlier positions were: ``position_gates``). Without gradients (the accuracy report) every
anchor is kept.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers import LlamaConfig

from .eagle import Eagle3Module

MASK_HIDDEN = "mask_hidden"  # the state-dict name vLLM speculators' P-EAGLE uses


class PEagleModule(Eagle3Module):
    """Eagle3Module + ``mask_hidden``. ``mask_embedding`` [hidden] is the base's embedding of ptd_token_id (frozen,
    not saved: the builder reads it from the base, as it reads every token's).

    ``anchored`` False: vLLM's P-EAGLE, one placeholder vector ``mask_hidden`` [1, 1, num_aux * hidden] for every
    placeholder. True (ours): one vector per depth, ``mask_hidden`` [1, placeholders, num_aux * hidden], ADDED to the
    anchor's own features: placeholder d reads fc(aux_p + mask_hidden[d]), so every row of the block starts from the
    context as a Medusa head does, and learns where it stands from its depth's vector (a one-layer module otherwise
    carries the context into a placeholder row through one attention only)."""

    def __init__(self, config: LlamaConfig, num_aux: int, base_lm_head: torch.Tensor, mask_embedding: torch.Tensor,
                 anchored: bool = False, placeholders: int = 1, reads_true_tokens: bool = False, refines: bool = False):
        super().__init__(config, num_aux, base_lm_head)
        self.anchored = anchored
        # A bound, never a drafter: placeholder (p, d) reads token p + d + 1's embedding, the true token, in place of the
        # mask token's, as a k-call drafter reads its drafts (under greedy verification a position counts only after
        # drafts that were the true tokens). What the one call's blindness costs (benchmarks/peagle_replay.py).
        self.reads_true_tokens = reads_true_tokens
        # A drafter that may refine its block: trained on blocks whose placeholders read the mask token (the first call)
        # and blocks whose placeholders read the true tokens (a second call, reading the first call's drafts: where
        # positions 1..d were right, row (p, d) reads exactly what it was trained on), half each (the layout's ``reads``).
        self.refines = refines
        shape = (1, placeholders if anchored else 1, num_aux * config.hidden_size)
        self.mask_hidden = nn.Parameter(torch.zeros(shape) if anchored else torch.randn(shape))  # speculators' init for the shared one
        self.register_buffer("mask_embedding", mask_embedding.detach().clone().reshape(-1), persistent=False)

    def placeholder_hidden(self) -> torch.Tensor:
        """fc(mask_hidden): [placeholders, hidden], each depth's vector in the fused space (one row: the shared one)."""
        return self.fc(self.mask_hidden)[0]

    def placeholder_rows(self, fused: torch.Tensor, layout: ParallelLayout) -> torch.Tensor:
        """What each placeholder row reads in place of features: [batch, M, hidden]. fused: fc(aux) [batch, T', hidden]."""
        ph = self.placeholder_hidden()  # [D, hidden]
        rows = ph[(layout.depths.clamp(min=1) - 1).clamp(max=ph.shape[0] - 1)]  # [batch, M, hidden]: depth d's vector (the last for deeper)
        if self.anchored:
            rows = rows + fused.gather(1, layout.anchors.unsqueeze(-1).expand(-1, -1, fused.shape[-1]))
        return rows

    def parallel_hidden(self, aux_hidden: torch.Tensor, next_embeds: torch.Tensor, layout: ParallelLayout,
                        read_embeds: torch.Tensor | None = None) -> torch.Tensor:
        """Every row of ``layout`` in one pass: [batch, T' + M, hidden] after the final norm.

        aux_hidden: [batch, T', num_aux * hidden] (the base's layers at t); next_embeds: [batch, T', hidden] (token t+1).
        A placeholder row that reads (all of them for the bound, ``layout.reads`` otherwise) reads ``read_embeds``
        [batch, M, hidden] (a refining call: the drafts), by default the true token at its position."""
        b, t, hidden = next_embeds.shape
        m = layout.anchors.shape[1]
        fused = self.fc(aux_hidden)
        h_in = torch.cat([fused, self.placeholder_rows(fused, layout)], dim=1)
        tokens = self.mask_embedding.to(next_embeds.dtype).expand(b, m, hidden)
        reads = layout.used if self.reads_true_tokens else layout.reads  # [batch, M] or None
        if reads is not None:
            if read_embeds is None:  # next_embeds[:, r] is token r + 1's: placeholder (p, d) reads token p + d + 1
                read_embeds = next_embeds.gather(1, (layout.anchors + layout.depths).clamp(max=t - 1).unsqueeze(-1).expand(-1, -1, hidden))
            tokens = torch.where(reads.unsqueeze(-1), read_embeds.to(tokens.dtype), tokens)
        e_in = torch.cat([next_embeds, tokens], dim=1)  # [batch, T' + M, hidden]
        rope = self.rotary_emb(h_in, layout.positions)
        return self.norm(self.step(h_in, e_in, rope, layout.additive_mask(h_in.dtype)))


@dataclass
class ParallelLayout:
    """The rows of one training pass: T' real pairs, then M placeholder slots per batch row (padded)."""

    valid: torch.Tensor  # [batch, T'] real pairs (attention mask)
    anchors: torch.Tensor  # [batch, M] anchor p of each placeholder row
    depths: torch.Tensor  # [batch, M] its depth d >= 1 (0: a padding slot)
    used: torch.Tensor  # [batch, M] bool: a placeholder row, not padding
    reads: torch.Tensor | None = None  # [batch, M] bool: a row reading its token, not the mask token's (PEagleModule.refines)

    @property
    def positions(self) -> torch.Tensor:
        """[batch, T' + M] rotary positions: r for real row r, p + d for placeholder (p, d)."""
        b, t = self.valid.shape
        return torch.cat([torch.arange(t).expand(b, t), self.anchors + self.depths], dim=1)

    @property
    def row_depths(self) -> torch.Tensor:
        """[batch, T' + M]: 0 for real rows."""
        return torch.cat([torch.zeros_like(self.valid, dtype=torch.long), self.depths], dim=1)

    @property
    def references(self) -> torch.Tensor:
        """[batch, T' + M]: the base position whose next-token distribution a row learns (r + 1; p + d + 1)."""
        return self.positions + 1

    def additive_mask(self, dtype: torch.dtype) -> torch.Tensor:
        return torch.zeros(self.allowed.shape, dtype=dtype).masked_fill(~self.allowed, torch.finfo(dtype).min).unsqueeze(1)

    @property
    def allowed(self) -> torch.Tensor:
        """[batch, T' + M, T' + M] bool: what drafting lets each row see (the module docstring)."""
        b, t = self.valid.shape
        m = self.anchors.shape[1]
        r = torch.arange(t)
        real_real = (r.view(1, t, 1) >= r.view(1, 1, t)) & self.valid.unsqueeze(1)  # causal over real pairs
        ph_real = (self.anchors.unsqueeze(2) >= r.view(1, 1, t)) & self.valid.unsqueeze(1) & self.used.unsqueeze(2)
        same = (self.anchors.unsqueeze(2) == self.anchors.unsqueeze(1)) & (self.depths.unsqueeze(2) >= self.depths.unsqueeze(1))
        ph_ph = same & self.used.unsqueeze(1) & self.used.unsqueeze(2)
        ph_ph |= torch.eye(m, dtype=torch.bool).unsqueeze(0) & ~self.used.unsqueeze(2)  # a padding slot sees itself only
        top = torch.cat([real_real, torch.zeros(b, t, m, dtype=torch.bool)], dim=2)
        return torch.cat([top, torch.cat([ph_real, ph_ph], dim=2)], dim=1)


def parallel_layout(valid: torch.Tensor, loss_mask: torch.Tensor, depths: int, ratio: float, ratio_min: float,
                    generator: torch.Generator | None) -> ParallelLayout:
    """Placeholder rows for depths 1..depths-1 of every batch row.

    valid: [batch, T'] real pairs; loss_mask: [batch, T' + 1] tokens that count. Placeholder (p, d) predicts token
    p + d + 2; anchors whose depth-d token does not count are left out. ``generator`` None keeps every anchor (the
    accuracy report); otherwise depth d keeps max(ratio^d, ratio_min) x the depth-1 candidates, drawn from depth
    d-1's anchors (nested)."""
    b, t = valid.shape
    rows: list[tuple[list[int], list[int]]] = []
    for i in range(b):
        anchors_i, depths_i = [], []
        kept = torch.arange(t)[valid[i]]
        first = None
        for d in range(1, depths):
            if not len(kept):  # deeper placeholders would predict past the sequence's end
                break
            target = kept + d + 2  # the token placeholder (p, d) predicts
            ok = target < loss_mask.shape[1]
            kept = kept[ok]
            kept = kept[loss_mask[i, target[ok]].bool()]
            if first is None:
                first = len(kept)
            if generator is not None and len(kept):
                keep = min(len(kept), max(1, int(first * max(ratio**d, ratio_min))))
                kept = kept[torch.randperm(len(kept), generator=generator)[:keep].sort().values]
            anchors_i += kept.tolist()
            depths_i += [d] * len(kept)
        rows.append((anchors_i, depths_i))
    m = max(1, max(len(a) for a, _ in rows))
    anchors = torch.zeros(b, m, dtype=torch.long)
    depth_t = torch.zeros(b, m, dtype=torch.long)
    used = torch.zeros(b, m, dtype=torch.bool)
    for i, (a, d) in enumerate(rows):
        anchors[i, : len(a)] = torch.tensor(a, dtype=torch.long)
        depth_t[i, : len(d)] = torch.tensor(d, dtype=torch.long)
        used[i, : len(a)] = True
    return ParallelLayout(valid.bool(), anchors, depth_t, used)


def batch_generator(ids: torch.Tensor, seed: int) -> torch.Generator:
    """A generator that is a function of the batch (itself a function of (seed, step)): a resumed run draws the
    same anchors as an uninterrupted one without carrying an RNG state in the checkpoint."""
    weights = torch.arange(ids.numel()).view_as(ids) % 9973 + 1
    return torch.Generator().manual_seed((seed * 1_000_003 + int((ids * weights).sum())) % (2**62))


def reading_blocks(layout: ParallelLayout, generator: torch.Generator) -> torch.Tensor:
    """[batch, M] bool: the placeholder rows of the blocks that read their tokens, half the anchors drawn (a whole
    block reads, or none of it: a refining call reads every draft of the first)."""
    b, t = layout.valid.shape
    coin = torch.rand(b, t, generator=generator) < 0.5  # [batch, anchor]
    return coin.gather(1, layout.anchors) & layout.used


GATES = ("none", "greedy", "soft")


def position_gates(layout: ParallelLayout, counted: torch.Tensor, right: torch.Tensor, depths: int) -> torch.Tensor:
    """[counted]: for each counted row, the product of how right the positions before it in its block were (1 for a
    real row). right: [counted] in [0, 1]; a position that is not counted (its token is the prompt's) counts as right.

    A placeholder (p, d) adds to the tokens a round accepts only when positions 1..d of its block were right, so
    its loss is worth that much: weighing it so makes it learn token p + d + 2 GIVEN its own earlier guesses, which is
    what drafting needs, instead of its average over every token p + 2 .. p + d + 1 could be."""
    b, t = layout.valid.shape
    depths = max(depths, int(layout.depths.max()) + 1)  # a layout deeper than the loss reads still indexes
    grid = right.new_ones(b, t, depths)  # [batch, anchor, depth]: how right the block's row at that depth was
    anchors = torch.cat([torch.arange(t).expand(b, t), layout.anchors], dim=1)  # [batch, T' + M]
    row_depths = layout.row_depths
    batch_index = torch.arange(b).unsqueeze(1).expand_as(anchors)
    grid[batch_index[counted], anchors[counted], row_depths[counted]] = right
    before = torch.cumprod(torch.cat([grid.new_ones(b, t, 1), grid[..., :-1]], dim=-1), dim=-1)  # exclusive product
    return before[batch_index[counted], anchors[counted], row_depths[counted]]


def peagle_loss(module: PEagleModule, hidden: torch.Tensor, layout: ParallelLayout, base_hidden: torch.Tensor,
                base_lm_head: nn.Module, loss_mask: torch.Tensor, depths: int, decay: float,
                gate: str = "none") -> tuple[torch.Tensor, list[tuple[int, int]]]:
    """KL(base || module) per drafting position 1..depths (position j = depth j - 1), weighted decay^(j-1), and
    (module's top-1 = base's, counted) per position. ``gate`` "greedy" / "soft": each row's KL weighs
    ``position_gates`` (whether / how likely the block's earlier positions were the base's top-1), each position's
    weighted sum divided by its rows.

    hidden: [batch, T' + M, hidden] (``PEagleModule.parallel_hidden``); base_hidden: [batch, T, hidden], the base's
    last hidden state; loss_mask: [batch, T]."""
    refs = layout.references  # [batch, R]
    limit = loss_mask.shape[1]
    rows_ok = torch.cat([layout.valid, layout.used], dim=1) & (refs + 1 < limit)
    counted = rows_ok & loss_mask.bool().gather(1, (refs + 1).clamp(max=limit - 1))
    row_depth = layout.row_depths[counted]  # [counted]
    with torch.no_grad():
        index = refs.clamp(max=limit - 1).unsqueeze(-1).expand(-1, -1, base_hidden.shape[-1])
        target_logp = F.log_softmax(base_lm_head(base_hidden.gather(1, index)[counted]).float(), -1)
    logp = F.log_softmax(module.lm_head(hidden[counted]).float(), dim=-1)  # [counted, vocab]
    kl = (target_logp.exp() * (target_logp - logp)).sum(-1)  # [counted]
    top = target_logp.argmax(-1)  # [counted]
    same = logp.detach().argmax(-1) == top
    if gate not in GATES:
        raise ValueError(f"gate {gate!r} is not one of {GATES}")
    weights = None
    if gate != "none":  # detached: the loss must not fall by making the earlier positions less right
        right = same.float() if gate == "greedy" else logp.detach().gather(1, top.unsqueeze(1)).squeeze(1).exp()
        weights = position_gates(layout, counted, right, depths)  # [counted]
    total, weight, hits = hidden.new_zeros(()), 0.0, []
    for d in range(depths):
        at = row_depth == d
        n = int(at.sum())
        hits.append((int(same[at].sum()), n))
        if n:
            total = total + (kl[at].mean() if weights is None else (kl[at] * weights[at]).sum() / n) * decay**d
            weight += decay**d
    if weight == 0:
        return hidden.new_zeros(()) * hidden.sum(), hits
    return total / weight, hits
