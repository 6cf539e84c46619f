"""examples/train_heads.py's prompt drawing: --more-prompts keeps the smaller set and its held-out split, and
--reuse-data only keeps answers to the prompts drawn."""

from __future__ import annotations

import importlib.util
import json
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


def test_answered_prompts_reads_prepare_datas_conversations(tmp_path):
    answers = tmp_path / "prompts.answers.jsonl"
    rows = [{"conversation_id": i, "conversations": [{"role": "user", "content": p}, {"role": "assistant", "content": "x"}]}
            for i, p in enumerate(["a\n", "b\n"])]
    answers.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert train_heads.answered_prompts(answers) == ["a\n", "b\n"]
