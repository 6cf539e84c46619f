"""The network a build writes into the engine's folder, either kind, behind one method (builder/engine_dir.py calls it).

    OnnxNetwork    the ONNX graph of the build's lowering (builder/network.py), made in memory, saved as model.onnx + .data
    TorchNetwork   the torch backend's tensors (builder/torch_network.py), written layer by layer into the folder

``save(folder, build)`` writes it and returns the file the executor opens and the build as written (the torch
network records its weight-only layers as it writes them); ``num_parameters`` is what specdec-build reports.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ..formats.engine_format import BuildConfig, ModelConfig


@dataclass
class OnnxNetwork:
    proto: Any  # onnx.ModelProto
    num_parameters: int

    def save(self, out: Path, build: BuildConfig) -> tuple[str, BuildConfig]:
        from .network_file import save_network

        return save_network(self.proto, out), build


@dataclass
class TorchNetwork:
    ckpt: Any
    model: ModelConfig
    build: BuildConfig
    convention: Any
    awq_layers: dict | None
    medusa: Any
    eagle: Any
    on_layer: Callable[[int], None]
    num_parameters: int = field(default=0, init=False)

    def save(self, out: Path, build: BuildConfig) -> tuple[str, BuildConfig]:
        from .torch_network import write_torch_network

        written = write_torch_network(out, self.ckpt, self.model, build, self.convention, self.awq_layers, self.medusa, self.eagle, self.on_layer)
        self.num_parameters = written.num_parameters
        return written.network_file, replace(build, weight_only=written.record(build, self.convention))
