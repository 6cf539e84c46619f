"""A torch engine's tensors (formats/torch_layout.py), loaded onto the executor's device.

Read with specdec's own safetensors reader (numpy memory maps: bfloat16 arrives as its 16-bit pattern and is viewed
as torch.bfloat16, no conversion), one tensor at a time, so host memory holds at most one tensor beside the model.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from ....formats.engine_format import EngineDir, ModelConfig
from ....formats.errors import EngineError
from ....formats.safetensors_io import SafetensorsFile
from ....formats.torch_layout import DRAFT_TO_TARGET, MODEL_FILE, PLACEHOLDER_FORMS, layer_file

PER_CHANNEL = 1 << 30  # the group size of a per-output-channel scheme: every input row in group 0


@dataclass
class Linear:
    """One linear layer: ``weight`` [out, in] dense, or integer codes with scales and zero points (formats/torch_layout.py)."""

    weight: torch.Tensor | None = None
    qweight: torch.Tensor | None = None  # uint8 [in, out] (int8) or [ceil(in / 2), out] (int4)
    scales: torch.Tensor | None = None  # float32 [groups, out]
    zeros: torch.Tensor | None = None  # uint8 [groups, out]
    bits: int = 0
    group_size: int = 0
    bias: torch.Tensor | None = None  # [out]
    perm: torch.Tensor | None = None  # [in] int64: GPTQ act-order
    input_scale: torch.Tensor | None = None  # [in]: build-time AWQ's 1/s on o_proj / down_proj

    @property
    def out_features(self) -> int:
        return int(self.weight.shape[0] if self.weight is not None else self.qweight.shape[1])


@dataclass
class Layer:
    input_norm: torch.Tensor
    post_norm: torch.Tensor
    qkv: Linear
    o: Linear
    gate_up: Linear
    down: Linear
    q_norm: torch.Tensor | None = None
    k_norm: torch.Tensor | None = None
    hidden_norm: torch.Tensor | None = None  # an EAGLE-3 module's layer 0


@dataclass
class Weights:
    embed: torch.Tensor  # [vocab, hidden]
    norm: torch.Tensor
    lm_head: Linear  # dense over embed when tied
    rope_cos: torch.Tensor  # [kv_capacity, head_dim / 2] float32
    rope_sin: torch.Tensor
    layers: list[Layer]
    medusa: list[tuple[list[Linear], Linear]] = field(default_factory=list)  # per head: its ResBlocks, its LM head
    eagle_fc: Linear | None = None
    placeholders: torch.Tensor | None = None  # a P-EAGLE module's: [depths + 1, hidden] float32, row 0 zeros (formats/torch_layout.py)
    placeholder_form: str = ""  # "anchored" (added to the row's hidden_states) | "constant" (in their place)
    draft_to_target: torch.Tensor | None = None  # a module with its own draft vocabulary: [vocab] int64, each target id's lm_head row
    # (draft vocab: the -inf column past the last row; formats/torch_layout.py)


class _File:
    def __init__(self, engine: EngineDir, name: str, device: torch.device):
        path = engine.path / name
        if not path.is_file():
            raise EngineError(f"{engine.path} lacks {name}: it is not a complete torch engine; rebuild it.")
        self.reader, self.device, self.where = SafetensorsFile(path), device, path

    def __contains__(self, name: str) -> bool:
        return name in self.reader.entries

    def get(self, name: str, optional: bool = False) -> torch.Tensor | None:
        if name not in self.reader.entries:
            if optional:
                return None
            raise EngineError(f"{self.where} has no tensor {name!r}: the engine is incomplete or of another layout; rebuild it.")
        raw = self.reader.raw(name)
        if self.reader.dtype_name(name) == "BF16":  # uint16 bit patterns: viewed, not converted
            return torch.from_numpy(np.array(raw).view(np.int16)).view(torch.bfloat16).to(self.device)
        return torch.from_numpy(np.array(raw)).to(self.device)

    def linear(self, name: str, bits: int, group: int) -> Linear:
        get = lambda suffix: self.get(f"{name}.{suffix}", optional=True)  # noqa: E731
        if f"{name}.qweight" in self:
            return Linear(qweight=get("qweight"), scales=get("scales"), zeros=get("zeros"), bits=bits, group_size=group, bias=get("bias"),
                          perm=get("perm"), input_scale=get("input_scale"))
        return Linear(weight=self.get(f"{name}.weight"), bias=get("bias"))


def load_weights(engine: EngineDir, device: torch.device) -> Weights:
    model: ModelConfig = engine.config.model
    build = engine.config.build
    wo = build.weight_only or {}
    # group_size 0 (one scale per output channel): one group as long as any layer's input
    bits, group = int(wo.get("bits", 0)), int(wo.get("group_size") or PER_CHANNEL)
    layers = []
    for i in range(model.num_layers):
        f = _File(engine, layer_file(i), device)
        lin = {name: f.linear(name, bits, group) for name in ("qkv", "o", "gate_up", "down")}
        layers.append(Layer(f.get("input_norm"), f.get("post_norm"), q_norm=f.get("q_norm", True), k_norm=f.get("k_norm", True),
                            hidden_norm=f.get("hidden_norm", True), **lin))
    top = _File(engine, MODEL_FILE, device)
    embed = top.get("embed")
    lm_head = top.linear("lm_head", bits, group) if ("lm_head.weight" in top or "lm_head.qweight" in top) else Linear(weight=embed)
    # draft heads: float, or weight-only as the layers (--quantize_draft_heads)
    medusa = [([top.linear(f"medusa.{i}.{j}", bits, group) for j in range(build.medusa_num_layers)], top.linear(f"medusa.{i}.lm_head", bits, group))
              for i in range(build.medusa_num_heads)]
    eagle_fc = top.linear("eagle_fc", bits, group) if build.speculative_decoding_mode in ("eagle", "peagle") else None
    weights = Weights(embed, top.get("norm"), lm_head, top.get("rope_cos"), top.get("rope_sin"), layers, medusa, eagle_fc)
    weights.draft_to_target = top.get(DRAFT_TO_TARGET, optional=True)
    if build.speculative_decoding_mode == "peagle_module":
        forms = [form for form in PLACEHOLDER_FORMS if f"placeholders.{form}" in top]
        if len(forms) != 1 or embed.shape[0] != model.vocab_size + 1:
            raise EngineError(f"{engine.path} is a P-EAGLE module without its placeholder rows (one of "
                              f"{', '.join('placeholders.' + f for f in PLACEHOLDER_FORMS)}, an embedding of vocab + 1 rows): rebuild it.")
        weights.placeholder_form = forms[0]
        weights.placeholders = top.get(f"placeholders.{forms[0]}")
    return weights
