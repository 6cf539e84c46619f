"""specdec-bench's datasets: TensorRT-LLM's prepare_dataset semantics, as JSON lines.

Datasets are JSON lines, one request each::

    {"task_id": 0, "input_ids": [17, 4, ...], "output_len": 128}

``prepare_synthetic`` is TensorRT-LLM's ``token-norm-dist``: input and output
lengths drawn from normal distributions, rounded up and clipped to >= 1, token
ids uniform over the vocabulary minus the special ids. Same seed, same file.
``prepare_from_jsonl`` turns ``{"prompt": str}`` or ``{"input_ids": [...]}``
lines (``output_len``, or TensorRT-LLM's ``output_tokens``, optional) into the
same format.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..formats.errors import RequestError, big_int
from ..formats.jsonl import json_lines

Record = dict[str, Any]  # {"input_ids": list[int], "output_len": int}
# What one dataset may ask for: past these it would not fit in memory (2**26 prompt tokens are 512 MiB as
# int64 and more as JSON), and no tokenizer has 2**24 ids. A benchmark needs far less.
MAX_REQUESTS = 2**20
MAX_PROMPT_TOKENS = 2**26
MAX_VOCAB = 2**24


def norm_dist_lengths(mean: float, stdev: float, n: int, rng: np.random.Generator) -> list[int]:
    """TensorRT-LLM's get_norm_dist_lengths: normal draws, rounded up, at least 1."""
    return [max(1, math.ceil(x)) for x in rng.normal(loc=mean, scale=stdev, size=n).tolist()]


def _check_seed(seed: int) -> None:
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise RequestError(f"--random_seed={seed} must be an integer >= 0.")


def _check_dist(name: str, mean: float | None, stdev: float) -> None:
    if mean is None or not math.isfinite(mean) or mean < 1:
        raise RequestError(f"--{name}_mean={mean} must be >= 1 (tokens).")
    if not math.isfinite(stdev) or stdev < 0:
        raise RequestError(f"--{name}_stdev={stdev} must be >= 0 (0: every request gets exactly --{name}_mean tokens).")


def prepare_synthetic(
    num_requests: int,
    input_mean: float,
    input_stdev: float,
    output_mean: float,
    output_stdev: float,
    vocab_size: int,
    seed: int = 0,
    special_ids: Iterable[int] = (),
) -> list[Record]:
    """Random-token requests with normally distributed lengths (TensorRT-LLM's token-norm-dist)."""
    if not 1 <= num_requests <= MAX_REQUESTS:
        raise RequestError(f"--num_requests={num_requests} must be " + (">= 1." if num_requests < 1 else f"at most {MAX_REQUESTS}."))
    _check_dist("input", input_mean, input_stdev)
    _check_dist("output", output_mean, output_stdev)
    if not 1 <= vocab_size <= MAX_VOCAB:
        raise RequestError(f"--vocab_size={vocab_size} must be " + (">= 1." if vocab_size < 1 else f"at most {MAX_VOCAB}."))
    _check_seed(seed)
    allowed = np.setdiff1d(np.arange(vocab_size, dtype=np.int64), np.asarray(sorted(set(special_ids)), dtype=np.int64))
    if len(allowed) == 0:
        raise RequestError(f"every id of the vocabulary [0, {vocab_size}) is a special id: no token left to draw prompts from.")
    rng = np.random.default_rng(seed)
    in_lens = norm_dist_lengths(input_mean, input_stdev, num_requests, rng)
    out_lens = norm_dist_lengths(output_mean, output_stdev, num_requests, rng)
    if sum(in_lens) > MAX_PROMPT_TOKENS:
        raise RequestError(f"--num_requests {num_requests} prompts of --input_mean {input_mean:g} tokens make {_count(sum(in_lens))} prompt tokens, "
                           f"more than one dataset holds ({MAX_PROMPT_TOKENS}); ask for fewer or shorter prompts.")
    return [
        {"input_ids": allowed[rng.integers(0, len(allowed), size=n_in)].tolist(), "output_len": n_out}
        for n_in, n_out in zip(in_lens, out_lens, strict=True)
    ]


def _count(n: int) -> str:
    """1e+12 as before; past float's range (a --input_mean of 1e308) without the float that would overflow."""
    return f"{n:.3g}" if n < 10**300 else big_int(n)


def _ids(value: Any, where: str) -> list[int]:
    if not isinstance(value, list) or not value or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in value):
        raise RequestError(f"{where}: input_ids must be a non-empty list of token ids >= 0.")
    return value


def jsonl_values(path: Path) -> Iterator[tuple[str, Any]]:
    """(``path:line``, parsed value) of each non-blank line; a file or line we cannot read is a RequestError."""
    return json_lines(path)


def prepare_from_jsonl(
    path: str | Path,
    tokenizer: Any = None,
    output_mean: float | None = None,
    output_stdev: float = 0.0,
    seed: int = 0,
    add_special_tokens: bool = True,
) -> list[Record]:
    """Read ``{"prompt": str}`` / ``{"input_ids": [...]}`` lines, each with an optional ``output_len``.

    Lines without one get a length drawn from normal(output_mean, output_stdev) with ``seed``
    (exactly output_mean when output_stdev is 0). ``tokenizer`` (anything with ``encode``) is
    needed only for prompt lines.
    """
    path = Path(path)
    if not path.is_file():
        raise RequestError(f"dataset {path} does not exist.")
    if output_mean is not None:
        _check_dist("output", output_mean, output_stdev)
    _check_seed(seed)
    rng = np.random.default_rng(seed)
    records: list[Record] = []
    for where, item in jsonl_values(path):
        if not isinstance(item, dict):
            raise RequestError(f"{where}: expected an object with \"prompt\" or \"input_ids\".")
        if "input_ids" in item:
            ids = _ids(item["input_ids"], where)
        elif isinstance(item.get("prompt"), str):
            if tokenizer is None:
                raise RequestError(f"{where} has a text prompt but there is no tokenizer: pass --tokenizer_dir, or give input_ids.")
            ids = tokenizer.encode(item["prompt"], add_special_tokens=add_special_tokens)
            if not ids:
                raise RequestError(f"{where}: the prompt encodes to no tokens.")
        else:
            raise RequestError(f"{where}: expected \"prompt\" (a string) or \"input_ids\" (a list of token ids).")
        n = item.get("output_len", item.get("output_tokens"))
        if n is None:
            if output_mean is None:
                raise RequestError(f"{where} has no output_len: add one, or give a default output length (--output_mean / --max_output_len).")
            n = norm_dist_lengths(output_mean, output_stdev, 1, rng)[0]
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise RequestError(f"{where}: output_len={n!r} must be an integer >= 1.")
        records.append({"input_ids": [int(x) for x in ids], "output_len": n})
    if not records:
        raise RequestError(f"dataset {path} has no requests.")
    return records


def dumps_dataset(records: Sequence[Record]) -> str:
    """The dataset file's text: one compact JSON line per request (deterministic bytes)."""
    return "".join(
        json.dumps({"task_id": i, "input_ids": r["input_ids"], "output_len": r["output_len"]}, separators=(",", ":")) + "\n"
        for i, r in enumerate(records)
    )


def special_token_ids(tokenizer: Any) -> list[int]:
    """Ids a synthetic prompt should not contain: the tokenizer's special added tokens, BOS/EOS/PAD/UNK."""
    ids: set[int] = set()
    directory = getattr(tokenizer, "directory", None)
    if directory is not None and (Path(directory) / "tokenizer.json").is_file():
        data = json.loads((Path(directory) / "tokenizer.json").read_text(encoding="utf-8"))
        ids |= {int(t["id"]) for t in data.get("added_tokens", []) if t.get("special")}
    config = getattr(tokenizer, "config", None) or {}
    vocab = tokenizer.vocab() if hasattr(tokenizer, "vocab") else {}
    for key in ("bos_token", "eos_token", "pad_token", "unk_token"):
        value = config.get(key)
        value = value.get("content") if isinstance(value, dict) else value
        if isinstance(value, str) and value in vocab:
            ids.add(int(vocab[value]))
    return sorted(ids)


def check_fits(records: Sequence[Record], max_input_len: int, max_seq_len: int) -> None:
    """Every request must fit the engines, or it would stop short of its output_len."""
    for i, r in enumerate(records):
        n_in, n_out = len(r["input_ids"]), r["output_len"]
        if n_in > max_input_len:
            raise RequestError(
                f"request {i} has {n_in} input tokens, more than the engines' max_input_len={max_input_len}. "
                "Prepare the dataset with a smaller --input_mean/--input_stdev, or rebuild with a larger --max_input_len."
            )
        if n_in + n_out > max_seq_len:
            raise RequestError(
                f"request {i} needs {n_in} input + {n_out} output = {n_in + n_out} tokens, more than the engines' max_seq_len={max_seq_len}. "
                "Prepare the dataset with smaller lengths, or rebuild with a larger --max_seq_len."
            )
