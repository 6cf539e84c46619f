"""An EAGLE-3 module: a small Llama-style decoder over [next token's embedding, fused target hidden states].

At position t it reads the base's hidden states at t from several layers
(``aux_layer_ids``: low, middle, high, as EAGLE-3 and ModelOpt do), fused by
``fc``, and the embedding of token t+1, and predicts token t+2: the token after
the one the base model is about to emit. Layer 0 attends over the concatenation
``[input_layernorm(embedding), hidden_norm(fused)]`` (2*hidden wide q/k/v), its
residual stream is the fused hidden state; later layers are plain Llama layers.
The LM head is the base model's, frozen (ModelOpt's default ``has_lm_head=False``;
its exporter writes a copy as ``lm_head.weight``, and so do we).

Drafting feeds the module its own pre-norm output ``h`` in place of fc(aux) for
positions the target has not seen (runtime/proposers/eagle.py). Training-time test
(EAGLE-3's TTT; ModelOpt's ``eagle_ttt_steps``) trains that too: step 1 is the pass
above; step j >= 2 at row r reads ``h_{j-1}[r-1]`` (the previous step's estimate of
the features at r) with the embedding of token r+1, at rotary position r, and
predicts token r+2 like step 1. Its mask (``ttt_mask``) is what drafting depth j
sees: step-1 rows 0..r-j+1 (real features) and, for each i = 2..j, the step-i row
at r-j+i (its own chain). Steps run one after another, reusing earlier steps' keys
and values (``_StepCache``).

Module names are ModelOpt's EagleModule's, so ``state_dict()`` is the exported layout.
"""

from __future__ import annotations

import inspect

import torch
import torch.nn.functional as F
from torch import nn
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaAttention, LlamaDecoderLayer, LlamaRMSNorm, LlamaRotaryEmbedding


def _cache_keyword(forward) -> str:
    """transformers renamed the layers' cache argument past_key_values -> cache (5.24 warns; 5.40 drops the old name)."""
    return "cache" if "cache" in inspect.signature(forward).parameters else "past_key_values"


ATTENTION_CACHE = _cache_keyword(LlamaAttention.forward)
LAYER_CACHE = _cache_keyword(LlamaDecoderLayer.forward)


def eagle_llama_config(base_config, num_layers: int) -> LlamaConfig:
    """The EAGLE decoder's config: the base model's widths and rope, ``num_layers`` layers."""
    hidden, heads = base_config.hidden_size, base_config.num_attention_heads
    cfg = LlamaConfig(
        vocab_size=base_config.vocab_size,
        hidden_size=hidden,
        intermediate_size=base_config.intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=heads,
        num_key_value_heads=getattr(base_config, "num_key_value_heads", None) or heads,
        head_dim=getattr(base_config, "head_dim", None) or hidden // heads,
        hidden_act=getattr(base_config, "hidden_act", "silu"),
        max_position_embeddings=base_config.max_position_embeddings,
        rms_norm_eps=getattr(base_config, "rms_norm_eps", 1e-6),
        rope_parameters=getattr(base_config, "rope_parameters", None),
        attention_bias=False,
        mlp_bias=False,
    )
    cfg._attn_implementation = "eager"  # explicit additive masks; sequences are short
    return cfg


class Eagle3Module(nn.Module):
    def __init__(self, config: LlamaConfig, num_aux: int, base_lm_head: torch.Tensor):
        super().__init__()
        hidden = config.hidden_size
        self.config = config
        self.fc = nn.Linear(num_aux * hidden, hidden, bias=False)
        self.layers = nn.ModuleList(LlamaDecoderLayer(config, i) for i in range(config.num_hidden_layers))
        attn = self.layers[0].self_attn
        for name in ("q_proj", "k_proj", "v_proj"):  # layer 0 reads [embedding, fused hidden]: twice as wide
            old = getattr(attn, name)
            setattr(attn, name, nn.Linear(2 * hidden, old.out_features, bias=False))
        self.layers[0].hidden_norm = LlamaRMSNorm(hidden, eps=config.rms_norm_eps)
        self.norm = LlamaRMSNorm(hidden, eps=config.rms_norm_eps)
        self.lm_head = nn.Linear(hidden, base_lm_head.shape[0], bias=False)
        with torch.no_grad():
            self.lm_head.weight.copy_(base_lm_head)
        self.lm_head.weight.requires_grad_(False)  # the base's head, frozen
        self.rotary_emb = LlamaRotaryEmbedding(config=config)  # buffers only, not saved

    def trainable_parameters(self) -> list[nn.Parameter]:
        return [p for p in self.parameters() if p.requires_grad]

    def forward(self, aux_hidden: torch.Tensor, next_embeds: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """logits: [batch, seq, vocab]."""
        return self.lm_head(self.hidden(aux_hidden, next_embeds, attention_mask))

    def hidden(self, aux_hidden: torch.Tensor, next_embeds: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        # aux_hidden: [batch, seq, num_aux * hidden]; next_embeds: [batch, seq, hidden] (embedding of token t+1)
        # attention_mask: [batch, seq] (1 = real token), None = all real -> [batch, seq, hidden], after the final norm
        return self.ttt_hidden(aux_hidden, next_embeds, attention_mask, steps=1)[0]

    def ttt_hidden(self, aux_hidden: torch.Tensor, next_embeds: torch.Tensor, attention_mask: torch.Tensor | None = None,
                   steps: int = 1) -> list[torch.Tensor]:
        """Training-time test: ``steps`` drafting steps, each on the previous one's pre-norm outputs.

        aux_hidden: [batch, seq, num_aux * hidden]; next_embeds: [batch, seq, hidden]; attention_mask: [batch, seq].
        Returns one [batch, seq, hidden] per step (after the final norm); step j's rows r < j-1 have no input
        (their chain would start before position 0) and are garbage: ``eagle_loss(..., step=j)`` skips them.
        """
        b, t, _ = next_embeds.shape
        valid = attention_mask.bool() if attention_mask is not None else torch.ones(b, t, dtype=torch.bool)
        h_in = self.fc(aux_hidden)
        positions = torch.arange(t, device=h_in.device).unsqueeze(0).expand(b, t)
        rope = self.rotary_emb(h_in, positions)  # every step's row r sits at rotary position r, as drafting places it
        cache = _StepCache() if steps > 1 else None
        out = []
        for j in range(1, steps + 1):
            h = self.step(h_in, next_embeds, rope, ttt_mask(valid, j, h_in.dtype), cache)  # [batch, seq, hidden], pre-norm
            out.append(self.norm(h))
            h_in = torch.cat([h.new_zeros(b, 1, h.shape[-1]), h[:, :-1]], dim=1)  # row r reads h_j[r-1]
        return out

    def step(self, h: torch.Tensor, next_embeds: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], mask: torch.Tensor,
             cache: _StepCache | None = None) -> torch.Tensor:
        """One pass of the decoder: h [batch, seq, hidden] (fused features or a previous step's output), next_embeds
        [batch, seq, hidden], mask [batch, 1, seq, keys] over the cache's rows then these -> pre-norm [batch, seq, hidden]."""
        first = self.layers[0]
        x = torch.cat([first.input_layernorm(next_embeds), first.hidden_norm(h)], dim=-1)
        attn_out, _ = first.self_attn(hidden_states=x, position_embeddings=rope, attention_mask=mask, **{ATTENTION_CACHE: cache})
        h = h + attn_out
        h = h + first.mlp(first.post_attention_layernorm(h))
        for layer in self.layers[1:]:
            h = layer(h, attention_mask=mask, position_embeddings=rope, **{LAYER_CACHE: cache})
        return h


class _StepCache:
    """Keys and values of the TTT steps run so far, per layer (duck-types transformers' Cache.update): step j's
    queries see steps 1..j's rows, and ``ttt_mask`` picks which. Kept in the autograd graph, so later steps'
    losses train earlier steps' projections too."""

    def __init__(self) -> None:
        self.kv: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def update(self, key: torch.Tensor, value: torch.Tensor, layer_idx: int, *args, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
        # key, value: [batch, kv_heads, seq, head_dim] -> all steps' so far, [batch, kv_heads, steps*seq, head_dim]
        if layer_idx in self.kv:
            k, v = self.kv[layer_idx]
            key, value = torch.cat([k, key], dim=2), torch.cat([v, value], dim=2)
        self.kv[layer_idx] = (key, value)
        return key, value


def ttt_mask(attention_mask: torch.Tensor, step: int, dtype: torch.dtype) -> torch.Tensor:
    """[batch, seq] validity -> additive [batch, 1, seq, step*seq]: step ``step``'s row r over steps 1..step's rows.

    What drafting depth ``step`` sees (runtime/proposers/eagle.py): the real pairs up to r-step+1 (step-1 rows, causal)
    and, for i = 2..step, the step-i row at r-step+i; padded keys masked. Step 1 is the causal mask.
    """
    b, t = attention_mask.shape
    r = torch.arange(t).unsqueeze(1)  # query rows
    p = torch.arange(t).unsqueeze(0)  # key positions within a step
    blocks = [p <= r - step + 1] + [p == r - step + i for i in range(2, step + 1)]  # each [seq, seq]
    allowed = torch.cat(blocks, dim=1).unsqueeze(0) & attention_mask.bool().repeat(1, step).unsqueeze(1)
    return torch.zeros(b, 1, t, step * t, dtype=dtype).masked_fill(~allowed.unsqueeze(1), torch.finfo(dtype).min)


def eagle_inputs(input_ids: torch.Tensor, aux_hidden: torch.Tensor, embed: nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    """Position t pairs the base's hidden states at t with the embedding of token t+1 (the last position has none).

    Returns aux [batch, seq-1, num_aux*hidden] and next_embeds [batch, seq-1, hidden].
    """
    return aux_hidden[:, :-1], embed(input_ids[:, 1:])


def eagle_valid(loss_mask: torch.Tensor) -> torch.Tensor:
    """[batch, seq] token mask -> [batch, seq-1]: position t counts when token t+2 exists and counts."""
    valid = torch.zeros_like(loss_mask[:, 1:], dtype=torch.bool)
    valid[:, :-1] = loss_mask[:, 2:].bool()
    return valid


@torch.no_grad()
def eagle_targets(base_hidden: torch.Tensor, base_lm_head: nn.Module, loss_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(valid [batch, seq-1], the base's log-probabilities [counted, vocab] on the valid rows, row-major): every TTT
    step is distilled against these, so the base's LM head runs once per batch, not once per step."""
    valid = eagle_valid(loss_mask)
    return valid, F.log_softmax(base_lm_head(base_hidden[:, 1:][valid]).float(), dim=-1)


def eagle_loss(module: Eagle3Module, hidden: torch.Tensor, base_hidden: torch.Tensor, base_lm_head: nn.Module,
               loss_mask: torch.Tensor, step: int = 1, targets: tuple[torch.Tensor, torch.Tensor] | None = None) -> tuple[torch.Tensor,
                                                                                                                          tuple[int, int]]:
    """Self-logit distillation (ModelOpt's eagle_self_logit_distillation): cross-entropy against the base's own
    distribution, and (EAGLE's top-1 equals the base's, counted): what greedy verification accepts at depth 1.

    hidden: [batch, seq-1, hidden] from ``module.hidden`` (EAGLE at t predicts token t+2); base_hidden:
    [batch, seq, hidden], the base's last hidden state (at t+1 it predicts token t+2); loss_mask: [batch, seq].
    The base's entropy is subtracted (a constant: same gradient), so the value is KL(base || EAGLE): 0 when the
    draft's distribution equals the base's, whatever the base's uncertainty. Both LM heads run on the counted
    positions only. ``step`` j (TTT, ``Eagle3Module.ttt_hidden``): rows r < j-1 have no chain and are not counted;
    the target is the same (row r predicts token r+2), so the hits are top-1 at drafting depth j.
    ``targets``: ``eagle_targets(base_hidden, base_lm_head, loss_mask)``, computed once for all steps (None: here).
    """
    all_valid, all_logp = targets if targets is not None else eagle_targets(base_hidden, base_lm_head, loss_mask)
    counted = all_valid.nonzero()[:, 1] >= step - 1  # [all counted]: the rows this step has a chain for
    valid = all_valid.clone()
    valid[:, : step - 1] = False
    if not bool(valid.any()):
        return hidden.new_zeros(()) * hidden.sum(), (0, 0)
    target_logp = all_logp[counted]  # [counted, vocab]: the same row-major order as hidden[valid]
    logits = module.lm_head(hidden[valid])  # [counted, vocab]
    kl = (target_logp.exp() * (target_logp - F.log_softmax(logits.float(), dim=-1))).sum(-1).mean()
    same = logits.detach().argmax(-1) == target_logp.argmax(-1)
    return kl, (int(same.sum()), int(same.numel()))
