"""The on-disk layout of trained Medusa heads and EAGLE modules, and ``load_heads`` that reads it.

We follow NVIDIA ModelOpt's layout (``modelopt/torch/speculative``), so heads
trained with ModelOpt load here and ours load there:

* Medusa: the state-dict names of ModelOpt's ``HFMedusaModel``
  (``plugins/transformers.py``): ``medusa_heads`` is a ModuleList of
  ``nn.Sequential(ResBlock * num_layers, Linear(hidden, vocab, bias=False))``,
  a ResBlock being ``x + SiLU(linear(x))`` with a biased ``linear``. Its
  config.json is the base model's with a ``"medusa": {"num_medusa_heads",
  "num_medusa_layers"}`` block. ModelOpt saves the whole model (base + heads);
  we save the heads only, and ``load_heads`` reads either.
* EAGLE-3: the draft-only directory of ModelOpt's ``EagleExporter``
  (``modelopt/torch/export/plugins/hf_spec_export.py``): ``fc``,
  ``layers.{i}.*`` (Llama decoder layers; layer 0 has ``hidden_norm`` and
  2*hidden-wide q/k/v inputs), ``norm``, ``lm_head`` (and ``d2t`` when the
  draft vocabulary is smaller), with an ``"architectures":
  ["LlamaForCausalLMEagle3"]`` config carrying ``eagle_config.
  eagle_aux_hidden_state_layer_ids``. Older ModelOpt exports and the official
  EAGLE-3 checkpoints name layer 0 ``midlayer.*`` (``midlayer.{i}.*`` for
  several); those load too.

Cross-checked with TensorRT-LLM's Medusa checkpoint reader (the same
``medusa_heads.{i}.{j}.linear.*`` names for ModelOpt checkpoints) and vLLM's
EAGLE-3 loader (``midlayer.`` read as ``layers.0.``; aux layer ids from
``eagle_config``). Nothing was copied from any of them.

* P-EAGLE (parallel drafting): an EAGLE-3 draft directory as above plus the tensor ``mask_hidden`` (the learned
  placeholder features, [1, 1, num_aux * hidden] as vLLM speculators' P-EAGLE saves it; [num_aux * hidden] or an
  already fused [hidden] read too) and the config keys ``ptd_token_id`` (the token whose embedding placeholders read,
  vLLM's name) and ``para_depths`` (drafting positions it was trained for). Ours adds ``peagle_placeholders``:
  "anchored" when ``mask_hidden`` is [1, placeholders, num_aux * hidden], one vector per depth added to the anchor's
  features (train/peagle.py); absent, vLLM's one constant placeholder. ``specdec_train.peagle_truth_tokens`` true
  marks a bound trained with its placeholders reading the true tokens: refused, it cannot draft.

This module needs numpy only (no torch): the builder reads heads with it.
docs/train-heads.md documents the same layout for people.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .config_strings import shown_value
from .errors import CheckpointError
from .hf_config import INT32_MAX, ConfigFields
from .safetensors_io import SafetensorsFile

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
EAGLE3_ARCHITECTURE = "LlamaForCausalLMEagle3"
MEDUSA_PREFIX = "medusa_heads."
MASK_HIDDEN = "mask_hidden"  # P-EAGLE's placeholder features
D2T, T2D = "d2t", "t2d"  # EAGLE-3's draft vocabulary: draft id i scores target id i + d2t[i]; t2d marks those target ids
PTD_TOKEN_KEY = "ptd_token_id"  # P-EAGLE: the placeholders' token (vLLM's parallel-drafting config key)
PEAGLE_DEPTHS_KEY = "para_depths"  # P-EAGLE: drafting positions trained (speculators' name)
TRUTH_TOKENS_KEY = "peagle_truth_tokens"  # ours, in specdec_train: a bound trained on the true tokens, which cannot draft
REFINE_KEY = "peagle_refine"  # ours, in specdec_train: half its blocks trained reading the true tokens (it drafts blind too)
PLACEHOLDERS_KEY = "peagle_placeholders"  # ours: "anchored" (a vector per depth added to the anchor's features); absent: vLLM's "constant"
PLACEHOLDER_FORMS = ("constant", "anchored")

# ModelOpt's eagle_config fields (its export template), with the values an EAGLE-3 module trained here has.
EAGLE_CONFIG_DEFAULTS = {
    "use_aux_hidden_state": True,
    "use_input_layernorm_in_first_layer": True,
    "use_last_layernorm": True,
    "use_mtp_layernorm": False,
    "next_layer_regular": True,
    "parallel_draft_step": 1,
    "parallel_draft_heads_num_layers": 1,
}


def default_eagle_aux_layer_ids(num_layers: int) -> list[int]:
    """ModelOpt's default EAGLE-3 layers: ``sorted({1, max(0, L//2 - 1), max(0, L - 4)})`` (low, middle, high).

    Its rule names layer 1 even when the base has one layer; we clamp to the last
    layer there, so every id exists (L=1 -> [0], L=2 -> [0, 1], L=6 -> [1, 2], L=32 -> [1, 15, 28]).
    """
    if num_layers < 1:
        raise CheckpointError(f"the base model has {num_layers} layers; EAGLE needs at least one.")
    return sorted({min(1, num_layers - 1), max(0, num_layers // 2 - 1), max(0, num_layers - 4)})


def medusa_tensor_names(num_heads: int, num_layers: int) -> list[str]:
    """Every tensor of ``num_heads`` Medusa heads of ``num_layers`` ResBlocks (ModelOpt's nn.Sequential indices)."""
    names = []
    for i in range(num_heads):
        for j in range(num_layers):
            names += [f"medusa_heads.{i}.{j}.linear.weight", f"medusa_heads.{i}.{j}.linear.bias"]
        names.append(f"medusa_heads.{i}.{num_layers}.weight")  # the head's own LM head
    return names


def eagle_tensor_names(num_layers: int, with_d2t: bool = False) -> list[str]:
    """Every tensor of an EAGLE-3 module of ``num_layers`` decoder layers, as ModelOpt's EagleExporter writes them."""
    names = ["fc.weight", "layers.0.hidden_norm.weight"]
    for i in range(num_layers):
        p = f"layers.{i}."
        names += [p + "input_layernorm.weight", p + "post_attention_layernorm.weight"]
        names += [p + f"self_attn.{x}_proj.weight" for x in "qkvo"]
        names += [p + f"mlp.{x}_proj.weight" for x in ("gate", "up", "down")]
    names += ["norm.weight", "lm_head.weight"] + (["d2t"] if with_d2t else [])
    return names


def legacy_eagle_name(name: str, num_layers: int) -> str:
    """``midlayer.*`` (one layer) / ``midlayer.{i}.*`` (several) -> ModelOpt's current ``layers.{i}.*``."""
    if num_layers == 1 and name.startswith("midlayer."):
        return "layers.0." + name[len("midlayer."):]
    return re.sub(r"^midlayers?\.(\d+)\.", r"layers.\1.", name)


@dataclass
class HeadCheckpoint:
    """What ``load_heads`` returns: the mode, the config, and float32 tensors under ModelOpt's names."""

    mode: str  # "medusa" | "eagle" | "peagle"
    path: Path
    config: dict
    tensors: dict[str, np.ndarray]  # float32, except d2t (int64) and t2d (bool)
    hidden_size: int
    vocab_size: int
    num_heads: int = 0  # medusa
    num_layers: int = 0  # medusa: ResBlocks per head; eagle: decoder layers
    aux_layer_ids: list[int] = field(default_factory=list)  # eagle, peagle
    mask_token_id: int | None = None  # peagle: ptd_token_id
    parallel_depths: int = 0  # peagle: para_depths (0: not recorded)
    placeholder_form: str = "constant"  # peagle: "constant" (vLLM's: one vector in place of features) | "anchored" (ours)

    def draft_targets(self) -> np.ndarray | None:
        """EAGLE-3 / P-EAGLE with a draft vocabulary of its own (``d2t``): the target token id of each draft id,
        [draft_vocab] int64 (``lm_head`` row i scores target token ``i + d2t[i]``, EAGLE-3's and vLLM's convention),
        checked distinct and in range at load. None: lm_head scores the whole vocabulary in order."""
        d2t = self.tensors.get(D2T)
        return None if d2t is None else _d2t_targets(d2t)

    def target_columns(self) -> np.ndarray | None:
        """The module's logits spread over the target's vocabulary, as a column map: [vocab] int64, target id t's draft id
        (its lm_head row), or draft_vocab (a -inf column past the last row) where the module cannot draft t. None: no
        draft vocabulary of its own. builder/eagle.py gathers the ONNX graph's logits with it, the torch engine stores it."""
        targets = self.draft_targets()
        if targets is None:
            return None
        column = np.full(self.vocab_size, len(targets), np.int64)
        column[targets] = np.arange(len(targets), dtype=np.int64)
        return column

    def placeholder_features(self) -> np.ndarray:
        """P-EAGLE: fc(mask_hidden) [placeholder vectors, hidden]: each depth's vector in the fused space (anchored: one
        per depth, the last for deeper ones, added to the anchor's features; constant: one, in place of features)."""
        m = self.tensors[MASK_HIDDEN]  # [vectors, num_aux * hidden or hidden]
        return m if m.shape[1] == self.hidden_size else (m @ self.tensors["fc.weight"].T).astype(np.float32)


def _read_config(d: Path) -> dict:
    f = d / CONFIG_FILE
    if not f.is_file():
        raise CheckpointError(f"{d} has no {CONFIG_FILE}: not a Medusa/EAGLE head checkpoint (see docs/train-heads.md).")
    try:
        cfg = json.loads(f.read_text())
    except (OSError, ValueError) as err:
        raise CheckpointError(f"{f} is not valid JSON ({err}).") from err
    if not isinstance(cfg, dict):
        raise CheckpointError(f"{f} holds {type(cfg).__name__}, expected a JSON object.")
    return cfg


def _weight_files(d: Path) -> list[Path]:
    """model.safetensors, or the shards an index names, or every *.safetensors. Never pickles."""
    if (d / WEIGHTS_FILE).is_file():
        return [d / WEIGHTS_FILE]
    if (d / INDEX_FILE).is_file():
        try:
            weight_map = json.loads((d / INDEX_FILE).read_text())["weight_map"]
        except (OSError, ValueError, KeyError, TypeError) as err:
            raise CheckpointError(f"{d / INDEX_FILE} is not a safetensors index ({err}).") from err
        return [d / f for f in sorted(set(weight_map.values()))]
    files = sorted(d.glob("*.safetensors"))
    if not files:
        pickles = sorted(p.name for p in d.glob("*.bin")) + sorted(p.name for p in d.glob("*.pt"))
        hint = f" ({', '.join(pickles)} are pickles, which specdec never loads: re-save them as safetensors)" if pickles else ""
        raise CheckpointError(f"{d} has no .safetensors weights{hint}.")
    return files


def _read_tensors(d: Path, keep) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    for f in _weight_files(d):
        if not f.is_file():
            raise CheckpointError(f"{f} is named by {INDEX_FILE} but missing.")
        st = SafetensorsFile(f)
        for name in st.keys():
            if keep(name):
                code = st.dtype_name(name)
                # integers (d2t, whatever width it was exported in) as int64, bool (t2d) as bool, the rest as float32
                raw = st.raw(name) if code.startswith(("I", "U")) or code == "BOOL" else None
                if raw is not None and code == "U64" and raw.size and int(raw.max()) > np.iinfo(np.int64).max:
                    raise CheckpointError(f"{f}: {name} holds a value past int64's range: not a token map.")
                out[name] = st.float32(name) if raw is None else raw.astype(bool) if code == "BOOL" else raw.astype(np.int64)
    return out


def _int_field(cfg: dict, key: str, where: str) -> int:
    value = cfg.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= INT32_MAX:
        too_big = f" (more than {INT32_MAX})" if isinstance(value, int) and value > INT32_MAX else ""
        raise CheckpointError(f"{where}: {key} must be a positive integer, found {shown_value(value, 40)}{too_big}.")
    return value


def _check_tensors(found: dict[str, np.ndarray], expected: dict[str, tuple[int, ...]], where: str, optional: set[str] = frozenset()) -> None:
    missing = [n for n in expected if n not in found and n not in optional]
    if missing:
        more = f" (and {len(missing) - 3} more)" if len(missing) > 3 else ""
        raise CheckpointError(f"{where}: missing tensor(s) {', '.join(missing[:3])}{more}; the config promises them.")
    unexpected = sorted(set(found) - set(expected))
    if unexpected:
        raise CheckpointError(f"{where}: unexpected tensor {unexpected[0]!r}; it does not belong to the layout its config describes.")
    for name, shape in expected.items():
        if name in found and tuple(found[name].shape) != tuple(shape):
            raise CheckpointError(f"{where}: {name} has shape {list(found[name].shape)}, expected {list(shape)} from config.json.")


def _load_medusa(d: Path, cfg: dict) -> HeadCheckpoint:
    where = f"Medusa heads in {d}"
    block = cfg["medusa"]
    if not isinstance(block, dict):
        raise CheckpointError(f"{where}: config.json's \"medusa\" must be an object with num_medusa_heads and num_medusa_layers.")
    heads = _int_field(block, "num_medusa_heads", where)
    layers = block.get("num_medusa_layers")
    if not isinstance(layers, int) or isinstance(layers, bool) or not 0 <= layers <= INT32_MAX:
        raise CheckpointError(f"{where}: num_medusa_layers must be an integer >= 0, found {shown_value(layers, 40)}.")
    hidden, vocab = _int_field(cfg, "hidden_size", where), _int_field(cfg, "vocab_size", where)
    tensors = _read_tensors(d, lambda n: n.startswith(MEDUSA_PREFIX))
    expected = {}
    for i in range(heads):
        for j in range(layers):
            expected[f"medusa_heads.{i}.{j}.linear.weight"] = (hidden, hidden)
            expected[f"medusa_heads.{i}.{j}.linear.bias"] = (hidden,)
        expected[f"medusa_heads.{i}.{layers}.weight"] = (vocab, hidden)
    _check_tensors(tensors, expected, where)
    return HeadCheckpoint("medusa", d, cfg, tensors, hidden, vocab, num_heads=heads, num_layers=layers)


def _load_eagle(d: Path, cfg: dict) -> HeadCheckpoint:
    where = f"EAGLE module in {d}"
    eagle = cfg.get("eagle_config")
    if not isinstance(eagle, dict):
        raise CheckpointError(f"{where}: config.json has no \"eagle_config\" object (ModelOpt's EAGLE-3 export writes one).")
    layers = _int_field(cfg, "num_hidden_layers", where)
    hidden, vocab = _int_field(cfg, "hidden_size", where), _int_field(cfg, "vocab_size", where)
    heads, kv_heads = _int_field(cfg, "num_attention_heads", where), _int_field(cfg, "num_key_value_heads", where)
    inter = _int_field(cfg, "intermediate_size", where)
    fields = ConfigFields(cfg, f"{d / CONFIG_FILE}")
    head_dim = fields.int("head_dim", hidden // heads)
    draft_vocab = fields.int("draft_vocab_size", vocab)
    fields.number("rms_norm_eps", 1e-6)  # read by the module's engine (builder/eagle.py)
    if not eagle.get("use_aux_hidden_state", False):
        raise CheckpointError(f"{where}: eagle_config.use_aux_hidden_state is false (EAGLE-1); only EAGLE-3 modules are supported.")
    aux = eagle.get("eagle_aux_hidden_state_layer_ids")
    if not isinstance(aux, list) or not aux or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in aux):
        raise CheckpointError(f"{where}: eagle_config.eagle_aux_hidden_state_layer_ids must be a non-empty list of layer indices, found {aux!r}.")
    if draft_vocab > vocab:
        raise CheckpointError(f"{where}: draft_vocab_size {draft_vocab} exceeds vocab_size {vocab}.")
    raw = _read_tensors(d, lambda n: True)
    tensors = {legacy_eagle_name(n, layers): t for n, t in raw.items()}
    parallel = MASK_HIDDEN in tensors or PTD_TOKEN_KEY in cfg
    mask_token = depths = None
    if parallel:
        where = f"P-EAGLE module in {d}"
        if MASK_HIDDEN not in tensors:
            raise CheckpointError(f"{where}: config.json names {PTD_TOKEN_KEY} but model.safetensors has no {MASK_HIDDEN} tensor.")
        form = cfg.get(PLACEHOLDERS_KEY, "constant")
        if form not in PLACEHOLDER_FORMS:
            raise CheckpointError(f"{where}: {PLACEHOLDERS_KEY} is {shown_value(form, 40)}; expected one of {', '.join(PLACEHOLDER_FORMS)}.")
        mask = tensors[MASK_HIDDEN]
        rows = mask.size // mask.shape[-1] if mask.ndim and mask.shape[-1] else 0
        anchored_ok = (form == "anchored" and mask.ndim in (2, 3) and mask.shape[-1] == len(aux) * hidden and rows >= 1
                       and (mask.ndim == 2 or mask.shape[0] == 1))
        constant_ok = form == "constant" and mask.shape[-1] in (len(aux) * hidden, hidden) and rows == 1
        if not (anchored_ok or constant_ok):
            want = f"[1, placeholders, {len(aux) * hidden}]" if form == "anchored" else f"[1, 1, {len(aux) * hidden}] (or [{hidden}], already fused)"
            raise CheckpointError(f"{where}: {MASK_HIDDEN} has shape {list(mask.shape)}, expected {want} for {form} placeholders.")
        tensors[MASK_HIDDEN] = mask.reshape(rows, mask.shape[-1])  # [placeholder vectors, width]
        if PTD_TOKEN_KEY not in cfg:
            raise CheckpointError(f"{where}: config.json has no {PTD_TOKEN_KEY} (the token whose embedding placeholders read).")
        mask_token = fields.int(PTD_TOKEN_KEY, minimum=0, maximum=vocab - 1)
        depths = fields.int(PEAGLE_DEPTHS_KEY, 0, minimum=0)
        trained = cfg.get("specdec_train")
        if isinstance(trained, dict) and trained.get(TRUTH_TOKENS_KEY):
            raise CheckpointError(f"{where}: trained with its placeholders reading the true tokens ({TRUTH_TOKENS_KEY}, "
                                  "examples/train_heads.py --peagle-truth-tokens): a bound for benchmarks/peagle_replay.py, it cannot draft "
                                  "(a drafter has no true tokens to read). Train one without --peagle-truth-tokens.")
    expected: dict[str, tuple[int, ...]] = {"fc.weight": (hidden, len(aux) * hidden), "layers.0.hidden_norm.weight": (hidden,)}
    for i in range(layers):
        p, width = f"layers.{i}.", 2 * hidden if i == 0 else hidden  # layer 0 attends over [embedding, fused hidden]
        expected |= {p + "input_layernorm.weight": (hidden,), p + "post_attention_layernorm.weight": (hidden,),
                     p + "self_attn.q_proj.weight": (heads * head_dim, width), p + "self_attn.k_proj.weight": (kv_heads * head_dim, width),
                     p + "self_attn.v_proj.weight": (kv_heads * head_dim, width), p + "self_attn.o_proj.weight": (hidden, heads * head_dim),
                     p + "mlp.gate_proj.weight": (inter, hidden), p + "mlp.up_proj.weight": (inter, hidden),
                     p + "mlp.down_proj.weight": (hidden, inter)}
    expected |= {"norm.weight": (hidden,), "lm_head.weight": (draft_vocab, hidden), D2T: (draft_vocab,), T2D: (vocab,)}
    if parallel:
        expected[MASK_HIDDEN] = tensors[MASK_HIDDEN].shape
    # d2t is required with a smaller draft vocabulary, allowed with a full one (a reordering); t2d, its inverse mask, optional
    _check_tensors(tensors, expected, where, optional={T2D} | (set() if draft_vocab < vocab else {D2T}))
    _check_draft_vocabulary(tensors, vocab, where)
    if parallel:
        return HeadCheckpoint("peagle", d, cfg, tensors, hidden, vocab, num_layers=layers, aux_layer_ids=list(aux), mask_token_id=mask_token,
                              parallel_depths=depths, placeholder_form=form)
    return HeadCheckpoint("eagle", d, cfg, tensors, hidden, vocab, num_layers=layers, aux_layer_ids=list(aux))


def _d2t_targets(d2t: np.ndarray) -> np.ndarray:
    """d2t's delta map as absolute ids: draft id i -> target id i + d2t[i]."""
    return np.arange(len(d2t), dtype=np.int64) + d2t


def _check_draft_vocabulary(tensors: dict[str, np.ndarray], vocab: int, where: str) -> None:
    """d2t must send every draft id to its own target id in [0, vocab): vLLM indexes with it unchecked, and a negative or
    repeated target there drafts from the wrong rows without a word. t2d, when present, must mark exactly those ids."""
    d2t, t2d = tensors.get(D2T), tensors.get(T2D)
    if d2t is not None and d2t.dtype.kind != "i":  # _read_tensors read it as float32: it was stored as floats
        raise CheckpointError(f"{where}: {D2T} is stored as floating point; it must hold integers (draft id + {D2T}[id] = target id).")
    if t2d is not None and t2d.dtype.kind == "i" and np.isin(t2d, (0, 1)).all():
        t2d = tensors[T2D] = t2d.astype(bool)  # a 0/1 integer mask
    if t2d is not None and t2d.dtype.kind != "b":
        raise CheckpointError(f"{where}: {T2D} must be a bool (or 0/1) mask over the vocabulary; it holds {t2d.dtype} values.")
    if d2t is None:
        if t2d is not None:
            raise CheckpointError(f"{where}: {T2D} without {D2T}: the draft vocabulary's map to target ids is missing.")
        return
    targets = _d2t_targets(d2t)
    bad = np.flatnonzero((targets < 0) | (targets >= vocab))
    if len(bad):
        i = int(bad[0])
        raise CheckpointError(f"{where}: {D2T} sends draft id {i} to target id {int(targets[i])} (draft id + {D2T}[id]), outside the "
                              f"vocabulary [0, {vocab}); {len(bad)} such id(s).")
    seen = np.zeros(vocab, bool)
    seen[targets] = True
    if int(seen.sum()) != len(targets):
        dup = int(targets[np.flatnonzero(np.bincount(targets, minlength=vocab)[targets] > 1)[0]])
        raise CheckpointError(f"{where}: {D2T} sends two draft ids to target id {dup}: each target token needs one row of lm_head.")
    if t2d is not None and not np.array_equal(t2d, seen):
        raise CheckpointError(f"{where}: {T2D} does not mark the target ids {D2T} maps to ({int(t2d.sum())} marked, {len(targets)} mapped).")


def head_kind(cfg: object) -> str | None:
    """What a parsed config.json describes: "medusa" (a "medusa" block), "eagle" (an EAGLE-3 or P-EAGLE module: its
    architecture or an "eagle_config"), or None (not draft heads: a base model, say)."""
    if not isinstance(cfg, dict):
        return None
    if "medusa" in cfg:
        return "medusa"
    archs = cfg.get("architectures")
    return "eagle" if (isinstance(archs, list) and EAGLE3_ARCHITECTURE in archs) or "eagle_config" in cfg else None


def load_heads(path: str | Path, base_num_layers: int | None = None) -> HeadCheckpoint:
    """Read a Medusa, EAGLE-3 or P-EAGLE head checkpoint in ModelOpt's layout (safetensors only) and check it against its config.

    ``base_num_layers``, when given, also checks that EAGLE's auxiliary layer ids exist in the base model.
    Raises CheckpointError with what is wrong and what was expected.
    """
    d = Path(path)
    if not d.is_dir():
        raise CheckpointError(f"head checkpoint {d} does not exist or is not a directory.")
    cfg = _read_config(d)
    kind = head_kind(cfg)
    if kind == "medusa":
        return _load_medusa(d, cfg)
    if kind == "eagle":
        ckpt = _load_eagle(d, cfg)
        if base_num_layers is not None and max(ckpt.aux_layer_ids) >= base_num_layers:
            what = "P-EAGLE" if ckpt.mode == "peagle" else "EAGLE"
            raise CheckpointError(f"{what} module in {d}: aux layer ids {ckpt.aux_layer_ids} name layers the {base_num_layers}-layer base model "
                                  "lacks.")
        return ckpt
    raise CheckpointError(f"{d / CONFIG_FILE} describes neither Medusa heads (a \"medusa\" block) nor an EAGLE-3 module "
                          f"(architectures [\"{EAGLE3_ARCHITECTURE}\"] with an \"eagle_config\"); see docs/train-heads.md.")
