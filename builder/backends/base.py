"""What a build backend declares and does: the protocol every module in builder/backends/ implements.

build.py never branches on a backend's name: it asks the chosen backend's
module (through the registry in ``__init__.py``) what it runs on, which
lowerings it compiles, what it refuses, which options are its own, and then
hands it the written network to compile.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from ...formats.engine_format import BuildConfig, ModelConfig


@dataclass(frozen=True)
class Compiled:
    """What a backend made of the network in the engine's folder, for its config.json."""

    network_file: str  # the file the runtime's executor opens (config.json's network_file)
    versions: dict[str, str] = field(default_factory=dict)  # tools that made it, by name (config.json's versions)
    extra: dict[str, Any] = field(default_factory=dict)  # the backend's own record (config.json's extra), e.g. {"tensorrt": {...}}
    summary: str | None = None  # a line for specdec-build's report (what was made, where it runs), or None


@runtime_checkable
class BuildBackend(Protocol):
    """A backend module: what build.py reads of it (module-level names) and calls on it (module-level functions)."""

    TITLE: str  # its name in prose, e.g. "TensorRT"
    DEVICE: str  # the device kind its engines run on (where their KV cache lives): cpu | cuda
    DEFAULT_LOWERING: str  # what --lowering auto means for it
    LOWERINGS: tuple[str, ...]  # the lowerings (plugins/) whose graphs it compiles
    TREE_ATTENTION: bool  # builds targets that verify draft trees (--speculative_decoding_mode medusa | eagle)
    # what it compiles: "onnx" (the network of a lowering, plugins/, written by builder/network.py) or "torch" (no graph: the
    # checkpoint's tensors in the layout the torch executor reads, written by builder/torch_network.py)
    NETWORK: str
    KV_LAYOUT: str | None  # a backend that writes no ONNX: its engines' build.kv_layout (ONNX backends: None, the lowering's)
    # build_engine's keyword options that only this backend takes -> their specdec-build flags
    OPTIONS: dict[str, str]
    # said whenever a build uses it, or None: what has not been verified (e.g. never run on a GPU here)
    NOTICE: str | None

    def host_problem(self) -> str | None:
        """Why this host cannot build for it, with what to do, or None."""

    def auto_note(self) -> str | None:
        """What --backend auto says of it on this host (e.g. that it could build here), or None."""

    def check_options(self, options: dict[str, Any]) -> None:
        """Refuse its own options that contradict each other (only those given are passed), before any work."""

    def refusals(self, build: BuildConfig) -> list[str]:
        """What it cannot build of ``build`` (weight-only forms, ...), each a phrase of 'invalid build configuration: ...'."""

    def check_build(self, build: BuildConfig, options: dict[str, Any]) -> None:
        """Refuse, in a sentence of its own, what it cannot build of the resolved ``build`` with its ``options`` (those
        given), before any work: a refusal that needs the options, or one the phrase form cannot say."""

    def compile_engine(self, out_dir: Path, network_file: str, build: BuildConfig, model: ModelConfig, options: dict[str, Any],
                say: Callable[[str], None]) -> Compiled:
        """Check or compile the network ``out_dir / network_file`` into what its executor loads, in ``out_dir``."""
