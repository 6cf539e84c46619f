"""The engine directory: its config schema, file hashes, writing and loading.

This lives on the runtime side because a host that only runs engines must be
able to read and verify them; the builder imports it to write engines.

An engine directory holds ``config.json`` (model + build config, versions and
a sha256 for every other file), the network files of the backend, and the
tokenizer files copied from the checkpoint. See docs/engine-format.md.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .errors import EngineError
from .file_stamps import VERIFY_MODES, sha256_file, verify_files  # noqa: F401  (sha256_file: the builder's and tests' too)
from .typed_json import SchemaError, from_json

FORMAT_VERSION = 1
# targets that draft with heads of their own and verify trees of drafts (a tree_mask input, plugins/attention.py)
TREE_MODES = ("medusa", "eagle", "peagle")
MODULE_MODES = {"eagle": "eagle_module", "peagle": "peagle_module"}  # a target mode -> its drafting module engine's mode
EAGLE_MODULE_DIR = "eagle"  # an eagle (or peagle) target's folder for its module engine
# in a P-EAGLE module engine: fc(mask_hidden) [placeholder vectors, hidden] float32 (.npy), the depth vectors its graph adds
# to a placeholder's features, for a refining call that feeds drafted tokens in the placeholders' rows (runtime/proposers/peagle.py)
PLACEHOLDER_FEATURES_FILE = "placeholder_features.npy"
CONFIG_FILE = "config.json"
# The model and build sections as the network was built for them, written by the builder and hashed with the other
# files (config.json itself is not): a config.json edited after the build (vocabulary, layers, KV layout, limits)
# is refused at load, naming the field and both values, before it can fail mid-decode.
STAMP_FILE = "build_stamp.json"
# what build.speculative_decoding_mode may hold (eagle_module / peagle_module: the EAGLE-3 / P-EAGLE module's own
# engine, in an eagle / peagle target)
SPECULATIVE_MODES = ("none", "draft_tokens_external", *TREE_MODES, *MODULE_MODES.values())
KV_LAYOUTS = ("bnsh", "bsh")


@dataclass(frozen=True)
class ModelConfig:
    """The network's shape, normalised from the Hugging Face config."""

    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict[str, Any] | None
    max_position_embeddings: int
    tie_word_embeddings: bool
    qkv_bias: bool
    qk_norm: bool
    bos_token_id: int | None = None
    eos_token_id: list[int] = field(default_factory=list)
    pad_token_id: int | None = None


CPU_KERNELS = ("ort", "specdec")


@dataclass(frozen=True)
class BuildConfig:
    """The limits baked into an engine at build time."""

    dtype: str = "auto"  # resolved at build time; an engine records the real one
    max_batch_size: int = 8
    max_input_len: int = 512
    max_seq_len: int = 1024
    max_draft_len: int = 0
    # none | draft_tokens_external | medusa (verifies drafts too, and returns medusa_logits) | eagle, peagle (verify drafts
    # too, and return eagle_hidden) | eagle_module, peagle_module (the EAGLE-3 / P-EAGLE drafter's own engine, in the
    # target's eagle/ folder)
    speculative_decoding_mode: str = "none"
    medusa_num_heads: int = 0  # medusa: the heads in the network
    medusa_num_layers: int = 0  # medusa: ResBlocks per head
    eagle_num_layers: int = 0  # eagle / peagle and their modules: decoder layers of the EAGLE-3 (P-EAGLE) module
    eagle_aux_layer_ids: tuple[int, ...] = ()  # eagle / peagle: the target layers whose outputs the module fuses (fc)
    # a tree_mask input [batch, num_tokens, num_tokens] bool: token j attends to the cache before the call and to
    # the call's tokens i with tree_mask[j, i] (its ancestors and itself); position_ids = cache length + depth
    tree_attention: bool = False
    backend: str = "onnxruntime"
    tp_size: int = 1
    lowering: str = "auto"  # plugins/: portable (standard ops, what TensorRT parses) | ort_cpu; auto = per backend
    kv_layout: str = "bnsh"  # bnsh: [batch, kv_heads, capacity, head_dim]; bsh: [batch, capacity, kv_heads*head_dim]
    # ort_cuda's attention: gqa (GroupQueryAttention: fast one-token decode, several tokens with a past only at batch 1,
    # no trees) | masked (TensorScatter + Attention with a device mask: one call per round at any batch, trees);
    # auto (at build time) = masked for engines that verify drafts or trees, gqa otherwise (plugins/ort_cuda.py)
    cuda_attention: str = "auto"
    quantization: str = "auto"  # none | fp8 | int8_wo | int4_wo | int4_awq; auto (at build time) = what the checkpoint holds
    fp8_activations: str = "none"  # none | static | dynamic: how FP8 linear inputs are scaled
    # weight-only int8/int4 (docs/precision.md); the inputs of the build:
    group_size: int | None = None  # input rows per scale; 0 = per output channel; None = the default (int4: 128, int8: 0)
    symmetric: bool = True  # False: a zero point per group (asymmetric)
    quantize_lm_head: bool = False  # the LM head too (it decides acceptance; off unless asked)
    # medusa / eagle / peagle: the draft heads weight-only too, as the target's layers (Medusa's ResBlocks, the EAGLE-3 /
    # P-EAGLE module's layers and its fc; their LM heads with quantize_lm_head); off: they stay in dtype. On a CPU float
    # heads cost a large share of a draft step's memory reads (docs/medusa-eagle.md)
    quantize_draft_heads: bool = False
    # what the build did, recorded for the engine's config.json: bits, group_size, symmetric, act_order,
    # layers (linear names, lm_head included when quantized), source (rtn | awq | gptq | awq-checkpoint |
    # compressed-tensors | gguf), op (what the lowering computes with); None for float/FP8 engines
    weight_only: dict[str, Any] | None = None
    # ort (ONNX Runtime's own kernels) | specdec: int4 / int8 weights on specdec's Q4Gemm / Q8Gemm ops, a chain or tree engine's attention
    # on its RotaryCachedAttention (CachedAttention in engines built before it) and MLP gates on SwiGLU, in any precision
    # (plugins/cpu_kernels.py), whose library the runtime compiles from the installed sources
    # (weight_only["kernel_layout"] says which weight layout; a float engine has no weights in it)
    cpu_kernels: str = "ort"

    @property
    def min_step_width(self) -> int:
        """Tokens per row the executors feed at least: 2 for ort_cuda engines that verify drafts, whose one-token steps
        get a second token that rides along (not kept), so that they run the kernels a verification step runs (ONNX
        Runtime's CUDA MatMulNBits has a kernel of its own for one row, its attention one for one query) and give the
        same bits: greedy speculation stays exact. The other lowerings do that inside the graph (consistent_rows); an
        ort_cuda engine forced to GroupQueryAttention runs one-token steps as GQA's decode case (docs/gpu.md)."""
        return 2 if self.lowering == "ort_cuda" and self.max_draft_len > 0 and self.cuda_attention == "masked" else 1

    @property
    def attends_with_gqa(self) -> bool:
        """Whether an ort_cuda engine attends with ONNX Runtime's GroupQueryAttention: "gqa", and "auto" in the records of
        engines built before --cuda_attention was resolved at build time (those attended with it)."""
        return self.lowering == "ort_cuda" and self.cuda_attention != "masked"

    @property
    def rows_consistent(self) -> bool:
        """Whether a token's K/V and logits are the same bits whatever call computes them (a whole prompt, a prompt's
        suffix after cached rows, a decoding step): engines that verify drafts on ONNX Runtime run a one-token step on a
        verification step's kernels (consistent_rows in the graph, or min_step_width), and their rows depend neither on
        the batch nor on the live length (docs/precision.md). ort_cuda's GroupQueryAttention form runs a one-token step
        as its own decode case, and TensorRT's kernels per shape were never measured: not these."""
        if self.max_draft_len <= 0 or self.backend != "onnxruntime":
            return False
        return not self.attends_with_gqa

    @property
    def kv_capacity(self) -> int:
        """Cache slots per sequence.

        A step writes K/V for all ``num_tokens`` of the padded batch, so a row
        near ``max_seq_len`` may write a few padding slots past it: the slack
        of ``max_draft_len + 1`` keeps those writes in bounds.
        """
        return self.max_seq_len + self.max_draft_len + 1


@dataclass(frozen=True)
class ExtraTensor:
    """A float32 input or output an engine has beyond the ABI's (ids, positions, logits_index, logits, KV, tree_mask)."""

    name: str  # the network's name for it, and the StepOutput field (runtime/backends/base.py) an output fills
    per_token: bool  # True: [batch, num_tokens, *tail] (one per fed token); False: [batch, num_logits, *tail] (per logits row)
    tail: tuple[int, ...]

    def shape(self, batch: int, num_tokens: int, num_logits: int) -> tuple[int, ...]:
        return (batch, num_tokens if self.per_token else num_logits, *self.tail)


def extra_io(model: ModelConfig, build: BuildConfig) -> tuple[tuple[ExtraTensor, ...], tuple[ExtraTensor, ...]]:
    """The (inputs, outputs) an engine of this config has beyond the ABI's (docs/engine-format.md): the one place
    that says which speculative_decoding_mode adds which tensors, so an executor binds what this returns."""
    heads = ExtraTensor("medusa_logits", False, (build.medusa_num_heads, model.vocab_size))  # each head on the logits rows
    features = ExtraTensor("eagle_hidden", True, (model.hidden_size,))  # fc(the aux layers' outputs) of every fed token
    hidden_in = ExtraTensor("hidden_states", True, (model.hidden_size,))  # an EAGLE module's input: features or its hidden_out
    hidden_out = ExtraTensor("hidden_out", False, (model.hidden_size,))  # an EAGLE module's pre-norm state on the logits rows
    # a P-EAGLE module reads features as EAGLE's does, and never feeds a row's output back: no hidden_out
    by_mode = {"medusa": ((), (heads,)), "eagle": ((), (features,)), "peagle": ((), (features,)), "eagle_module": ((hidden_in,), (hidden_out,)),
               "peagle_module": ((hidden_in,), ())}
    return by_mode.get(build.speculative_decoding_mode, ((), ()))


@dataclass(frozen=True)
class EngineConfig:
    model: ModelConfig
    build: BuildConfig
    files: dict[str, str]  # relative path -> sha256
    versions: dict[str, str]
    network_file: str
    format_version: int = FORMAT_VERSION
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=False) + "\n"

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EngineConfig:
        """The config, every field's type and the values the runtime relies on checked: one line names the first bad field."""
        try:
            config = from_json(cls, data)
            check_values(config)
        except SchemaError as err:
            raise EngineError(
                f"{CONFIG_FILE} {err}: it does not follow the engine format (version {FORMAT_VERSION}). "
                "Rebuild the engine with this version of specdec-build."
            ) from None
        return config


def check_values(config: EngineConfig) -> None:
    """The ranges and choices the runtime relies on (types are checked by from_json); SchemaError names the field."""
    b, m = config.build, config.model
    at_least = [(f"build.{n}", getattr(b, n), 1) for n in ("max_batch_size", "max_input_len", "max_seq_len", "tp_size")]
    at_least += [("build.max_draft_len", b.max_draft_len, 0)]
    at_least += [(f"model.{n}", getattr(m, n), 1) for n in ("vocab_size", "hidden_size", "num_layers", "num_heads", "num_kv_heads", "head_dim")]
    for name, value, low in at_least:
        if value < low:
            raise SchemaError(f"{name}: expected an integer >= {low}, got {value}")
    if b.max_input_len > b.max_seq_len:
        raise SchemaError(f"build.max_input_len: {b.max_input_len} is more than build.max_seq_len, {b.max_seq_len}")
    for name, value, choices in (("speculative_decoding_mode", b.speculative_decoding_mode, SPECULATIVE_MODES),
                                 ("kv_layout", b.kv_layout, KV_LAYOUTS),
                                 ("cpu_kernels", b.cpu_kernels, CPU_KERNELS)):
        if value not in choices:
            raise SchemaError(f"build.{name}: expected one of {', '.join(choices)}, got {value!r}")


def write_build_stamp(directory: Path, model: ModelConfig, build: BuildConfig) -> None:
    """What the builder built the network for (STAMP_FILE), before the directory's files are hashed."""
    (directory / STAMP_FILE).write_text(json.dumps({"model": asdict(model), "build": asdict(build)}, indent=1, sort_keys=True) + "\n")


def check_build_stamp(root: Path, config: EngineConfig) -> None:
    """config.json's model and build sections against STAMP_FILE (its hash already checked): one line naming the first
    field that differs, with both values. Engines built before stamps have none: their networks' inputs and outputs
    are checked by the executor (runtime/backends/onnxruntime/network_io.py)."""
    if STAMP_FILE not in config.files:
        return
    try:
        stamp = json.loads((root / STAMP_FILE).read_text())
    except (OSError, ValueError) as err:
        raise EngineError(f"{root / STAMP_FILE} cannot be read ({err}); the engine is corrupt, rebuild it.") from None
    for section, section_type in (("model", ModelConfig), ("build", BuildConfig)):
        built = stamp.get(section) if isinstance(stamp, dict) else None
        if not isinstance(built, dict):
            raise EngineError(f"{root / STAMP_FILE} has no {section} section; the engine is corrupt, rebuild it.")
        # The stamp is read as config.json is (a field added since the build takes its default in both), then both
        # are compared as JSON (tuples as lists).
        try:
            built = _as_json(from_json(section_type, built, section))
        except SchemaError as err:
            raise EngineError(f"{root / STAMP_FILE}: {err}; the engine is corrupt, rebuild it.") from None
        now = _as_json(getattr(config, section))
        differs = _first_difference(now, built, section)
        if differs is not None:
            field, said, was = differs
            raise EngineError(
                f"{root / CONFIG_FILE} says {field}={_shown(said)}, but the engine was built with {_shown(was)} "
                f"({STAMP_FILE}, covered by its sha256): config.json was edited after the build. Restore it, or rebuild the engine "
                "with specdec-build.")


_ABSENT = object()


def _as_json(section: ModelConfig | BuildConfig) -> Any:
    return json.loads(json.dumps(asdict(section)))


def _first_difference(now: Any, built: Any, path: str) -> tuple[str, Any, Any] | None:
    """The first (dotted field, config.json's value, the stamp's value) where two JSON values differ, or None."""
    if isinstance(now, dict) and isinstance(built, dict):
        for key in sorted(set(now) | set(built)):
            found = _first_difference(now.get(key, _ABSENT), built.get(key, _ABSENT), f"{path}.{key}")
            if found is not None:
                return found
        return None
    same = now is not _ABSENT and built is not _ABSENT and now == built and isinstance(now, bool) == isinstance(built, bool)  # (True == 1)
    return None if same else (path, None if now is _ABSENT else now, None if built is _ABSENT else built)


def _shown(value: Any) -> str:
    text = json.dumps(value, sort_keys=True)
    return text if len(text) <= 80 else text[:77] + "..."


def hash_directory(root: Path, exclude: tuple[str, ...] = (CONFIG_FILE,)) -> dict[str, str]:
    """sha256 of every regular file below ``root`` except ``exclude``."""
    return {
        p.relative_to(root).as_posix(): sha256_file(p)
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.relative_to(root).as_posix() not in exclude
    }


@dataclass(frozen=True)
class EngineDir:
    """A loaded, verified engine directory."""

    path: Path
    config: EngineConfig

    @property
    def network_path(self) -> Path:
        return self.path / self.config.network_file

    @property
    def tokenizer_path(self) -> Path | None:
        p = self.path / "tokenizer.json"
        return p if p.is_file() else None


def eagle_module_dir(engine: EngineDir) -> Path:
    """The EAGLE-3 (P-EAGLE) module's own engine directory inside a --speculative_decoding_mode eagle (peagle) target's
    (builder/eagle.py)."""
    return engine.path / EAGLE_MODULE_DIR


def is_engine_config(data: object) -> bool:
    """Whether a parsed config.json is a specdec engine's (its model and build sections), not a checkpoint's or anything else."""
    return isinstance(data, dict) and "model" in data and "build" in data


def read_config_json(directory: Path) -> object:
    """``directory``'s parsed config.json (an engine's, a checkpoint's, anything), or None where it has none or not JSON."""
    try:
        return json.loads((directory / CONFIG_FILE).read_text())
    except (OSError, ValueError):
        return None


def read_engine_config(directory: Path) -> dict | None:
    """``directory``'s config.json when it is an engine's (is_engine_config), else None: how a tool tells an engine directory
    from a checkpoint or any other folder without loading it."""
    data = read_config_json(directory)
    return data if is_engine_config(data) else None  # type: ignore[return-value]


def check_decodes_alone(engine: EngineDir, role: str = "target") -> None:
    """Refuse an EAGLE-3 / P-EAGLE module's own engine where a target (or a draft model) is expected: it drafts from a target's
    features and cannot decode by itself; its target is the folder around it."""
    mode = engine.config.build.speculative_decoding_mode
    if mode in MODULE_MODES.values():
        what = "P-EAGLE" if mode == MODULE_MODES["peagle"] else "EAGLE-3"
        fix = (f"Pass its target engine, {engine.path.parent}, instead" if role == "target" else
               f"It drafts with its target: pass {engine.path.parent} as the target engine (--engine_dir), without a draft engine")
        raise EngineError(f"{engine.path} is the {what} module's own engine (the drafter in a target's {EAGLE_MODULE_DIR}/ folder); it cannot "
                          f"decode by itself. {fix}.")


def load_engine_dir(path: str | Path, verify: str = "stamp") -> EngineDir:
    """Open an engine directory, check its format version, its config's fields and its files' hashes.

    ``verify``: "stamp" (the default) hashes a file only when its stamp (size, times, inode) differs from
    the one recorded at its last good hash (formats/file_stamps.py); "full" hashes every file.
    """
    root = Path(path)
    if not root.is_dir():
        raise EngineError(f"engine directory {root} does not exist. Build one with `specdec-build --output_dir {root} ...`.")
    cfg_path = root / CONFIG_FILE
    if not cfg_path.is_file():
        raise EngineError(
            f"{root} is not an engine directory: it has no {CONFIG_FILE}. "
            "Point --engine_dir at the output of specdec-build (not at a Hugging Face checkpoint)."
        )
    try:
        data = json.loads(cfg_path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise EngineError(f"{cfg_path} is not valid JSON ({err}); the engine is corrupt, rebuild it.") from err
    if not is_engine_config(data):
        looks_hf = isinstance(data, dict) and "architectures" in data
        hint = " It looks like a Hugging Face checkpoint: build an engine from it with specdec-build." if looks_hf else ""
        raise EngineError(f"{cfg_path} is not a specdec engine config (no 'model'/'build' sections).{hint}")
    fmt = data.get("format_version")
    if fmt != FORMAT_VERSION:
        raise EngineError(
            f"{root} was written in engine format version {fmt}, this specdec reads version {FORMAT_VERSION}. "
            "Rebuild the engine with this version of specdec-build."
        )
    config = EngineConfig.from_dict(data)
    if config.network_file not in config.files:
        raise EngineError(f"{cfg_path} lists no hash for its network file {config.network_file!r}; rebuild the engine.")
    verify_files(root, config.files, verify, CONFIG_FILE)
    check_build_stamp(root, config)
    return EngineDir(path=root, config=config)
