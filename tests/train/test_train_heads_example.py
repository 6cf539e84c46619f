"""examples/train_heads.py's prompt drawing: --more-prompts keeps the smaller set and its held-out split, and
--reuse-data only keeps answers to the prompts drawn."""

from __future__ import annotations

import importlib.util
import json
import random
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("train_heads", ROOT / "examples" / "train_heads.py")
train_heads = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(train_heads)


def corpus(prefix: str, files: int) -> list[tuple[str, str]]:
    return [(f"{prefix}{f}.py", "\n".join(f"{prefix} file {f} line {i}" for i in range(40))) for f in range(files)]


TRAIN, HELDOUT = corpus("train", 30), corpus("heldout", 5)


def test_more_prompts_extend_the_smaller_set_and_keep_its_held_out_split():
    small = train_heads.draw_prompts(TRAIN, HELDOUT, 20, 6, 0, seed=0)
    large = train_heads.draw_prompts(TRAIN, HELDOUT, 20, 6, 50, seed=0)
    assert len(small["prompts"]) == 20 and len(large["prompts"]) == 70
    assert large["prompts"][:20] == small["prompts"]
    assert large["eval_prompts"] == small["eval_prompts"]
    assert all(p.startswith("heldout") for p in large["eval_prompts"])
    assert all(p.startswith("train") for p in large["prompts"])
    assert train_heads.draw_prompts(TRAIN, HELDOUT, 20, 6, 0, seed=1)["prompts"] != small["prompts"]


def test_the_default_draw_is_the_shipped_heads_one():
    """Without --more-prompts the prompts and held-out snippets are what one stream seeded 0 gives, training first (how
    the shipped heads' data was drawn): an edit that reorders the draws would change every module trained again."""
    rng = random.Random(0)
    want = {"prompts": train_heads.snippets(TRAIN, 20, rng), "eval_prompts": train_heads.snippets(HELDOUT, 6, rng)}
    assert train_heads.draw_prompts(TRAIN, HELDOUT, 20, 6, 0, seed=0) == want


def test_reuse_data_keeps_only_answers_to_the_prompts_drawn(tmp_path):
    answers = tmp_path / "prompts.answers.jsonl"
    rows = [{"conversation_id": i, "conversations": [{"role": "user", "content": p}, {"role": "assistant", "content": "x"}]}
            for i, p in enumerate(["a\n", "b\n"])]
    answers.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert train_heads.answered_prompts(answers) == ["a\n", "b\n"]
    assert train_heads.reusable(answers, ["a\n", "b\n"])
    assert not train_heads.reusable(answers, ["a\n"])  # fewer prompts (another --prompts)
    assert not train_heads.reusable(answers, ["b\n", "a\n"])  # the same prompts in another order
    assert not train_heads.reusable(tmp_path / "missing.jsonl", ["a\n", "b\n"])
