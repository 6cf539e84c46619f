"""benchmarks/bench_drafters.py's oracle: which output tokens any suffix drafter could draft, and the speedup a
drafter that drafts exactly those would reach (the bound docs/benchmarks.md holds suffix decoding to)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))  # bench_drafters imports prompts.py from beside it
_spec = importlib.util.spec_from_file_location("bench_drafters", ROOT / "benchmarks" / "bench_drafters.py")
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)


def test_predictable_tokens_come_from_earlier_responses_their_prompt_tails_or_the_own_text():
    prompts = [[1, 2, 3], [9, 2, 3], [4, 4]]
    outputs = [[7, 8, 7, 8], [7, 8, 5], [4, 6]]
    flags = bench.predictable(prompts, outputs, tail=2)
    # request 0: nothing earlier; its second 8 followed a 7 before in its own text (its second 7 had no 8-then-7 to follow)
    assert flags[0] == [(False, False), (False, False), (False, False), (False, True)]
    # request 1 ends its prompt with "2 3" as request 0 did: request 0's response follows from the first token
    assert flags[1][:2] == [(True, False), (True, False)]
    assert flags[1][2] == (False, False)  # after "7 8" request 0 went on with 7, not 5
    # with the responses alone (tail 0) the first token has nothing to match
    assert bench.predictable(prompts, outputs, tail=0)[1][0] == (False, False)
    # request 2: 4 followed 4 in its own prompt, not 6
    assert flags[2] == [(False, True), (False, False)]
    shares = bench.oracle(flags)
    assert shares["either"] == pytest.approx(4 / 9) and shares["own"] == pytest.approx(2 / 9) and shares["global"] == pytest.approx(2 / 9)


def test_a_perfect_drafter_drafts_each_predictable_run_in_one_call():
    yes, no = (True, False), (False, False)
    flags = [[no, yes, yes, yes, no], [yes, yes]]
    costs = {1: 1.0, 2: 1.1, 3: 1.2, 4: 1.3}
    # token 0 of each row comes with the prefill. Row 0: one call drafts tokens 1-3 and computes token 4 (a call of
    # 4 tokens); row 1: token 1 is the last, computed by a call of its own with nothing left to draft
    got = bench.perfect_drafter(flags, costs, k=8, own_only=False)
    assert got["tokens_per_call"] == pytest.approx(5 / 2)
    assert got["decode_speedup"] == pytest.approx(5 / (1.3 + 1.0))
    # at most k drafts a call: row 0 takes two calls of 2 tokens
    assert bench.perfect_drafter(flags, costs, k=1, own_only=False)["tokens_per_call"] == pytest.approx(5 / 3)
    # a drafter of the own text only sees none of these (they are predictable from elsewhere)
    assert bench.perfect_drafter(flags, costs, k=8, own_only=True) == {"tokens_per_call": 1.0, "decode_speedup": 1.0}


def test_first_difference_names_the_token_and_the_targets_logits_there(tmp_path):
    """bench_drafters explains an output that leaves target-only's: where, both tokens' logits there, their gap and
    the rank of the other token (a near-tie is what a half-precision verification may order either way; a bug is not)."""
    import numpy as np
    from conftest import spec_build

    from specdec.builder.build import build_engine
    from specdec.runtime import GenerationConfig, load_engine

    build_engine(ROOT / "examples" / "demo-pair" / "target", tmp_path / "t", spec_build(4), say=lambda _: None)
    engine = load_engine(tmp_path / "t", method="none", draft_len=0)
    tex, prompt = engine.target, [5, 6, 7, 8]
    want, *_ = bench.one(engine, prompt, GenerationConfig(max_output_len=6))  # target-only's greedy output
    assert bench.first_difference(tex, prompt, want, list(want)) is None
    assert bench.first_difference(tex, prompt, want, want[:3]) == {"at": 3, "length_only": True}
    logits = tex.forward(tex.new_cache(1), [prompt + want[:2]], all_logits=False).logits[0, -1]
    third = int(np.argsort(logits)[-3])  # the third most likely token after the agreed two
    d = bench.first_difference(tex, prompt, want, want[:2] + [third] + want[3:])
    # the recomputed logits are those that chose want[2] (greedy): an off-by-one would compare the wrong position
    assert (d["at"], d["want"], d["got"], d["got_rank"]) == (2, want[2], third, 3)
    assert d["want_logit"] == pytest.approx(float(logits.max()), abs=1e-5) and d["got_logit"] == pytest.approx(float(logits[third]), abs=1e-5)
    assert d["relative_gap"] == pytest.approx(float((logits.max() - logits[third]) / np.abs(logits).max()), abs=1e-6)


@pytest.mark.parametrize("argv,expected", [
    (["speed", "--target", "T", "--temperature", "-1"], "--temperature must be >= 0"),
    (["speed", "--target", "T", "--temperature", "0.7", "--llama_lookup", "B", "--gguf", "G"], "only without --llama_lookup"),
])
def test_a_sampled_speed_run_is_refused_where_it_cannot_hold(monkeypatch, argv, expected):
    """--temperature: a negative one, or llama.cpp's greedy runs beside sampled ones, refused before anything runs."""
    monkeypatch.setattr(sys, "argv", ["bench_drafters.py", *argv])
    monkeypatch.setattr(bench, "speed", lambda args: pytest.fail("ran"))
    with pytest.raises(SystemExit, match=expected):
        bench.main()
