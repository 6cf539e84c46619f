"""The forward, written once in plain torch: prefill, one-token decode, chain and tree verification are the same code.

gpt-fast's shape: a static KV cache written in place (rope_append writes each call's keys and values at their
positions), attention that reads each row's own length, no Python branch on the step's kind. Every shape-changing
value is a device tensor, so on a GPU a whole step is one CUDA graph (graphs.py).

    StepInputs    what one call feeds (ids, positions, where each row writes, which rows give logits, ...)
    Forward       weights + ops -> {"logits": [B, L, vocab] float32, and the engine's extra outputs}

The network is the ONNX engines' (builder/network.py): embedding, decoder layers (residual add fused with the next
RMSNorm, joined q|k|v and gate|up), final norm on the rows asked for, lm_head; a Medusa target's heads on those rows;
an EAGLE-3 target's fc over its aux layers' outputs for every fed token; an EAGLE-3 module's layer 0 over
[norm(embedding), hidden_norm(hidden_states)] with hidden_states as its residual stream, and its pre-norm rows; a
P-EAGLE module's placeholder rows first (ids past the vocabulary: builder/eagle.py's _placeholders), and no pre-norm rows.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from ....formats.engine_format import BuildConfig, ModelConfig
from .ops import ReferenceOps
from .weights import Weights


def tree_path(tree: np.ndarray) -> np.ndarray:
    """A call's tree mask [n, width, width] -> StepInputs.path on the host (kernels/attention.py: tree_path)."""
    return np.argsort(~tree, axis=-1, kind="stable").astype(np.int32)


@dataclass
class StepInputs:
    """One call on B cache rows of S tokens each (device tensors)."""

    ids: torch.Tensor  # [B, S] int64
    positions: torch.Tensor  # [B, S] int64: each token's rotary position (cache length + j; + depth for a tree node)
    start: torch.Tensor  # [B] int64: the row's cache length before the call: token j is written at start + j
    slots: torch.Tensor  # [B] int64: the cache row each batch row reads and writes
    logits_index: torch.Tensor  # [B, L] int64: the tokens whose logits (and per-row extras) come back
    tree: torch.Tensor | None = None  # [B, S, S] bool: token j sees call token j' where tree[b, j, j'] (None: causal)
    path: torch.Tensor | None = None  # [B, S, S] int32, with a tree: row j's ancestors' call indices by depth (kernels/attention.py)
    extra: dict[str, torch.Tensor] = field(default_factory=dict)  # the engine's extra inputs [B, S, *tail], compute dtype: hidden_states
    live: int | None = None  # a host bound >= max(start) + S, for ops that read it (ReferenceOps); None inside CUDA graphs


class Forward:
    """The model of one engine over one device's weights; ``__call__`` runs a step into a KV cache."""

    def __init__(self, weights: Weights, model: ModelConfig, build: BuildConfig, ops: ReferenceOps):
        self.w, self.m, self.ops = weights, model, ops
        mode = build.speculative_decoding_mode
        self.eagle_module = mode in ("eagle_module", "peagle_module")  # layer 0 over [embedding, hidden_states]
        self.hidden_out = mode == "eagle_module"  # a P-EAGLE module feeds nothing back
        self.aux_layers = set(build.eagle_aux_layer_ids) if mode in ("eagle", "peagle") else set()
        self.scale = model.head_dim ** -0.5
        self.splits = [model.num_heads * model.head_dim, model.num_kv_heads * model.head_dim, model.num_kv_heads * model.head_dim]

    def __call__(self, step: StepInputs, kv: torch.Tensor) -> dict[str, torch.Tensor]:
        """kv [layers, 2 (K, V), slots, kv_heads, capacity, head_dim], written in place. Returns float32 outputs by name."""
        w, m, ops = self.w, self.m, self.ops
        B, S = step.ids.shape
        ids, h_in = step.ids, step.extra.get("hidden_states")
        if w.placeholders is not None:
            ids, h_in = self._placeholders(ids, h_in)
        x = w.embed[ids.reshape(-1)]  # [T, hidden]
        delta = None  # the last block's output, added to the residual stream by the next norm
        aux = []  # an EAGLE-3 target's aux layers' outputs, [T, hidden] each
        for i, layer in enumerate(w.layers):
            if self.eagle_module and i == 0:  # attention over [norm(embedding), hidden_norm(h)]; h is the residual stream
                h_in = h_in.reshape(B * S, -1)
                a_in = torch.cat([ops.rmsnorm(x, layer.input_norm, m.rms_norm_eps), ops.rmsnorm(h_in, layer.hidden_norm, m.rms_norm_eps)], dim=-1)
                x = h_in
            else:
                a_in, x = ops.add_rmsnorm(x, delta, layer.input_norm, m.rms_norm_eps)
                if i - 1 in self.aux_layers:  # layer i - 1's output: the residual this add made (x + delta, rounded once)
                    aux.append(x)
            o = self._attention(layer, a_in, kv[i], step, B, S)
            h, x = ops.add_rmsnorm(x, o, layer.post_norm, m.rms_norm_eps)
            last = i + 1 == len(w.layers)  # the last layer's delta is added by plain torch below, not by a norm
            delta = ops.linear(ops.silu_mul(ops.linear(h, layer.gate_up)), layer.down, into_norm=not last)
        x = x + delta  # [T, hidden]: the residual stream after the last layer
        if len(w.layers) - 1 in self.aux_layers:
            aux.append(x)
        x = x.view(B, S, -1)
        return self._outputs(x, aux, step, B, S)

    def _placeholders(self, ids: torch.Tensor, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """A P-EAGLE module's placeholder rows, as builder/eagle.py's _placeholders: id vocab + d - 1 is depth d's
        placeholder. ids [B, S], hidden [B, S, hidden] -> the ids the embedding reads (every placeholder: row vocab,
        ptd_token_id's embedding) and hidden_states with depth d's vector (the last for deeper rows) added (anchored) or in
        their place (constant). The vectors are float32 and added in float32, as the ONNX module adds them."""
        vocab, vectors = self.m.vocab_size, self.w.placeholders  # vectors: [D + 1, hidden], row 0 zeros
        depth = (ids - (vocab - 1)).clamp(0, vectors.shape[0] - 1)  # [B, S]: 0 for real tokens, min(d, D) for placeholders
        offset = vectors[depth]  # [B, S, hidden] float32
        if self.w.placeholder_form == "anchored":
            hidden = (hidden.float() + offset).to(hidden.dtype)
        else:
            hidden = torch.where((ids >= vocab)[..., None], offset.to(hidden.dtype), hidden)
        return ids.clamp(max=vocab), hidden

    def _attention(self, layer, a_in: torch.Tensor, kv: torch.Tensor, step: StepInputs, B: int, S: int) -> torch.Tensor:
        """o_proj(attention(q, k, v of a_in [T, in])) -> [T, hidden]; k and v land in the cache."""
        m, ops = self.m, self.ops
        q, k, v = ops.linear(a_in, layer.qkv).split(self.splits, dim=-1)  # views of [T, (heads + 2 kv_heads) * head_dim]
        if layer.q_norm is not None:  # Qwen3: RMSNorm over each head, before rotary
            q = ops.rmsnorm(q.reshape(-1, m.head_dim), layer.q_norm, m.rms_norm_eps)
            k = ops.rmsnorm(k.reshape(-1, m.head_dim), layer.k_norm, m.rms_norm_eps)
        q, k, v = (t.reshape(B, S, -1, m.head_dim) for t in (q, k, v))
        q = ops.rope_append(q, k, v, self.w.rope_cos, self.w.rope_sin, step.positions, kv[0], kv[1], step.slots, step.start)
        out = ops.attention(q, kv[0], kv[1], step, self.scale)  # [B, S, heads, head_dim]
        return ops.linear(out.reshape(B * S, -1), layer.o, into_norm=True)  # the delta of the residual add in the next add_rmsnorm

    def _outputs(self, x: torch.Tensor, aux: list[torch.Tensor], step: StepInputs, B: int, S: int) -> dict[str, torch.Tensor]:
        """"logits" and the engine's extra outputs under engine_format.extra_io's names, float32."""
        w, m, ops = self.w, self.m, self.ops
        out: dict[str, torch.Tensor] = {}
        if w.eagle_fc is not None:  # fc(concat(aux layers' outputs)) of every fed token: the EAGLE-3 module's input
            out["eagle_hidden"] = ops.linear(torch.cat(aux, dim=-1), w.eagle_fc, torch.float32).view(B, S, -1)
        L = step.logits_index.shape[1]
        rows = torch.gather(x, 1, step.logits_index[:, :, None].expand(B, L, x.shape[-1]))  # [B, L, hidden]
        if self.hidden_out:
            out["hidden_out"] = rows.float()
        normed = ops.rmsnorm(rows.reshape(B * L, -1), w.norm, m.rms_norm_eps)
        out["logits"] = ops.linear(normed, w.lm_head, torch.float32).view(B, L, -1)
        if w.draft_to_target is not None:  # a draft vocabulary of its own: spread to the target's, -inf where it cannot draft
            padded = torch.nn.functional.pad(out["logits"], (0, 1), value=float("-inf"))  # [B, L, draft vocab + 1]
            out["logits"] = padded.index_select(-1, w.draft_to_target)  # [B, L, vocab]
        if w.medusa:  # head i: ResBlocks h + SiLU(h W^T + b), then its own LM head
            heads = []
            for blocks, head in w.medusa:
                h = normed
                for block in blocks:
                    h = h + torch.nn.functional.silu(ops.linear(h, block))
                heads.append(ops.linear(h, head, torch.float32).view(B, L, -1))
            out["medusa_logits"] = torch.stack(heads, dim=2)  # [B, L, heads, vocab]
        return out
