"""Training checkpoints: heads (in the export layout), optimizer state and progress, all without pickles.

checkpoint-{step}/
  model.safetensors, config.json   the heads, as load_heads reads them
  optimizer.safetensors            AdamW moments and step counts, as "state.{param name}.{key}"
  trainer_state.json               step, losses so far, param-group hyper-parameters, elapsed seconds, top-1 before training
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from ..formats.heads import WEIGHTS_FILE
from .errors import TrainConfigError
from .export import save_heads

OPTIMIZER_FILE = "optimizer.safetensors"
STATE_FILE = "trainer_state.json"
CHECKPOINT_RE = re.compile(r"^checkpoint-(\d+)$")


def optimizer_tensors(optimizer: torch.optim.Optimizer, names: dict[int, str]) -> tuple[dict[str, torch.Tensor], list[dict]]:
    """AdamW's state keyed by parameter name (``names``: param index -> name), and its param groups minus the params."""
    sd = optimizer.state_dict()
    tensors = {}
    for idx, state in sd["state"].items():
        for key, value in state.items():
            t = value if isinstance(value, torch.Tensor) else torch.tensor(value)
            tensors[f"state.{names[idx]}.{key}"] = t.detach().cpu().contiguous().clone()
    groups = [{k: v for k, v in g.items() if k != "params"} | {"params": [names[i] for i in g["params"]]} for g in sd["param_groups"]]
    return tensors, groups


def load_optimizer(optimizer: torch.optim.Optimizer, names: dict[int, str], tensors: dict[str, torch.Tensor], groups: list[dict]) -> None:
    index = {name: i for i, name in names.items()}
    state: dict[int, dict] = {}
    for key, t in tensors.items():
        _, rest = key.split(".", 1)
        pname, field = rest.rsplit(".", 1)
        if pname not in index:
            raise TrainConfigError(f"the checkpoint's optimizer state names {pname!r}, which these heads do not have.")
        state.setdefault(index[pname], {})[field] = t
    param_groups = [g | {"params": [index[n] for n in g["params"]]} for g in groups]
    optimizer.load_state_dict({"state": state, "param_groups": param_groups})


def save_checkpoint(output_dir: Path, step: int, module: nn.Module, config: dict, optimizer: torch.optim.Optimizer,
                    names: dict[int, str], progress: dict) -> Path:
    """Write checkpoint-{step} whole or not at all (a temporary folder renamed into place)."""
    output_dir.mkdir(parents=True, exist_ok=True)
    final = output_dir / f"checkpoint-{step}"
    tmp = Path(tempfile.mkdtemp(prefix=f".checkpoint-{step}.", dir=output_dir))
    try:
        save_heads(module, config, tmp)
        tensors, groups = optimizer_tensors(optimizer, names)
        save_file(tensors, str(tmp / OPTIMIZER_FILE))
        (tmp / STATE_FILE).write_text(json.dumps(progress | {"step": step, "param_groups": groups}, indent=1) + "\n")
        publish(tmp)
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def publish(folder: Path) -> None:
    """mkdtemp made ``folder`` private (0700) and safetensors writes 0600 files: heads are shared, so 0755 / 0644."""
    os.chmod(folder, 0o755)
    for f in folder.rglob("*"):
        os.chmod(f, 0o755 if f.is_dir() else 0o644)


def latest_checkpoint(output_dir: Path) -> Path | None:
    found = [(int(m.group(1)), p) for p in output_dir.iterdir() if (m := CHECKPOINT_RE.match(p.name)) and p.is_dir()] if output_dir.is_dir() else []
    return max(found)[1] if found else None


def checkpoint_step(path: Path) -> int:
    """The step checkpoint-{step} was saved at (its name: read without opening it)."""
    return int(CHECKPOINT_RE.match(path.name).group(1))


def load_checkpoint(path: Path, module: nn.Module, optimizer: torch.optim.Optimizer, names: dict[int, str]) -> dict:
    """Restore heads and optimizer from ``path``; returns its trainer_state.json."""
    try:
        progress = json.loads((path / STATE_FILE).read_text())
        heads = load_file(str(path / WEIGHTS_FILE))
        opt = load_file(str(path / OPTIMIZER_FILE))
    except (OSError, ValueError) as err:
        raise TrainConfigError(f"cannot resume from {path}: {err}") from err
    own = module.state_dict()
    if set(heads) != set(own) or any(heads[k].shape != own[k].shape for k in own):
        raise TrainConfigError(f"cannot resume from {path}: its heads do not match the ones these flags describe "
                               "(mode, number of heads or layers, base model); use the flags it was started with.")
    module.load_state_dict(heads)
    load_optimizer(optimizer, names, opt, progress["param_groups"])
    return progress
