"""Writing an engine directory: into a temporary folder beside the output, moved into place only when complete.

A failed or interrupted build leaves nothing; every file is hashed into config.json (formats/engine_format.py).
"""

from __future__ import annotations

import os
import platform
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..formats import __version__
from ..formats.engine_format import (
    CONFIG_FILE,
    STAMP_FILE,
    BuildConfig,
    EngineConfig,
    ModelConfig,
    hash_directory,
    read_engine_config,
    write_build_stamp,
)
from ..formats.errors import BuildConfigError
from .architectures import checkpoint_dtype
from .backends import backend_module
from .heads import write_eagle_module


@dataclass(frozen=True)
class Written:
    config: EngineConfig
    engine_bytes: int
    backend_summary: str | None  # the backend's line for the report (Compiled.summary)


def prepare_output(output_dir: Path, force: bool, inputs: dict[str, str | Path | None] | None = None) -> None:
    """Refuse an output directory the build must not replace. ``output_dir`` resolved (a link is written through, "." has a
    name); ``inputs``: flag -> a path the build reads (the checkpoint, heads, calibration text), which the output may not be
    nor hold: replacing it would delete what is being built from."""
    if output_dir.exists() and not output_dir.is_dir():
        raise BuildConfigError(f"--output_dir {output_dir} exists and is not a directory.")
    for flag, path in (inputs or {}).items():
        if path is not None and Path(path).resolve().is_relative_to(output_dir):
            raise BuildConfigError(f"--output_dir {output_dir} is or holds {flag} {path}: building there would delete it. Choose another "
                                   "--output_dir.")
    if output_dir.is_dir() and any(output_dir.iterdir()):
        if not force:
            raise BuildConfigError(f"--output_dir {output_dir} exists and is not empty; pass --force to replace it (an engine directory).")
        others = files_beside_engine(output_dir)
        if others:
            raise BuildConfigError(f"--output_dir {output_dir} holds files that are not a specdec engine's ({', '.join(others[:3])}"
                                   f"{', ...' if len(others) > 3 else ''}): --force replaces only an engine. Choose another --output_dir, or "
                                   "move them out yourself.")
        if output_dir == Path.cwd().resolve():  # swapping it would leave the shell in a deleted directory
            raise BuildConfigError(f"--output_dir {output_dir} is the current directory and holds an engine: build into another "
                                   "directory, or cd out of this one first.")


def files_beside_engine(path: Path) -> list[str]:
    """The entries of ``path`` that are not a specdec engine's (its config.json, and the files it hashes): --force replaces a
    directory only when this is empty. Everything, when there is no engine config at all."""
    entries = sorted(p.name for p in path.iterdir())
    config = read_engine_config(path)
    if config is None or not isinstance(config.get("files"), dict):
        return entries
    known = {CONFIG_FILE, STAMP_FILE, *(Path(name).parts[0] for name in config["files"])}
    return [name for name in entries if name not in known]


def _versions() -> dict[str, str]:
    import onnx

    versions = {"specdec": __version__, "onnx": onnx.__version__, "numpy": np.__version__, "python": platform.python_version()}
    try:
        import onnxruntime

        versions["onnxruntime"] = onnxruntime.__version__
    except ImportError:
        pass
    return versions


def write_engine_dir(output_dir: Path, checkpoint_dir: str | Path, ckpt, network, model: ModelConfig, build: BuildConfig, eagle, fp8,
                     options: dict[str, Any], report: Callable[[str, int, int], None], total: int, say: Callable[[str], None]) -> Written:
    """The network (builder/network_writers.py: an ONNX graph, or the torch backend's tensors), the tokenizer files and an
    EAGLE module written, compiled by the build's backend, hashed into config.json, and moved into ``output_dir``."""
    output_dir.parent.mkdir(parents=True, exist_ok=True)
    # an empty directory is filled from a temporary one inside it (the same file system, whatever is mounted where: ".", a
    # mount point); anything else from one beside it, swapped in whole (_move_into_place)
    into = output_dir.is_dir() and not any(output_dir.iterdir())
    tmp = Path(tempfile.mkdtemp(prefix=f".{output_dir.name}.building-", dir=output_dir if into else output_dir.parent))
    try:
        network_file, build = network.save(tmp, build)
        report("write", model.num_layers + 1, total)
        for f in ckpt.tokenizer_files():
            shutil.copy2(f, tmp / f.name)
        versions = _versions()
        if eagle is not None:  # inside tmp, so the target's hashes cover it and a failure leaves nothing
            report(f"{build.speculative_decoding_mode} module", model.num_layers + 1, total)
            write_eagle_module(tmp, ckpt, eagle, model, build, versions, checkpoint_dir, say)
        compiled = backend_module(build.backend).compile_engine(tmp, network_file, build, model, options, say)
        write_build_stamp(tmp, model, build)  # what config.json must still say at load (formats/engine_format.py)
        report("verify", model.num_layers + 2, total)
        config = EngineConfig(
            model=model,
            build=build,
            files=hash_directory(tmp),
            versions={**versions, **compiled.versions},
            network_file=compiled.network_file,
            extra={
                **compiled.extra,
                "checkpoint": str(Path(checkpoint_dir).resolve()),
                "checkpoint_dtype": checkpoint_dtype(ckpt.hf_config),
                "checkpoint_fp8": fp8.method if fp8 else None,
                "hf_config": ckpt.hf_config,
                **({"lora": list(ckpt.lora)} if ckpt.lora else {}),
            },
        )
        (tmp / CONFIG_FILE).write_text(config.to_json())
        _move_into_place(tmp, output_dir)
        report("done", total, total)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    engine_bytes = sum(p.stat().st_size for p in output_dir.rglob("*") if p.is_file())
    return Written(config, engine_bytes, compiled.summary)


def _move_into_place(tmp: Path, output_dir: Path) -> None:
    # mkdtemp made the directory private (0700): engines are shipped to and read by other users
    os.chmod(tmp, 0o755)
    for f in tmp.rglob("*"):
        os.chmod(f, 0o755 if f.is_dir() else 0o644)
    if tmp.parent == output_dir:  # an empty directory (perhaps the shell's own: "."): filled in place, config.json last
        moved: list[Path] = []
        try:
            for f in sorted(tmp.iterdir(), key=lambda f: f.name == CONFIG_FILE):
                os.replace(f, output_dir / f.name)
                moved.append(output_dir / f.name)
        except BaseException:  # what was moved goes again: the directory is left empty, as it was
            for f in moved:
                shutil.rmtree(f) if f.is_dir() else f.unlink(missing_ok=True)
            raise
        tmp.rmdir()
    elif output_dir.exists():  # an engine (prepare_output): swapped whole, so a reader never sees half of each
        trash = output_dir.with_name(f".{output_dir.name}.old-{os.getpid()}")
        os.replace(output_dir, trash)
        os.replace(tmp, output_dir)
        shutil.rmtree(trash, ignore_errors=True)
    else:
        os.replace(tmp, output_dir)
