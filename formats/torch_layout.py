"""The torch backend's engine files: which tensors, named how, in which layout.

builder/torch_network.py writes them and runtime/backends/torch/weights.py reads them, through the names here, so
the two cannot drift apart. An engine of ``build.backend == "torch"`` holds, beside config.json and the tokenizer:

    model.safetensors    (config.json's network_file) what is not a decoder layer:
                           embed [vocab, hidden]; norm [hidden]; lm_head: a LINEAR (absent: tied to embed);
                           rope_cos / rope_sin [kv_capacity, head_dim / 2] float32 (the tables the ONNX engines hold);
                           medusa.{i}.{j} (a LINEAR with bias: head i's ResBlock j) and medusa.{i}.lm_head [vocab, hidden] (a LINEAR);
                           eagle_fc [hidden, num_aux * hidden] (a LINEAR: an EAGLE-3 or P-EAGLE target's fc over its aux layers'
                           outputs); the draft heads' LINEARs weight-only only with --quantize_draft_heads;
                           a P-EAGLE module (mode peagle_module): embed [vocab + 1, hidden], its last row the embedding of
                           ptd_token_id that every placeholder reads, and one of placeholders.anchored /
                           placeholders.constant [depths + 1, hidden] float32: row 0 zeros (real tokens), row d depth d's
                           vector fc(mask_hidden[d]), added to the row's hidden_states (anchored) or in place of them
                           (constant); builder/eagle.py says what the placeholder token ids are;
                           an EAGLE-3 or P-EAGLE module with a draft vocabulary of its own (d2t): lm_head [draft vocab, hidden]
                           and draft_to_target int64 [vocab], each target id's lm_head row, or draft vocab (a -inf column)
                           where the module cannot draft it
    layer.{i}.safetensors  decoder layer i: input_norm, post_norm [hidden]; q_norm, k_norm [head_dim] (qk_norm models);
                           hidden_norm [hidden] (an EAGLE-3 module's layer 0); the LINEARs qkv (q|k|v joined along the
                           outputs, bias beside it where the model has one), o, gate_up (gate|up joined), down

A LINEAR ``x`` is either dense, ``x.weight`` [out, in] in the engine's dtype (torch's F.linear layout), or weight-only
integer (config.json's build.weight_only says the bits and group size):

    x.qweight  uint8, int8: codes [in, out]; int4: [ceil(in / 2), out], two codes per byte along the input axis: row r
               holds input rows 2r (low nibble) and 2r + 1 (high nibble); an odd last row's high nibble is 0
    x.scales   float32 [groups, out], groups = ceil(in / group_size)
    x.zeros    uint8 [groups, out]: w[i, o] = (code[i, o] - zeros[i // group_size, o]) * scales[i // group_size, o]
    x.perm     int64 [in], GPTQ act-order only: the layer computes x[..., perm] @ w
    x.input_scale  [in], build-time AWQ only (o_proj, down_proj): the layer computes (x * input_scale) @ w

and may have ``x.bias`` [out]. Everything but scales, rope tables and integer codes is stored in the engine's dtype.
"""

from __future__ import annotations

import numpy as np

LAYOUT_VERSION = 1  # recorded in config.json's extra["torch"]; the runtime refuses one it does not read
DRAFT_VOCAB_LAYOUT_VERSION = 2  # a module with draft_to_target: a runtime that reads 1 only refuses it instead of drafting wrong ids
READ_VERSIONS = (LAYOUT_VERSION, DRAFT_VOCAB_LAYOUT_VERSION)
MODEL_FILE = "model.safetensors"
LINEARS = ("qkv", "o", "gate_up", "down")  # a decoder layer's linear layers, in the order a layer runs them
PLACEHOLDER_FORMS = ("anchored", "constant")  # a P-EAGLE module's placeholder vectors: tensor placeholders.{form}
DRAFT_TO_TARGET = "draft_to_target"  # a module's map from its draft vocabulary's logits to the target's (above)


def layer_file(index: int) -> str:
    return f"layer.{index}.safetensors"


def pack_int4(codes: np.ndarray) -> np.ndarray:
    """codes [in, out] uint8 in 0..15 -> [ceil(in / 2), out] uint8: row r = codes[2r] | codes[2r + 1] << 4."""
    rows = codes.shape[0]
    if rows % 2:
        codes = np.concatenate([codes, np.zeros((1, codes.shape[1]), np.uint8)])
    return (codes[0::2] | (codes[1::2] << 4)).astype(np.uint8)


def unpack_int4(packed: np.ndarray, rows: int) -> np.ndarray:
    """pack_int4's inverse: [ceil(rows / 2), out] -> codes [rows, out]."""
    out = np.empty((packed.shape[0] * 2, packed.shape[1]), np.uint8)
    out[0::2], out[1::2] = packed & 0x0F, packed >> 4
    return out[:rows]
