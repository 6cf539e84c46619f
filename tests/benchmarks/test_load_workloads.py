"""benchmarks/load_workloads.py's pure parts (bench_load.py workloads): the workloads' prompts, one run's figures, repeats
paired, outputs checked against the cold server's run, the goals judged. The sweep itself (two servers, 14 to 22
minutes) is not run here; results/prefix-325m-agentic-1-4.json is one, and its figures are the benchmarks page's."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
import load_workloads as lw  # noqa: E402  (a script's module, beside bench_load.py)

RESULTS = ROOT / "benchmarks" / "results" / "prefix-325m-agentic-1-4.json"


def test_the_saved_sweep_gives_the_benchmark_pages_figures():
    rows = json.loads(RESULTS.read_text())["runs"]
    agg = lw.aggregate(rows, "nocache/target-only")
    ratio = {(r["concurrency"], r["pair"]): r for r in agg["ratios"]}
    # TTFT p50 5.3x and 5.7x lower with the cache (target-only), paired within each repeat; outputs identical in all runs
    assert 1 / ratio[(1, "target-only: cache / nocache")]["ttft_p50_ms"]["median"] == pytest.approx(5.34, abs=0.01)
    assert 1 / ratio[(4, "target-only: cache / nocache")]["ttft_p50_ms"]["median"] == pytest.approx(5.72, abs=0.01)
    assert ratio[(1, "nocache: auto / target-only")]["throughput"]["median"] == pytest.approx(1.04, abs=0.005)
    assert len(agg["identical"]) == 48 and all(x["identical"] for x in agg["identical"])
    lines = lw.goals(agg, "agentic")
    assert any(line.startswith("1 streams: TTFT p50 5.34x lower") and line.endswith("met (goal 3x)") for line in lines)
    assert lines[-1].startswith("outputs identical to the cold server's (nocache/target-only): met (48 of 48 runs)")


def test_a_run_that_differs_is_named():
    base = {"concurrency": 2, "repeat": 0, "loadavg": 1.0, "hit_rate": 0.0, "decision_share": 0.0,
            **{f: 1.0 for f in lw.FIGURES}, "outputs": {"0.0": [5, 6], "1.0": [7, 8]}}
    rows = [{**base, "config": "nocache/target-only"},
            {**base, "config": "cache/target-only", "throughput": 2.0, "outputs": {"0.0": [5, 6], "1.0": [7, 9]}}]
    agg = lw.aggregate(rows, "nocache/target-only")
    assert agg["identical"] == [{"concurrency": 2, "config": "cache/target-only", "repeat": 0, "identical": False}]
    (r,) = [x for x in agg["ratios"] if x["pair"] == "target-only: cache / nocache"]
    assert r["throughput"]["median"] == 2.0
    assert "NOT cache/target-only at 2 streams, repeat 0" in lw.report(agg)


def test_one_runs_figures_leave_failed_requests_out():
    recs = [lw.Record(0, 0, 10, sent=0.0, first=0.5, end=1.5, tokens=[1, 2, 3], cached=4),
            lw.Record(1, 0, 10, sent=0.0, first=1.0, end=3.0, tokens=[1, 2, 3, 4, 5], cached=0),
            lw.Record(2, 0, 10, sent=0.0, tokens=[], error="ReadError: ")]
    got = lw.summarize(recs, wall=4.0)
    assert (got["requests"], got["failed"], got["output_tokens"]) == (2, 1, 8)
    assert got["throughput"] == 2.0 and got["ttft_p50_ms"] == pytest.approx(750.0) and got["hit_rate"] == pytest.approx(0.2)
    assert got["tpot_p50_ms"] == pytest.approx((500.0 + 500.0) / 2)
    assert not math.isnan(got["ttft_p90_ms"])


def test_the_workloads_build_their_prompts_from_token_ids():
    class Tok:  # one id per character: enough to see the structure
        def encode(self, text, add_special_tokens=False):
            return [ord(c) % 97 for c in text]

    args = type("A", (), {"prompt_tokens": 20, "system_tokens": 30, "tool_tokens": 8, "turns": 3, "requests": 2})()
    agentic = lw.make_streams("agentic", Tok(), 3, seed=1, args=args)
    assert len(agentic) == 3 and all(len(s.prompts) == 1 and len(s.tools) == 2 for s in agentic)
    assert len({tuple(s.prompts[0][:30]) for s in agentic}) == 1  # one system prompt shared by every stream
    chat = lw.make_streams("chat", Tok(), 2, seed=1, args=args)
    assert all(len(s.prompts) == 2 and s.prompts[0][:30] == chat[0].prompts[0][:30] for s in chat)
    assert lw.make_streams("agentic", Tok(), 3, seed=2, args=args)[0].prompts != agentic[0].prompts  # a new seed, new texts
