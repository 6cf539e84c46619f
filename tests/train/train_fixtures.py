"""Tiny real checkpoints and data for the training tests (one thread: the machine is shared).

A helper module, not a conftest.py: tests/conftest.py is imported as `conftest` by other test files,
and a second conftest.py would shadow it. Test modules import the fixtures they use from here.
"""

import json
from pathlib import Path

import pytest
import torch
from checkpoints import add_word_tokenizer, make_checkpoint

torch.set_num_threads(1)

PATTERN = [5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16]  # a cycle: every token decides the next two


def write_repetitive_data(path: Path, n: int = 24, length: int = 40) -> Path:
    """Sequences cut from a repeated 12-token cycle at different offsets: learnable two and three tokens ahead."""
    with open(path, "w") as f:
        for i in range(n):
            ids = (PATTERN * (length // len(PATTERN) + 2))[i % len(PATTERN) : i % len(PATTERN) + length]
            f.write(json.dumps({"input_ids": ids, "prompt_len": 2}) + "\n")
    return path


@pytest.fixture(scope="session")
def tiny_base(tmp_path_factory) -> Path:
    """A 4-layer Llama (so EAGLE's default layers are distinct: [0, 1]) with a word tokenizer."""
    d = tmp_path_factory.mktemp("train-base") / "base"
    return add_word_tokenizer(make_checkpoint(d, "LlamaForCausalLM", num_hidden_layers=4, tie_word_embeddings=True))


@pytest.fixture(scope="session")
def repetitive_data(tmp_path_factory) -> Path:
    return write_repetitive_data(tmp_path_factory.mktemp("train-data") / "data.jsonl")
