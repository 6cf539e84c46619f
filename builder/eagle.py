"""The EAGLE-3 module as an engine of its own: the ``eagle/`` folder of a --speculative_decoding_mode eagle target.

The target computes the module's input, ``eagle_hidden = fc(concat(outputs of layers eagle_aux_layer_ids))``
(builder/network.py); this network is the rest of train/eagle.py's Eagle3Module, with ``hidden_states`` in place
of ``fc(aux_hidden)``:

Inputs
  input_ids      [batch, num_tokens]          int64    token t+1 of each row (its embedding: the BASE's embed_tokens)
  position_ids   [batch, num_tokens]          int64    position (= cache slot) of each row
  logits_index   [batch, num_logits]          int64    which rows get logits and hidden_out
  hidden_states  [batch, num_tokens, hidden]  float32  the target's eagle_hidden at t (or the previous step's hidden_out)
  tree_mask      [batch, num_tokens, num_tokens] bool  (the lowering's prelude, plugins/attention.py)
  past_key.i / past_value.i  the module's KV cache (i < eagle_num_layers), the target's conventions
Outputs
  logits         [batch, num_logits, vocab]   float32  lm_head(norm(h)): the guess for token t+2
  hidden_out     [batch, num_logits, hidden]  float32  h before the final norm (EAGLE-3 feeds it back as hidden_states)
  present_key.i / present_value.i

Layer 0 attends over ``[input_layernorm(embedding), hidden_norm(h)]`` (2*hidden wide q/k/v) with h as its residual
stream; layers 1.. are plain Llama layers. network.py's layer code builds them, reading the module's tensors under
the base's names (``layers.i.*`` -> ``model.layers.i.*``).

A P-EAGLE module (a ``--speculative_decoding_mode peagle`` target's eagle/ folder, mode peagle_module; train/peagle.py)
is the same network with placeholders and without ``hidden_out`` or ``tree_mask`` (it drafts a block in one causal
call and feeds nothing back): a token id ``vocab_size + d - 1`` (past the vocabulary) marks the placeholder of depth
d, which reads the base's embedding of ``ptd_token_id`` (an extra row of the module's embedding table) and depth d's
vector fc(mask_hidden[d]), constants computed at build time: added to its ``hidden_states`` row (the anchor's
features, anchored placeholders) or in place of it (vLLM's constant placeholder); ``_placeholders``.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
from onnx import TensorProto

from ..formats.engine_format import MODULE_MODES, BuildConfig, ModelConfig
from ..formats.errors import CheckpointError
from ..plugins.attention import Shared
from .checkpoint import Checkpoint
from .graph import GraphBuilder
from .network import _attention_block, _decoder_layer, _Linears, _mlp_block, _rms_norm, finish_model, float32_output, new_lowering
from .rope import cos_sin_tables
from .weight_only import WeightOnlyScheme

ARCHITECTURE = "Eagle3"  # the module engine's ModelConfig.architecture


class ModuleWeights:
    """An EAGLE-3 module's float32 tensors (formats.heads.HeadCheckpoint) read through Checkpoint's interface,
    ``layers.i.*`` as ``model.layers.i.*``, so network.py's layer code reads them as it reads a base model's."""

    def __init__(self, heads):
        self.path = heads.path
        self._tensors = {("model." + n if n.startswith("layers.") else n): t for n, t in heads.tensors.items()}

    def __contains__(self, name: str) -> bool:
        return name in self._tensors

    def _get(self, name: str) -> np.ndarray:
        if name not in self._tensors:
            raise CheckpointError(f"EAGLE module in {self.path} has no tensor {name.removeprefix('model.')!r}.")
        return self._tensors[name]

    def dtype_name(self, name: str) -> str:
        self._get(name)
        return "F32"  # load_heads read every float tensor as float32

    def float32(self, name: str) -> np.ndarray:
        return self._get(name)

    raw = float32


def module_model_config(base: ModelConfig, heads) -> ModelConfig:
    """The module's widths (its config.json), the base's vocabulary and rope (eagle_llama_config copies the base's)."""
    c = heads.config
    num_heads = int(c["num_attention_heads"])
    return replace(
        base,
        architecture=ARCHITECTURE,
        intermediate_size=int(c["intermediate_size"]),
        num_layers=heads.num_layers,
        num_heads=num_heads,
        num_kv_heads=int(c["num_key_value_heads"]),
        head_dim=int(c.get("head_dim") or heads.hidden_size // num_heads),  # load_heads checked them
        rms_norm_eps=float(c.get("rms_norm_eps") or base.rms_norm_eps),
        tie_word_embeddings=False,
        qkv_bias=False,
        qk_norm=False,
    )


def module_build_config(target: BuildConfig, heads) -> BuildConfig:
    """The target's limits, lowering, dtype and backend; EAGLE-3's with tree attention (it drafts a tree a level per
    call), P-EAGLE's without (its one call is causal). The module in float (it is small beside a float target, and it
    decides acceptance), unless the target asks for quantize_draft_heads: then its linear layers take the target's
    weight-only scheme, rounded to nearest (AWQ searched the target's layers only), on the target's CPU kernels, and its
    LM head too with quantize_lm_head."""
    parallel = heads.mode == "peagle"
    scheme = WeightOnlyScheme.of(target) if target.quantize_draft_heads else None
    if scheme is not None:
        precision = {"quantization": f"int{scheme.bits}_wo", "group_size": scheme.group_size, "symmetric": scheme.symmetric,
                     "quantize_lm_head": target.quantize_lm_head, "cpu_kernels": target.cpu_kernels}
    else:  # a float module: ONNX Runtime's ops only, whatever the target's --cpu_kernels (specdec's were not measured on it)
        precision = {"quantization": "none", "group_size": None, "symmetric": True, "quantize_lm_head": False, "cpu_kernels": "ort"}
    return replace(
        target,
        speculative_decoding_mode=MODULE_MODES[heads.mode],
        fp8_activations="none",
        weight_only=None,  # the module's own record: write_eagle_module
        quantize_draft_heads=False,
        medusa_num_heads=0,
        medusa_num_layers=0,
        eagle_num_layers=heads.num_layers,
        eagle_aux_layer_ids=(),
        tree_attention=not parallel,
        **precision,
    )


def _placeholders(gb: GraphBuilder, ids: str, h: str, table: np.ndarray, heads, vocab: int) -> tuple[str, str, np.ndarray]:
    """A P-EAGLE module's placeholder rows: token id vocab + d - 1 stands for depth d (any id >= vocab is one). Its
    embedding is the base's of ptd_token_id (one more row of the table); its hidden_states row gets depth d's vector
    fc(mask_hidden[d]) (the last one for deeper rows): added to what the row was fed, the anchor's features, when the
    placeholders are anchored; in place of it when constant (vLLM's P-EAGLE). Returns (ids, hidden_states, table)."""
    vectors = heads.placeholder_features().astype(np.float32)  # [D, hidden]
    offsets = np.concatenate([np.zeros((1, vectors.shape[1]), np.float32), vectors])  # [D + 1, hidden]: row 0 for real tokens
    table = np.concatenate([table, table[heads.mask_token_id][None]])  # [vocab + 1, hidden]
    first = gb.const("/peagle/placeholder_id", np.array(vocab, np.int64))
    depth = gb.op("Sub", [ids, gb.const("/peagle/depth_base", np.array(vocab - 1, np.int64))], "/peagle/depth_raw")  # d for a placeholder
    depth = gb.op("Clip", [depth, gb.const("/peagle/zero", np.array(0, np.int64)), gb.const("/peagle/last_vector", np.array(len(vectors), np.int64))],
                  "/peagle/depth")  # [B, S]: 0 for real tokens, min(d, D) for placeholders
    offset = gb.op("Gather", [gb.const("/peagle/mask_hidden", offsets), depth], "/peagle/offset")  # [B, S, hidden]
    if heads.placeholder_form == "anchored":
        h = gb.op("Add", [h, offset], "/peagle/hidden_states")
    else:
        is_placeholder = gb.op("Unsqueeze", [gb.op("GreaterOrEqual", [ids, first], "/peagle/is_placeholder"),
                                             gb.const("/peagle/axis_last", np.array([-1], np.int64))], "/peagle/is_placeholder_3d")
        h = gb.op("Where", [is_placeholder, offset, h], "/peagle/hidden_states")
    ids = gb.op("Min", [ids, first], "/peagle/token_ids")  # every placeholder reads table row vocab
    return ids, h, table


def build_eagle_network(base: Checkpoint, heads, cfg: ModelConfig, build: BuildConfig, weight_only_built: dict | None = None):
    """The module engine's ONNX ModelProto (the ABI in this module's docstring).

    base: the base checkpoint (its model.embed_tokens.weight: the module has no embedding of its own).
    cfg / build: module_model_config / module_build_config.
    weight_only_built: filled as build_network fills it (the int8/int4 layers, specdec's ops), for the module's record.
    """
    gb, lowering = new_lowering(build, cfg)  # as the target's
    weights = ModuleWeights(heads)
    linears = _Linears(gb, lowering, weights, build, None, {}, {})
    ids = gb.input("input_ids", TensorProto.INT64, ["batch", "num_tokens"])
    positions = gb.input("position_ids", TensorProto.INT64, ["batch", "num_tokens"])
    logits_index = gb.input("logits_index", TensorProto.INT64, ["batch", "num_logits"])
    h = gb.input("hidden_states", TensorProto.FLOAT, ["batch", "num_tokens", cfg.hidden_size])
    parallel = heads.mode == "peagle"
    table = base.float32("model.embed_tokens.weight")  # [vocab, hidden]
    if parallel:
        ids, h, table = _placeholders(gb, ids, h, table, heads, cfg.vocab_size)
    if gb.compute_type != TensorProto.FLOAT:
        h = gb.op("Cast", [h], "/eagle/hidden_states_compute", to=gb.compute_type)

    cos, sin = cos_sin_tables(cfg, build.kv_capacity)
    shared = lowering.prelude(Shared(positions=positions, cos=gb.const("rope_cos", cos), sin=gb.const("rope_sin", sin), capacity=build.kv_capacity))
    embed = gb.op("Gather", [gb.weight("model.embed_tokens.weight", table), ids], "/model/embed_tokens")  # [B, S, hidden]

    # Layer 0: attention over [input_layernorm(embedding), hidden_norm(h)], h the residual stream.
    p = "/model/layers.0"
    e, _ = lowering.add_norm(f"{p}/input_layernorm", embed, None,
                             gb.weight(f"{p}/input_layernorm.weight", weights.float32("model.layers.0.input_layernorm.weight")))
    hn, _ = lowering.add_norm(f"{p}/hidden_norm", h, None, gb.weight(f"{p}/hidden_norm.weight", weights.float32("model.layers.0.hidden_norm.weight")))
    both = gb.op("Concat", [e, hn], f"{p}/embed_hidden_concat", axis=-1)  # [B, S, 2 * hidden]
    o = _attention_block(gb, lowering, linears, weights, cfg, 0, both, shared, fused=False)
    x, delta = _mlp_block(gb, lowering, linears, weights, cfg, 0, h, o, fused=False)
    for i in range(1, cfg.num_layers):
        x, delta = _decoder_layer(gb, lowering, linears, weights, cfg, i, x, delta, shared, fused=False)
    x = gb.op("Add", [x, delta], "/model/residual")  # [B, S, hidden]: h before the final norm

    rows = gb.op("Unsqueeze", [logits_index, gb.const("/model/axis_last", np.array([-1], np.int64))], "/model/logits_rows")
    x = gb.op("GatherND", [x, rows], "/model/gather_logit_rows", batch_dims=1)  # [B, L, hidden]
    if not parallel:
        float32_output(gb, "Identity", [x], "/eagle/hidden_out", "hidden_out", ["batch", "num_logits", cfg.hidden_size],
                       cast_name="/eagle/hidden_out_float32")

    x = _rms_norm(gb, "/model/norm", x, weights.float32("norm.weight"), cfg.rms_norm_eps)
    columns = heads.target_columns()  # None: lm_head scores the whole vocabulary
    dims = ["batch", "num_logits", cfg.vocab_size]
    if linears.scheme is not None and build.quantize_lm_head:
        logits = linears.int_rtn("lm_head", "/lm_head/matmul", x, weights.float32("lm_head.weight").T, logits_index)  # [B, L, draft vocab]
        if columns is None:
            float32_output(gb, "Identity", [logits], "/lm_head/logits", "logits", dims)
    else:
        lm_head = gb.weight("lm_head.weight", weights.float32("lm_head.weight").T)  # [hidden, draft vocab]
        if columns is None:
            float32_output(gb, "MatMul", [x, lm_head], "/lm_head/matmul", "logits", dims)
        else:
            logits = gb.op("MatMul", [x, lm_head], "/lm_head/matmul")
    if columns is not None:
        _draft_to_target_vocab(gb, logits, columns)
        gb.output("logits", TensorProto.FLOAT, dims)
    return finish_model(gb, lowering, linears, ARCHITECTURE, weight_only_built)


def _draft_to_target_vocab(gb: GraphBuilder, logits: str, columns: np.ndarray) -> None:
    """A module with a draft vocabulary of its own (EAGLE-3's d2t): its logits [B, L, draft vocab] spread to the target's
    vocabulary as the graph output ``logits`` [B, L, vocab], -inf at every token it cannot draft (vLLM's compute_logits
    does the same), so that the runtime's argmax, top-k and sampling read target ids. One Pad and one Gather over
    ``columns`` (HeadCheckpoint.target_columns), after the draft-sized lm_head: the lm_head's cost (the module's largest
    matrix with a 128k vocabulary) shrinks with the draft vocabulary, the spread is a copy."""
    if gb.compute_type != TensorProto.FLOAT:
        logits = gb.op("Cast", [logits], "/lm_head/logits_float32", to=TensorProto.FLOAT)
    pads = gb.const("/lm_head/not_drafted_pads", np.array([0, 0, 0, 0, 0, 1], np.int64))  # one column after the last axis
    padded = gb.op("Pad", [logits, pads, gb.const("/lm_head/not_drafted", np.array(-np.inf, np.float32))], "/lm_head/not_drafted_column",
                   mode="constant")  # [B, L, draft vocab + 1]
    gb.op("Gather", [padded, gb.const("/lm_head/draft_to_target", columns)], "/lm_head/target_vocab", outputs=["logits"], axis=-1)
