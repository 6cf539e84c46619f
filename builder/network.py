"""The model as one ONNX graph: the engine ABI, written once per family.

Inputs
  input_ids      [batch, num_tokens]  int64
  position_ids   [batch, num_tokens]  int64   position (= cache slot) of each token
  logits_index   [batch, num_logits]  int64   which of the num_tokens rows get logits
  (a lowering may add inputs of its own: ort_cuda's host-side total_sequence_length, plugins/ort_cuda.py;
   tree_mask [batch, num_tokens, num_tokens] bool in tree_attention engines, plugins/attention.py)
  past_key.i / past_value.i  the KV cache, float32 (ort_cuda: the compute dtype), in the lowering's layout (build.kv_layout):
                 bnsh [batch, kv_heads, kv_capacity, head_dim] or bsh [batch, kv_capacity, kv_heads * head_dim]
Outputs
  logits         [batch, num_logits, vocab]   float32
  medusa_logits  [batch, num_logits, num_heads, vocab]  float32, only in --speculative_decoding_mode medusa engines:
                 Medusa head i on the same post-norm rows as lm_head (it guesses the token after the one those
                 logits pick, plus i); an executor that does not bind it does not compute it
  eagle_hidden   [batch, num_tokens, hidden]  float32, only in --speculative_decoding_mode eagle engines: the EAGLE-3
                 module's fc over the outputs of the decoder layers eagle_aux_layer_ids, for EVERY fed token
                 (builder/eagle.py builds the module itself, into the engine's eagle/ folder)
  present_key.i / present_value.i  (bound to the past buffers: updated in place)

The context phase sends a whole prompt per row and asks for the last row's
logits; the generation phase sends 1 .. max_draft_len + 1 tokens per row and
asks for all of them (verifying k drafts needs k + 1 rows of logits).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from onnx import TensorProto

from ..formats.engine_format import BuildConfig, ModelConfig
from ..formats.errors import BuildConfigError
from ..plugins import lowering_for
from ..plugins.attention import Shared
from .architectures import ARCHITECTURES
from .checkpoint import Checkpoint
from .graph import GraphBuilder
from .linear_weights import LinearWeights, layer_names
from .quantization import FP8_MAX, Fp8Convention, IntConvention, LinearWeight
from .rope import cos_sin_tables
from .weight_only import IntWeight


def _shape(gb: GraphBuilder, name: str, dims: list[int]) -> str:
    return gb.const(name, np.array(dims, np.int64))


def build_network(
    ckpt: Checkpoint,
    cfg: ModelConfig,
    build: BuildConfig,
    on_layer: Callable[[int], None] | None = None,
    convention: Fp8Convention | IntConvention | None = None,
    activation_scales: dict[str, float] | None = None,
    linear_inputs: dict[str, str] | None = None,
    awq_layers: dict | None = None,
    weight_only_built: dict | None = None,
    medusa=None,
    eagle=None,
):
    """Return the ONNX ModelProto of ``cfg`` with weights from ``ckpt``.

    convention: how the checkpoint is quantized (FP8, or packed integer weights), if it is.
    activation_scales: calibrated static FP8 input scales by linear-layer name.
    linear_inputs: filled with linear-layer name -> the graph value it reads (calibration taps).
    awq_layers: int4_awq's search by linear-layer name (builder/awq.py's AwqLayer: input scales s [in],
        and how to quantize s[:, None] * W, clipped per group).
    weight_only_built: filled with what was built as int8/int4: "layers" (their names), "even_rows" (whether a step
        is padded to an even number of rows for the GEMMs, pad_step), "act_order" (whether a
        layer gathers its input channels, GPTQ g_idx).
    medusa: Medusa heads (formats.heads.HeadCheckpoint) to add as the medusa_logits output, or None.
    eagle: an EAGLE-3 module (formats.heads.HeadCheckpoint) whose fc to add as the eagle_hidden output, or None.
    """
    gb, lowering = new_lowering(build, cfg)
    linears = _Linears(gb, lowering, ckpt, build, convention, activation_scales or {}, awq_layers or {})
    ids = gb.input("input_ids", TensorProto.INT64, ["batch", "num_tokens"])
    positions = gb.input("position_ids", TensorProto.INT64, ["batch", "num_tokens"])
    logits_index = gb.input("logits_index", TensorProto.INT64, ["batch", "num_logits"])
    # Kernels that compute a lone row otherwise than rows in pairs: the step is padded to even rows once, here
    # (a tree engine's tree_mask fixes its token count, so it pads around each GEMM instead)
    step_padded = lowering.consistent_rows and not build.tree_attention and eagle is None  # (eagle_hidden: every fed token)
    if step_padded:
        (ids, positions), fed = lowering.pad_step(ids, positions), (ids, positions)
        linears.rows = positions

    cos, sin = cos_sin_tables(cfg, build.kv_capacity)
    shared = lowering.prelude(Shared(positions=positions, cos=gb.const("rope_cos", cos), sin=gb.const("rope_sin", sin), capacity=build.kv_capacity))

    embed = gb.weight("model.embed_tokens.weight", ckpt.float32("model.embed_tokens.weight"))  # [vocab, hidden]
    x = gb.op("Gather", [embed, ids], "/model/embed_tokens")
    delta = None  # each layer's MLP output, added to the residual stream by the next norm
    aux: dict[int, str] = {}  # eagle: decoder layer i's output [B, S, hidden] (the residual stream after it)
    for i in range(cfg.num_layers):
        x, delta = _decoder_layer(gb, lowering, linears, ckpt, cfg, i, x, delta, shared)
        if eagle is not None and i in eagle.aux_layer_ids:
            aux[i] = gb.op("Add", [x, delta], f"/model/layers.{i}/output")
        if on_layer:
            on_layer(i)
    x = gb.op("Add", [x, delta], "/model/residual")
    if eagle is not None:
        _eagle_hidden(gb, linears, [aux[i] for i in eagle.aux_layer_ids], eagle, cfg)

    # Only the rows the caller asked for go through the final norm and lm_head.
    rows = gb.op("Unsqueeze", [logits_index, gb.const("/model/axis_last", np.array([-1], np.int64))], "/model/logits_rows")
    x = gb.op("GatherND", [x, rows], "/model/gather_logit_rows", batch_dims=1)
    x = _rms_norm(gb, "/model/norm", x, ckpt.float32("model.norm.weight"), cfg.rms_norm_eps)
    if medusa is not None:
        _medusa_heads(gb, lowering, linears, x, logits_index, medusa, cfg)
    tied = cfg.tie_word_embeddings  # what decodes, as transformers reads the checkpoint (builder/lm_head.py)
    if linears.scheme is not None and build.quantize_lm_head:
        # a quantized copy for the head only: the embedding (tied or not) stays in --dtype
        head_t = ckpt.float32("model.embed_tokens.weight" if tied else "lm_head.weight").T  # [hidden, vocab], read again: not held through the layers
        gb.op("Identity", [linears.int_rtn("lm_head", "/lm_head/matmul", x, head_t, logits_index)], "/lm_head/logits", outputs=["logits"])
    else:
        if tied:
            lm_head = gb.op("Transpose", [embed], "/lm_head/tied_weight_t", perm=[1, 0])
        else:
            lm_head = gb.weight("lm_head.weight", ckpt.float32("lm_head.weight").T)
        float32_output(gb, "MatMul", [x, lm_head], "/lm_head/matmul", "logits", None)
    gb.output("logits", TensorProto.FLOAT, ["batch", "num_logits", cfg.vocab_size])
    if step_padded and not lowering.step_padding_needed:  # no GEMM computes a lone row otherwise: no extra token
        for padded, given in zip((ids, positions), fed, strict=True):
            if padded != given:
                gb.bypass(padded, given)
    if linear_inputs is not None:
        linear_inputs.update(linears.inputs)
    return finish_model(gb, lowering, linears, cfg.architecture, weight_only_built, even_rows=step_padded and lowering.step_padding_needed)


def new_lowering(build: BuildConfig, cfg: ModelConfig):
    """(GraphBuilder, the build's attention lowering) set up as every network of the build needs it: a target's and its
    EAGLE module's alike."""
    lowering_cls = lowering_for(build)
    gb = GraphBuilder(weight_dtype=build.dtype, compute_dtype=lowering_cls.compute_dtype(build))
    lowering = lowering_cls(gb, cfg)
    # A target's one-token steps must compute what its verification steps compute. The kernel splits this pads
    # away are ONNX Runtime's (docs/precision.md); TensorRT's (tactics chosen per shape) are not measured.
    lowering.consistent_rows = lowering_cls.pads_lone_rows(build)
    lowering.tree_attention = build.tree_attention  # a tree_mask input (plugins/attention.py)
    lowering.probe_rows = build.max_batch_size * (build.max_draft_len + 1) + 1
    lowering.cpu_kernels = build.cpu_kernels
    return gb, lowering


def finish_model(gb: GraphBuilder, lowering, linears: _Linears, architecture: str, weight_only_built: dict | None, even_rows: bool = False):
    """The ModelProto, with specdec's op domain where the lowering wrote its ops; ``weight_only_built`` (when given) filled
    with what was built as int8/int4 and on which ops (builder/build.py's built_record reads it)."""
    if weight_only_built is not None:
        weight_only_built.update(layers=linears.int_layers, act_order=linears.act_order, even_rows=even_rows, q4gemm_layers=lowering.q4gemm_layers,
                                 kernel_ops=lowering.kernel_ops, attention_op=lowering.attention_op)
    opsets = dict(lowering.extra_opsets)
    if lowering.q4gemm_layers or lowering.swiglu_layers or lowering.attention_op != "Attention":  # specdec's own ops
        from ..plugins.cpu_kernels import DOMAIN

        opsets[DOMAIN] = 1
    return gb.model(f"specdec_{architecture}", extra_opsets=opsets)


def _medusa_heads(gb: GraphBuilder, lowering, linears: _Linears, x: str, rows: str, heads, cfg: ModelConfig) -> None:
    """medusa_logits [B, L, heads, vocab] from the post-norm rows x [B, L, hidden] (train/medusa.py's MedusaHeads; rows: the
    logits_index they were gathered by): head i = num_layers ResBlocks h + SiLU(h W^T + b), then its own LM head. In float,
    or weight-only with --quantize_draft_heads (the ResBlocks; the LM heads too with --quantize_lm_head)."""
    t, layers, axis = heads.tensors, heads.num_layers, gb.const("/medusa/axis_heads", np.array([2], np.int64))
    quantized = linears.scheme is not None and linears.build.quantize_draft_heads
    per_head = []
    for i in range(heads.num_heads):
        p, h = f"/medusa/heads.{i}", x
        for j in range(layers):
            w_t = np.ascontiguousarray(t[f"medusa_heads.{i}.{j}.linear.weight"].T)  # [hidden, hidden]
            y = linears.matmul(quantized, "medusa/resblock", f"{p}/{j}/linear", h, w_t, rows, f"medusa_heads.{i}.{j}.linear.weight")
            y = gb.op("Add", [y, gb.weight(f"medusa_heads.{i}.{j}.linear.bias", t[f"medusa_heads.{i}.{j}.linear.bias"])], f"{p}/{j}/linear_bias")
            h = gb.op("Add", [h, lowering.silu(f"{p}/{j}", y)], f"{p}/{j}/residual")
        w_t = np.ascontiguousarray(t[f"medusa_heads.{i}.{layers}.weight"].T)  # [hidden, vocab]
        logits = linears.matmul(quantized and linears.build.quantize_lm_head, "medusa/lm_head", f"{p}/lm_head", h, w_t, rows,
                                f"medusa_heads.{i}.{layers}.weight")
        per_head.append(gb.op("Unsqueeze", [logits, axis], f"{p}/logits"))
    float32_output(gb, "Concat", per_head, "/medusa/concat", "medusa_logits", ["batch", "num_logits", heads.num_heads, cfg.vocab_size],
                   cast_name="/medusa/logits_float32", axis=2)


def _eagle_hidden(gb: GraphBuilder, linears: _Linears, outputs: list[str], eagle, cfg: ModelConfig) -> None:
    """eagle_hidden [B, S, hidden] = fc(concat(outputs)), over every fed token (EAGLE reads the prompt's features too):
    the EAGLE-3 module's input (train/eagle.py). fc in float, or weight-only with --quantize_draft_heads."""
    cat = gb.op("Concat", outputs, "/eagle/aux_concat", axis=-1) if len(outputs) > 1 else outputs[0]  # [B, S, num_aux * hidden]
    w_t = np.ascontiguousarray(eagle.tensors["fc.weight"].T)  # [num_aux * hidden, hidden]
    if linears.scheme is not None and linears.build.quantize_draft_heads:
        fused = linears.int_rtn("eagle/fc", "/eagle/fc", cat, w_t, linears.rows)
        float32_output(gb, "Identity", [fused], "/eagle/fc_out", "eagle_hidden", ["batch", "num_tokens", cfg.hidden_size],
                       cast_name="/eagle/hidden_float32")
        return
    fc = gb.weight("eagle.fc.weight", w_t)
    float32_output(gb, "MatMul", [cat, fc], "/eagle/fc", "eagle_hidden", ["batch", "num_tokens", cfg.hidden_size], cast_name="/eagle/hidden_float32")


def float32_output(gb: GraphBuilder, op: str, inputs: list[str], name: str, output: str, dims: list | None,
                   cast_name: str = "/lm_head/logits_float32", **attrs) -> None:
    """``op`` writing the graph output ``output``, which the engine ABI keeps float32: a half-precision lowering
    computes it in its dtype and casts (node ``cast_name``). dims: declare the output with these dims (None: the
    caller does)."""
    if gb.compute_type == TensorProto.FLOAT:
        gb.op(op, inputs, name, outputs=[output], **attrs)
    else:
        gb.op("Cast", [gb.op(op, inputs, name, **attrs)], cast_name, outputs=[output], to=TensorProto.FLOAT)
    if dims is not None:
        gb.output(output, TensorProto.FLOAT, dims)


def _head_norm(gb: GraphBuilder, name: str, x: str, heads: int, head_dim: int, weight: np.ndarray, eps: float) -> str:
    """[B, S, heads * head_dim] -> RMSNorm over each head -> same shape."""
    x = gb.op("Reshape", [x, _shape(gb, f"{name}/heads_shape", [0, 0, heads, head_dim])], f"{name}/heads")
    x = _rms_norm(gb, name, x, weight, eps)
    return gb.op("Reshape", [x, _shape(gb, f"{name}/flat_shape", [0, 0, heads * head_dim])], f"{name}/flat")


def _rms_norm(gb: GraphBuilder, name: str, x: str, weight: np.ndarray, eps: float) -> str:
    w = gb.weight(f"{name}.weight", weight)
    return gb.op("RMSNormalization", [x, w], name, axis=-1, epsilon=eps)


class _Linears(LinearWeights):
    """Linear layers, dense, FP8 or weight-only int8/int4, with the precision written into the graph."""

    def __init__(self, gb: GraphBuilder, lowering, ckpt: Checkpoint, build: BuildConfig, convention: Fp8Convention | IntConvention | None,
                 act_scales: dict[str, float], awq_layers: dict):
        super().__init__(ckpt, build, convention, awq_layers)
        self.gb, self.lowering, self.act_scales = gb, lowering, act_scales
        self.inputs: dict[str, str] = {}  # layer name -> the graph value it reads (calibration taps these)
        self.int_layers: list[str] = []  # layers stored as int8/int4
        self.act_order = False  # whether some layer gathers its input channels (GPTQ g_idx)
        self.rows = "position_ids"  # [B, S]: the leading shape of every decoder linear's input

    def __call__(self, name: str, x: str, modules: list[str], bias: np.ndarray | None = None, input_folded: bool = False,
                 w: LinearWeight | None = None) -> str:
        """x @ W (+ bias) for the projections ``modules`` fused along the output axis.

        input_folded: AWQ's 1/s is already in x (folded into the RMSNorm weight before it).
        w: the weight, when the caller has read it already.
        """
        gb, w = self.gb, w or self.weights(name, modules)
        self.inputs[name] = x
        if w.is_int:
            y = self.lowering.int_matmul(name, self._int_input(name, x, w.int_weight, input_folded), w.int_weight, self.rows)
            self._record_int(name, w.int_weight)
        else:
            if w.is_fp8:
                weight = gb.fp8_weight(f"{name}.weight", w.fp8_bits, w.scale, w.block_size)
                x = self._activation(name, x, w)
            else:
                weight = gb.weight(f"{name}.weight", w.dense)
            y = gb.op("MatMul", [x, weight], name)
        if bias is not None:
            y = gb.op("Add", [y, gb.weight(f"{name}.bias", bias)], f"{name}/bias")
        return y

    def _int_input(self, name: str, x: str, w: IntWeight, input_folded: bool) -> str:
        """x as an int8/int4 layer reads it: AWQ's 1/s multiplied in where no norm folded it (o_proj / down_proj)."""
        inverse = self.awq_inverse(name) if w.source == "awq" and not input_folded else None
        if inverse is None:
            return x
        return self.gb.op("Mul", [x, self.gb.const(f"{name}/awq_inverse_scale", inverse)], f"{name}/awq_scale_input")

    def _record_int(self, name: str, w: IntWeight) -> None:
        self.int_layers.append(name)
        self.act_order |= w.perm is not None

    def parts(self, name: str, x: str, modules: list[str], sizes: list[int], bias: np.ndarray | None = None,
              input_folded: bool = False) -> list[str]:
        """The fused projection of ``modules`` split along its output axis into widths ``sizes``: one node with an
        output per part where the lowering has one (an int weight on Q4Gemm / Q8Gemm), else the GEMM and a Split."""
        w = self.weights(name, modules)
        if w.is_int and bias is None:
            folded = self._int_input(name, x, w.int_weight, input_folded)
            outs = self.lowering.int_matmul_parts(name, folded, w.int_weight, self.rows, sizes)
            y = outs or self(name, folded, modules, None, True, w=w)
            self.inputs[name] = x
            if outs is not None:
                self._record_int(name, w.int_weight)
                return outs
        else:
            y = self(name, x, modules, bias, input_folded, w=w)
        return list(self.gb.op("Split", [y, _shape(self.gb, f"{name}_split", sizes)], f"{name}_split_op", num_outputs=len(sizes), axis=-1))

    def gated(self, name: str, x: str, modules: list[str], width: int, silu: Callable[[str], str], input_folded: bool = False) -> str:
        """silu(gate) * up of the gate|up projection (``width`` each): in the GEMM itself where the lowering can
        (Q4Gemm / Q8Gemm swiglu), else in one node after the GEMM where it can (SwiGLU), else the GEMM's two parts, ``silu``
        and a Mul."""
        w = self.weights(name, modules)
        if w.is_int:
            folded = self._int_input(name, x, w.int_weight, input_folded)
            y = self.lowering.int_swiglu(name, folded, w.int_weight, self.rows)
            self.inputs[name] = x
            if y is not None:
                self._record_int(name, w.int_weight)
                return y
            y = self(name, folded, modules, None, True, w=w)
            self.inputs[name] = x
        else:
            y = self(name, x, modules, None, input_folded, w=w)
        gated = self.lowering.swiglu(name, y, width)
        if gated is not None:
            return gated
        gate, up = self.gb.op("Split", [y, _shape(self.gb, f"{name}_split", [width] * 2)], f"{name}_split_op", num_outputs=2, axis=-1)
        return self.gb.op("Mul", [silu(gate), up], f"{name}/gated")

    def matmul(self, quantized: bool, kind: str, name: str, x: str, w_t: np.ndarray, rows: str, weight_name: str) -> str:
        """x @ w_t [in, out] for a head outside the decoder layers: int_rtn when ``quantized``, else a float MatMul on the
        weight ``weight_name``."""
        if quantized:
            return self.int_rtn(kind, name, x, w_t, rows)
        return self.gb.op("MatMul", [x, self.gb.weight(weight_name, w_t)], name)

    def int_rtn(self, kind: str, name: str, x: str, w_t: np.ndarray, rows: str) -> str:
        """x @ w_t [in, out] as int8/int4, rounded to nearest (never AWQ-scaled): an LM head or a draft head's layer, recorded
        in the engine's weight_only["layers"] as ``kind``; ``name`` the node's; rows: the leading shape of x (EvenRows')."""
        self.int_layers.append(kind)
        return self.lowering.int_matmul(name, x, self.quantize(kind, w_t), rows)

    def _activation(self, name: str, x: str, w: LinearWeight) -> str:
        mode, gb = self.build.fp8_activations, self.gb
        if mode == "none":
            return x
        if mode == "static":
            scale = self.act_scales.get(name, w.input_scale)
            if scale is None:
                raise BuildConfigError(f"--fp8_activations static: no input scale for {name} (the checkpoint has no input_scale); calibrate with "
                                       "--calib_dataset FILE or use --fp8_activations dynamic.")
            return gb.fp8_activation(f"{name}/input", x, gb.const(f"{name}/input_scale", np.array(scale, np.float32)))
        # dynamic: per-tensor amax of this step's input
        amax = gb.op("ReduceMax", [gb.op("Abs", [x], f"{name}/input_abs")], f"{name}/input_amax", keepdims=0)
        scale = gb.op("Div", [amax, gb.const(f"{name}/fp8_max", np.array(FP8_MAX, np.float32))], f"{name}/input_scale_raw")
        scale = gb.op("Max", [scale, gb.const(f"{name}/min_scale", np.array(1e-12, np.float32))], f"{name}/input_scale")
        return gb.fp8_activation(f"{name}/input", x, scale)


def _decoder_layer(gb: GraphBuilder, lowering, linear: _Linears, ckpt: Checkpoint, cfg: ModelConfig, i: int, x: str, delta: str | None,
                   shared: Shared,
                   fused: bool | None = None) -> tuple[str, str]:
    """One decoder layer: returns (residual stream, MLP output still to be added to it).

    fused: whether the checkpoint stores q|k|v and gate|up as one module each (None: the architecture's rule)."""
    p = f"/model/layers.{i}"
    w, _ = layer_names(ckpt, i)
    if fused is None:
        fused = ARCHITECTURES[cfg.architecture].fused_projections
    h, x = lowering.add_norm(f"{p}/input_layernorm", x, delta,
                             gb.weight(f"{p}/input_layernorm.weight", linear.norm_weight(f"{p}/attn/qkv_proj", w("input_layernorm"))))
    o = _attention_block(gb, lowering, linear, ckpt, cfg, i, h, shared, fused)
    return _mlp_block(gb, lowering, linear, ckpt, cfg, i, x, o, fused)


def _attention_block(gb: GraphBuilder, lowering, linear: _Linears, ckpt: Checkpoint, cfg: ModelConfig, i: int, h: str, shared: Shared,
                     fused: bool) -> str:
    """o_proj(attention(q, k, v of the normed input h [B, S, in])) -> [B, S, hidden]; in = the q/k/v weights' input width."""
    p = f"/model/layers.{i}"
    w, mod = layer_names(ckpt, i)
    nh, kvh, hd = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    # One fused q|k|v projection: a third of the MatMul calls.
    bias = np.concatenate([w("q_bias"), w("k_bias"), w("v_bias")]) if cfg.qkv_bias else None
    modules = mod("qkv_proj") if fused else mod("q_proj", "k_proj", "v_proj")
    if lowering.takes_packed_qkv() and not cfg.qk_norm:  # the attention op splits q|k|v itself: one kernel less
        qkv = linear(f"{p}/attn/qkv_proj", h, modules, bias, input_folded=True)
        attn = lowering.layer(f"{p}/attn", qkv, None, None, i, shared)
    else:
        q, k, v = linear.parts(f"{p}/attn/qkv_proj", h, modules, [nh * hd, kvh * hd, kvh * hd], bias, input_folded=True)
        if cfg.qk_norm:  # Qwen3: RMSNorm over each head
            q = _head_norm(gb, f"{p}/attn/q_norm", q, nh, hd, w("q_norm"), cfg.rms_norm_eps)
            k = _head_norm(gb, f"{p}/attn/k_norm", k, kvh, hd, w("k_norm"), cfg.rms_norm_eps)
        attn = lowering.layer(f"{p}/attn", q, k, v, i, shared)
    return linear(f"{p}/attn/o_proj", attn, mod("o_proj"))


def _mlp_block(gb: GraphBuilder, lowering, linear: _Linears, ckpt: Checkpoint, cfg: ModelConfig, i: int, x: str, o: str,
               fused: bool) -> tuple[str, str]:
    """x + o, then the MLP on its post_attention_layernorm: returns (x + o, MLP output still to be added to it)."""
    p = f"/model/layers.{i}"
    w, mod = layer_names(ckpt, i)
    h, x = lowering.add_norm(f"{p}/post_attention_layernorm", x, o, gb.weight(f"{p}/post_attention_layernorm.weight",
                                                                              linear.norm_weight(f"{p}/mlp/gate_up_proj",
                                                                                                 w("post_attention_layernorm"))))
    gated = linear.gated(f"{p}/mlp/gate_up_proj", h, mod("gate_up_proj") if fused else mod("gate_proj", "up_proj"), cfg.intermediate_size,
                         lambda gate: lowering.silu(f"{p}/mlp", gate), input_folded=True)
    return x, linear(f"{p}/mlp/down_proj", gated, mod("down_proj"))
