"""The draft heads a target is built with: Medusa heads in the network, an EAGLE-3 or P-EAGLE module beside it.

``--speculative_decoding_mode medusa --medusa_dir HEADS`` builds the heads into the target's network (its
medusa_logits output); ``--speculative_decoding_mode eagle --eagle_dir MODULE`` builds the module's fc into it
(eagle_hidden) and the rest as an engine of its own in the target's eagle/ folder (builder/eagle.py);
``--speculative_decoding_mode peagle --peagle_dir MODULE`` builds a P-EAGLE module the same way. The head
checkpoints are in ModelOpt's layout (formats/heads.py), checked against the base here before any network is built.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from ..formats.engine_format import (
    CONFIG_FILE,
    EAGLE_MODULE_DIR,
    PLACEHOLDER_FEATURES_FILE,
    BuildConfig,
    EngineConfig,
    ModelConfig,
    hash_directory,
    write_build_stamp,
)
from ..formats.errors import BuildConfigError
from ..formats.heads import REFINE_KEY
from .backends import backend_module
from .validation import validate_head_weights


@dataclass(frozen=True)
class Heads:
    """The head checkpoints of a build (formats/heads.py), loaded and checked: at most one of them."""

    medusa: Any = None
    eagle: Any = None

    def recorded(self, build: BuildConfig) -> BuildConfig:
        """``build`` with what the heads fix in the network: the Medusa heads' count and depth, the EAGLE module's layers."""
        if self.medusa is not None:
            return replace(build, medusa_num_heads=self.medusa.num_heads, medusa_num_layers=self.medusa.num_layers)
        if self.eagle is not None:
            return replace(build, eagle_num_layers=self.eagle.num_layers, eagle_aux_layer_ids=tuple(self.eagle.aux_layer_ids))
        return build


HEAD_FLAGS = {  # mode -> (its flag, what the directory holds)
    "medusa": ("--medusa_dir", "the Medusa heads"),
    "eagle": ("--eagle_dir", "an EAGLE-3 module"),
    "peagle": ("--peagle_dir", "a P-EAGLE module"),
}
HELD = {"medusa": "Medusa heads", "eagle": "an EAGLE-3 module", "peagle": "a P-EAGLE module (EAGLE-3 with a parallel-drafting placeholder)"}


def check_head_flags(build: BuildConfig, head_dirs: dict[str, str | Path | None]) -> None:
    """--speculative_decoding_mode medusa|eagle|peagle and its --medusa_dir|--eagle_dir|--peagle_dir come together (checked
    before any work).

    head_dirs: mode -> the directory given for it (None: not given)."""
    mode = build.speculative_decoding_mode
    for wanted, (flag, what) in HEAD_FLAGS.items():
        given = head_dirs.get(wanted)
        if given is not None and mode != wanted:
            raise BuildConfigError(f"{flag} needs --speculative_decoding_mode {wanted} (this build uses {mode}).")
        if given is None and mode == wanted:
            raise BuildConfigError(f"--speculative_decoding_mode {wanted} needs {flag} DIR: {what} (ModelOpt layout, e.g. from specdec-train).")


def check_heads(mode: str, heads, head_dir: str | Path, model: ModelConfig, allow_nonfinite: bool = False):
    """The head checkpoint ``heads`` (formats/heads.py) of a medusa / eagle / peagle build: of that kind, as wide as the
    base, and finite; an EAGLE-3 (P-EAGLE) module reads layers the base has (its draft vocabulary, d2t, checked at load)."""
    where, noun = f"{HEAD_FLAGS[mode][0]} {head_dir}", "the heads have" if mode == "medusa" else "the module has"
    if heads.mode != mode:
        other = heads.mode
        raise BuildConfigError(f"{where} holds {HELD[other]}, not {HELD[mode]}: use --speculative_decoding_mode {other} "
                               f"{HEAD_FLAGS[other][0]} {head_dir}.")
    if heads.hidden_size != model.hidden_size or heads.vocab_size != model.vocab_size:
        raise BuildConfigError(f"{where}: {noun} hidden_size {heads.hidden_size} and vocab_size {heads.vocab_size}, "
                               f"the base model {model.hidden_size} and {model.vocab_size}: {'heads' if mode == 'medusa' else 'a module'} trained on "
                               "another base?")
    validate_head_weights(heads, allow_nonfinite)
    if mode in ("eagle", "peagle"):
        check_eagle_module(heads, head_dir, model, HEAD_FLAGS[mode][0])
    return heads


def check_eagle_module(heads, eagle_dir: str | Path, model: ModelConfig, flag: str = "--eagle_dir") -> None:
    where = f"{flag} {eagle_dir}"
    if max(heads.aux_layer_ids) >= model.num_layers:
        raise BuildConfigError(f"{where}: eagle_aux_hidden_state_layer_ids {heads.aux_layer_ids} name layers the {model.num_layers}-layer base model "
                               "lacks: a module trained on another base?")


def write_eagle_module(target_dir: Path, ckpt, heads, model: ModelConfig, build: BuildConfig, versions: dict[str, str], checkpoint_dir,
                        say: Callable[[str], None]) -> None:
    """The EAGLE-3 (P-EAGLE) module's engine in target_dir/eagle: its network, compiled (checked to load) by the target's backend, and its
    own config.json."""
    from .eagle import build_eagle_network, module_build_config, module_model_config
    from .network_file import save_network

    cfg, module_build = module_model_config(model, heads), module_build_config(build, heads)
    out = target_dir / EAGLE_MODULE_DIR
    out.mkdir()
    if backend_module(module_build.backend).NETWORK == "onnx":
        from .build import built_record

        built: dict = {}
        network_file = save_network(build_eagle_network(ckpt, heads, cfg, module_build, built), out)
        module_build = replace(module_build, weight_only=built_record(module_build, None, built))
    else:  # the torch backend's tensors (builder/torch_network.py)
        from .torch_network import write_torch_eagle_module

        written = write_torch_eagle_module(out, ckpt, heads, cfg, module_build)
        network_file = written.network_file
        module_build = replace(module_build, weight_only=written.record(module_build))
    placeholders = {}
    if heads.mode == "peagle":  # a refining call feeds a placeholder's features itself, with a drafted token (runtime/proposers/peagle.py)
        np.save(out / PLACEHOLDER_FEATURES_FILE, heads.placeholder_features().astype(np.float32), allow_pickle=False)
        trained = heads.config.get("specdec_train")
        placeholders = {"peagle_placeholders": heads.placeholder_form,
                        "peagle_refine": bool(isinstance(trained, dict) and trained.get(REFINE_KEY))}  # trained to read drafts
    compiled = backend_module(module_build.backend).compile_engine(out, network_file, module_build, cfg, {}, say)
    write_build_stamp(out, cfg, module_build)
    config = EngineConfig(model=cfg, build=module_build, files=hash_directory(out), versions={**versions, **compiled.versions},
                          network_file=compiled.network_file,
                          extra={**compiled.extra, "checkpoint": str(Path(checkpoint_dir).resolve()), "eagle_dir": str(Path(heads.path).resolve()),
                                 "eagle_config": heads.config, **placeholders})
    (out / CONFIG_FILE).write_text(config.to_json())
