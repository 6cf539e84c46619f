"""specdec-train prepare-data: the base model answers the dataset's prompts; its answers are the training data.

Heads learn to guess what the base model will say, so the data is the base's own
output (ModelOpt's guide does the same with its prepare_data.sh). Greedy by
default: under greedy verification a draft is accepted exactly when it equals the
base's argmax, and the greedy continuation is that argmax chain, so these are the
very tokens verification will compare against. --temperature > 0 samples instead
(more varied data; the right choice when the heads will serve sampled requests).

Two generators: our own engine (``--engine_dir``: ONNX Runtime, fast, needs a
built target; cli/train.py's EngineGenerator) or transformers on the checkpoint (``--model_dir``). With both, the
engine generates and the checkpoint gives only its tokenizer: they must be the same model (check_same_model).
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from ..formats.engine_format import read_engine_config
from ..formats.errors import DeviceError, RequestError
from ..formats.sampling_params import SamplingConfig
from ..formats.tokenizer import Tokenizer
from ..hardware.cpu import check_num_threads
from .data import read_prompts, record
from .errors import TrainConfigError


@dataclass
class PrepareConfig:
    data_path: str
    output_path: str
    model_dir: str | None = None
    engine_dir: str | None = None
    max_token: int = 512  # most new tokens per answer (ModelOpt's --max_token)
    max_prompt_tokens: int | None = None  # prompts are cut to this many tokens [default: the engine's max_input_len, else 512]
    temperature: float = 0.0  # 0 = greedy
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0
    limit: int | None = None  # first N prompts only
    num_threads: int | None = None
    batch: int = 16  # prompts handed to the engine at once (it schedules them on its own slots)

    def sampling(self, index: int) -> SamplingConfig:
        """Prompt ``index``'s sampling settings (its seed: seed + index)."""
        return SamplingConfig(self.temperature, self.top_k, self.top_p, self.seed + index)

    def validate(self) -> None:
        if not self.model_dir and not self.engine_dir:
            raise TrainConfigError("give --model_dir (generate with transformers) or --engine_dir (generate with a specdec engine).")
        if self.max_token < 1:
            raise TrainConfigError(f"--max_token {self.max_token} must be >= 1.")
        if self.max_prompt_tokens is not None and self.max_prompt_tokens < 1:
            raise TrainConfigError(f"--max_prompt_tokens {self.max_prompt_tokens} must be >= 1.")
        try:  # the runtime's own checks: finite, in range, and the same greedy threshold
            self.sampling(0)
        except RequestError as err:
            raise TrainConfigError(f"--{err}") from None
        if self.limit is not None and self.limit < 1:
            raise TrainConfigError(f"--limit {self.limit} must be >= 1.")
        try:
            check_num_threads(self.num_threads)
        except DeviceError as err:
            raise TrainConfigError(str(err)) from None
        out = Path(self.output_path)
        if out.is_dir():
            raise TrainConfigError(f"--output_path {out} is a directory: give a .jsonl file name.")
        if out.suffix == ".txt":  # `run` reads a .txt as prompts to prepare, and would refuse what this writes
            raise TrainConfigError(f"--output_path {out}: the answers are JSON lines, which `run` reads from a .jsonl; give a .jsonl name.")


class Generator(Protocol):
    """prompt ids -> answer ids, for a batch of prompts: transformers on the checkpoint (TransformersGenerator, here) or
    a specdec engine (cli/train.py's EngineGenerator: running an engine is the runtime's, which train/ does not import)."""

    tokenizer: Tokenizer
    prompt_limit: int  # the longest prompt it takes, in tokens

    def answer(self, prompts: list[list[int]], first_index: int) -> list[list[int]]:
        """One answer per prompt; prompt ``i`` of the batch is the dataset's prompt ``first_index + i``."""


class TransformersGenerator:
    def __init__(self, cfg: PrepareConfig):
        import torch

        from .base import load_base

        if cfg.num_threads:
            torch.set_num_threads(cfg.num_threads)
        self.torch, self.cfg = torch, cfg
        self.tokenizer = Tokenizer(tokenizer_dir(cfg.model_dir))
        self.model = load_base(cfg.model_dir)
        positions = self.model.config.max_position_embeddings
        if cfg.max_token >= positions:  # answers past the model's positions: cut prompts to nothing and degenerate text
            raise TrainConfigError(f"--max_token {cfg.max_token} leaves no room in the model's {positions} positions for a prompt: use "
                                   f"--max_token < {positions} (its default is 512).")
        self.prompt_limit = max(1, positions - cfg.max_token)
        eos = self.tokenizer.eos_token_id
        self.eos = eos if eos is not None else self.model.config.eos_token_id

    def answer(self, prompts: list[list[int]], first_index: int) -> list[list[int]]:
        torch, cfg, out = self.torch, self.cfg, []
        sample = not cfg.sampling(0).greedy
        for k, ids in enumerate(prompts):  # one at a time: no padding to get wrong, and tiny models are fast anyway
            torch.manual_seed(cfg.seed + first_index + k)
            kwargs = dict(do_sample=True, temperature=cfg.temperature, top_k=cfg.top_k or None, top_p=cfg.top_p) if sample else dict(do_sample=False)
            with torch.no_grad():
                gen = self.model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long), max_new_tokens=cfg.max_token,
                                          eos_token_id=self.eos, pad_token_id=self.model.config.pad_token_id or 0, **kwargs)
            out.append(gen[0, len(ids):].tolist())
        return out


SAME_MODEL_KEYS = ("architectures", "vocab_size", "hidden_size", "num_hidden_layers")  # config.json's, as the engine records it


def check_same_model(model_dir: str, engine_dir: str) -> None:
    """Refuse a --model_dir that is not the --engine_dir's model: the engine generates, and the prompts would be tokenized
    with the other model's tokenizer. Compared: the checkpoint's config.json and the one the engine copied at build
    (extra.hf_config), on the keys that tell models apart. Folders that are not a checkpoint or an engine are left to the
    generator's own errors."""
    engine = read_engine_config(Path(engine_dir))
    try:
        ours = json.loads((Path(model_dir) / "config.json").read_text())
    except (OSError, ValueError):
        return
    theirs = ((engine or {}).get("extra") or {}).get("hf_config")
    if not isinstance(ours, dict) or not isinstance(theirs, dict):
        return
    for key in SAME_MODEL_KEYS:
        a, b = _config_value(ours, key), _config_value(theirs, key)
        if a is not None and b is not None and a != b:
            built_from = (engine.get("extra") or {}).get("checkpoint")
            raise TrainConfigError(f"--model_dir {model_dir} is not the model of --engine_dir {engine_dir} ({key} {a} vs {b}"
                                   f"{f'; the engine was built from {built_from}' if built_from else ''}): leave out --model_dir (the engine "
                                   "generates and has its own tokenizer), or pass the checkpoint the engine was built from.")


def _config_value(config: dict, key: str):
    """A Hugging Face config's ``key``, or its text_config's (a multimodal checkpoint's language model)."""
    text = config.get("text_config")
    return config.get(key, text.get(key) if isinstance(text, dict) else None)


def tokenizer_dir(d: str) -> str:
    if not (Path(d) / "tokenizer.json").is_file():
        raise TrainConfigError(f"{d} has no tokenizer.json: prepare-data turns text prompts into tokens with it.")
    return d


def prepare_data(cfg: PrepareConfig, say: Callable[[str], None] = print, progress_bar: bool = True,
                 generator: Callable[[PrepareConfig], Generator] | None = None) -> int:
    """Write one record per prompt to ``cfg.output_path`` (whole, or not at all); returns how many.

    ``generator``: makes the generator for ``cfg``; None: transformers on ``cfg.model_dir``. An ``engine_dir``
    needs one that runs the engine (specdec-train's CLI passes cli/train.py's EngineGenerator)."""
    cfg.validate()
    if cfg.model_dir and cfg.engine_dir:
        check_same_model(cfg.model_dir, cfg.engine_dir)
    if generator is None and cfg.engine_dir:
        raise TrainConfigError("generating with --engine_dir runs a specdec engine: use specdec-train prepare-data, or pass "
                               "generator=specdec.cli.train.EngineGenerator.")
    prompts = read_prompts(cfg.data_path)[: cfg.limit]
    gen = (generator or TransformersGenerator)(cfg)
    tok = gen.tokenizer
    limit = min(cfg.max_prompt_tokens or gen.prompt_limit, gen.prompt_limit)
    encoded = [tok.encode(p) for p in prompts]
    cut = [len(ids) > limit for ids in encoded]
    encoded = [ids[:limit] for ids in encoded]
    if any(cut):
        say(f"{sum(cut)} of {len(prompts)} prompts cut to {limit} tokens")
    out = Path(cfg.output_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", dir=out.parent)
    bar = _bar(len(prompts), progress_bar)
    tokens = 0
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            for start in range(0, len(prompts), cfg.batch):
                chunk = encoded[start : start + cfg.batch]
                for k, answer in enumerate(gen.answer(chunk, start)):
                    i = start + k
                    text = tok.decode(chunk[k]) if cut[i] else prompts[i]  # the record says what the model really saw
                    f.write(json.dumps(record(i, text, tok.decode(answer), chunk[k], answer)) + "\n")
                    tokens += len(answer)
                if bar is not None:
                    bar.update(len(chunk))
        os.replace(tmp, out)
    finally:
        if bar is not None:
            bar.close()
        if os.path.exists(tmp):
            os.unlink(tmp)
    say(f"wrote {len(prompts)} answers ({tokens} tokens, {'greedy' if cfg.sampling(0).greedy else 'sampled at temperature ' + str(cfg.temperature)}) "
        f"to {out}")
    return len(prompts)


def _bar(total: int, enabled: bool):
    if not enabled:
        return None
    from tqdm import tqdm

    return tqdm(total=total, desc="prepare-data", unit="prompt", dynamic_ncols=True)
