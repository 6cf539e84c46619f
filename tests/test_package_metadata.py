"""pyproject.toml's description says what the package does today: every drafting method, the server, the trainer,
and that the TensorRT backend has never run on a GPU (a notice its build module gives too)."""

from __future__ import annotations

import tomllib
from pathlib import Path

from specdec.builder.backends import backend_module
from specdec.runtime.request import METHODS

ROOT = Path(__file__).resolve().parents[1]
IN_WORDS = {"draft": "draft-target", "ngram": "n-gram", "medusa": "Medusa", "eagle": "EAGLE", "peagle": "P-EAGLE",
            "suffix": "suffix decoding"}  # a method -> how prose names it


def description() -> str:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["description"]


def test_the_description_names_every_method_the_engine_has():
    assert set(IN_WORDS) == set(METHODS) - {"none"}, "a method was added: say how prose names it, and in the description"
    missing = [words for words in IN_WORDS.values() if words not in description()]
    assert not missing, f"pyproject.toml's description leaves out {missing}"


def test_the_description_names_the_server_and_the_trainer_and_what_never_ran():
    text = description()
    assert "OpenAI-compatible server" in text and "trainer" in text
    assert backend_module("tensorrt").NOTICE and "never run on a GPU" in text
