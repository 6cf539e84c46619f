"""The frozen base model: loaded from safetensors only, run without gradients, its hidden states collected."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from ..formats.errors import CheckpointError
from ..formats.heads import head_kind
from .errors import TrainConfigError


def check_model_dir(path: str | Path, flag: str = "--model") -> Path:
    d = Path(path)
    if not (d / "config.json").is_file():
        raise TrainConfigError(f"{flag} {d} is not a Hugging Face model directory (no config.json).")
    if not list(d.glob("*.safetensors")):
        raise TrainConfigError(f"{flag} {d} has no .safetensors weights (specdec-train never loads pickled .bin files).")
    try:
        cfg = json.loads((d / "config.json").read_text())
    except (OSError, ValueError) as err:
        raise TrainConfigError(f"{flag} {d}: config.json is not readable JSON ({err}).") from None
    if head_kind(cfg) is not None:
        raise TrainConfigError(f"{flag} {d} holds draft heads (Medusa heads or an EAGLE-3 / P-EAGLE module), not a base model: {flag} takes "
                               "the base model they are trained on (the target's Hugging Face checkpoint).")
    return d


def load_base(path: str | Path) -> nn.Module:
    """The base model in float32, eval mode, every parameter frozen. Safetensors only, no remote code."""
    import transformers

    d = check_model_dir(path)
    transformers.utils.logging.disable_progress_bar()  # our own bar says what happens; theirs would garble one-line errors
    try:
        model = transformers.AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32, use_safetensors=True, trust_remote_code=False)
    except (ValueError, KeyError, OSError, RuntimeError) as err:  # RuntimeError: weights whose shapes the config does not have
        raise CheckpointError(f"cannot load {d} with transformers: {str(err).splitlines()[0]}") from err
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model


def weights_sha256(path: str | Path) -> str:
    """One sha256 over the base's safetensors files (sorted by name): what the model card records."""
    h = hashlib.sha256()
    for f in sorted(Path(path).glob("*.safetensors")):
        h.update(f.name.encode())
        with open(f, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()


def base_config_dict(path: str | Path) -> dict:
    return json.loads((Path(path) / "config.json").read_text())


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    if not isinstance(layers, nn.ModuleList):
        raise CheckpointError(f"{type(model).__name__} has no model.layers: only Llama-family decoders are supported for training heads.")
    return layers


@dataclass
class BaseOutputs:
    last_hidden: torch.Tensor  # [batch, seq, hidden], after the final norm (what the LM head reads)
    aux_hidden: torch.Tensor | None  # [batch, seq, len(aux_ids) * hidden]: outputs of the chosen decoder layers, in order


@torch.no_grad()
def run_base(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, aux_ids: list[int] | None = None) -> BaseOutputs:
    """One forward pass of the frozen base. Decoder-layer outputs are caught with hooks, as ModelOpt does:
    transformers' hidden_states tuple replaces the last layer's output with the normed one."""
    captured: dict[int, torch.Tensor] = {}
    layers = decoder_layers(model)
    hooks = []
    for i in aux_ids or []:
        hooks.append(layers[i].register_forward_hook(lambda _m, _in, out, i=i: captured.__setitem__(i, out[0] if isinstance(out, tuple) else out)))
    try:
        out = model.model(input_ids=input_ids, attention_mask=attention_mask)
    finally:
        for h in hooks:
            h.remove()
    last = out.last_hidden_state
    aux = torch.cat([captured[i] for i in aux_ids], dim=-1) if aux_ids else None
    return BaseOutputs(last, aux)
