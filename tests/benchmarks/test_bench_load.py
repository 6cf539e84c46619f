"""benchmarks/bench_load.py's pure parts: guidellm's report read back, repeats paired, the goals judged, bad arguments.

The sweep itself (a server, guidellm 0.8.1 in a venv of its own, half an hour) is not run here: docs/benchmarks.md
prints its command and figures. data/guidellm-0.8.1-auto.json is one real guidellm report of that sweep (rate
0.1 req/s, 10 streamed completions of 32 tokens with draft-target `auto` on the 325M pair), trimmed: each
request record keeps its timings, token counts and request body; guidellm's own aggregates keep four metrics,
which the figures here are checked against.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "bench_load.py"
REPORT = Path(__file__).parent / "data" / "guidellm-0.8.1-auto.json"
_spec = importlib.util.spec_from_file_location("bench_load", SCRIPT)
bench_load = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench_load)


def test_a_guidellm_report_gives_the_runs_figures():
    raw = json.loads(REPORT.read_text())["benchmarks"][0]
    records, theirs = raw["requests"]["successful"], raw["metrics"]
    figures = bench_load.summarize(REPORT)

    # every request counted, and as many tokens as guidellm counted (the server's usage chunks)
    assert figures["completed"] == theirs["request_totals"]["successful"] == len(records) > 0
    assert figures["failed"] == theirs["request_totals"]["errored"] + theirs["request_totals"]["incomplete"]
    assert figures["sent"] == raw["scheduler_state"]["created_requests"] == raw["config"]["constraints"]["max_requests"]["args"]["count"]
    assert figures["output_tokens"] == theirs["output_token_count"]["successful"]["total_sum"]
    # throughput over first request sent -> last response done, which is guidellm's own benchmark duration here
    assert figures["duration_s"] == pytest.approx(raw["duration"], rel=1e-9)
    assert figures["output_throughput"] == pytest.approx(figures["output_tokens"] / raw["duration"])
    # TPOT is vLLM's (last token - first token) / (tokens - 1): guidellm's inter_token_latency_ms per request.
    # Its request_latency runs on to the end of the stream (the usage chunk, [DONE]): a few ms after the last token.
    for r in records:
        after_last_token_ms = r["request_latency"] * 1000 - r["time_to_first_token_ms"] - r["inter_token_latency_ms"] * (r["output_tokens"] - 1)
        assert 0 <= after_last_token_ms < 50
    # the medians are per request (numpy's), inside guidellm's own quartiles and range
    ttft = theirs["time_to_first_token_ms"]["successful"]
    assert ttft["percentiles"]["p25"] <= figures["ttft_p50_ms"] <= ttft["percentiles"]["p75"]
    assert figures["ttft_p50_ms"] == pytest.approx(np.median([r["time_to_first_token_ms"] for r in records]))
    itl = theirs["inter_token_latency_ms"]["successful"]
    assert itl["min"] <= figures["tpot_p50_ms"] <= itl["max"]
    # the method rode in the request body, as the sweep sends it (guidellm's backend extras)
    for r in records:
        assert json.loads(r["request_args"])["body"]["speculative"] == bench_load.METHODS["auto"]


def test_a_request_guidellm_left_out_counts_as_sent_not_done(tmp_path):
    # guidellm 0.8.1 once stopped with the last of 15 requests in flight and listed 14 (rate 0.3, target-only)
    raw = json.loads(REPORT.read_text())
    raw["benchmarks"][0]["requests"]["successful"].pop()
    short = tmp_path / "short.json"
    short.write_text(json.dumps(raw))
    figures = bench_load.summarize(short)
    assert (figures["completed"], figures["failed"], figures["sent"]) == (9, 0, 10)


def test_a_report_of_another_layout_is_one_clear_line(tmp_path):
    bad = tmp_path / "other.json"
    bad.write_text(json.dumps({"benchmarks": [{"metrics": {}}]}))
    with pytest.raises(SystemExit, match="not a guidellm 0.8 JSON report"):
        bench_load.summarize(bad)


def run(label: str, rate: float, repeat: int, throughput: float, tpot: float) -> dict:
    """One run's row as sweep() writes it (the figures aggregate() reads)."""
    return {"method": label, "rate": rate, "repeat": repeat, "sent": 10, "completed": 10, "failed": 0, "output_throughput": throughput,
            "ttft_p50_ms": 100.0 * (repeat + 1), "tpot_p50_ms": tpot, "tokens_per_server_cpu_s": throughput / 2,
            "mean_acceptance_length": 1.0 if label == "target-only" else 2.0,
            "drafted_per_round": 0.0 if label == "target-only" else 3.0, "loadavg": 2.0}


def sweep_rows() -> list[dict]:
    # rate 0.1: auto faster in every repeat. rate 1: auto's throughput below target-only's every repeat.
    rows = []
    for repeat, (base, auto) in enumerate([(4.0, 5.0), (3.0, 3.3), (5.0, 4.5)]):
        rows += [run("target-only", 0.1, repeat, base, 400.0), run("auto", 0.1, repeat, auto, 400.0 * base / auto)]
    for repeat, (base, auto) in enumerate([(10.0, 7.0), (11.0, 7.5), (10.5, 7.2)]):
        rows += [run("target-only", 1.0, repeat, base, 900.0), run("auto", 1.0, repeat, auto, 1000.0)]
    return rows


def test_repeats_are_aggregated_and_paired():
    agg = {(a["rate"], a["method"]): a for a in bench_load.aggregate(sweep_rows())}
    base, auto = agg[(0.1, "target-only")], agg[(0.1, "auto")]
    assert base["output_throughput"] == {"median": 4.0, "min": 3.0, "max": 5.0}
    assert auto["output_throughput"] == {"median": 4.5, "min": 3.3, "max": 5.0}
    # ratios within each repeat (5/4, 3.3/3, 4.5/5), not of the medians (4.5/4)
    assert auto["output_throughput_ratio"] == pytest.approx({"median": 1.1, "min": 0.9, "max": 1.25})
    assert auto["tpot_p50_ms_ratio"] == pytest.approx({"median": 1 / 1.1, "min": 0.8, "max": 1 / 0.9})
    assert "output_throughput_ratio" not in base


def test_an_interrupted_sweep_pairs_by_repeat():
    # runs.jsonl of a sweep stopped in repeat 1, after auto and before target-only (the order alternates)
    rows = [r for r in sweep_rows() if r["rate"] == 0.1 and (r["repeat"] == 0 or r["method"] == "auto") and r["repeat"] < 2]
    auto = next(a for a in bench_load.aggregate(rows) if a["method"] == "auto")
    assert auto["repeats"] == 2 and auto["output_throughput_ratio"] == pytest.approx({"median": 1.25, "min": 1.25, "max": 1.25})


def test_methods_are_named_or_refused():
    assert bench_load.method_body("target-only") == {"method": "none"}
    assert bench_load.method_body("auto") == {"method": "draft", "num_draft_tokens": "auto"}
    assert bench_load.method_body("draft-4") == {"method": "draft", "num_draft_tokens": 4}
    for bad in ("draft-0", "draft-x", "ngram"):
        with pytest.raises(SystemExit, match=f"--methods: unknown method '{bad}'"):
            bench_load.method_body(bad)


def test_goals_say_where_they_are_not_met():
    lines = bench_load.goals(bench_load.aggregate(sweep_rows()), low_rates=1)
    assert len(lines) == 3  # throughput at both rates, TPOT at the lowest
    assert lines[0].startswith("rate 0.1: throughput") and lines[0].endswith(
        "-> met (auto's median at or above target-only's lowest repeat)")
    assert lines[1].startswith("rate 1: throughput") and "-> NOT met" in lines[1]
    assert lines[2].startswith("rate 0.1: median TPOT") and "-> met (not lower in every repeat)" in lines[2]


def test_report_redraws_an_earlier_sweep(tmp_path):
    runs = tmp_path / "runs.jsonl"
    runs.write_text("".join(json.dumps(r) + "\n" for r in sweep_rows()))
    plot, out = tmp_path / "load.png", tmp_path / "load.json"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--report", str(runs), "--plot", str(plot), "--output_json", str(out)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "| 1 | auto | 30/30 | 7.20 [7.00-7.50] |" in proc.stdout and "| 1 | auto: 0.69 [0.68-0.70] |" in proc.stdout
    assert "rate 1: throughput" in proc.stdout and "NOT met" in proc.stdout
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert json.loads(out.read_text())["runs"] == sweep_rows()
    # a report of a saved sweep keeps that sweep's arguments, not its own
    again = tmp_path / "again.json"
    subprocess.run([sys.executable, str(SCRIPT), "--report", str(out), "--max_tokens", "7", "--output_json", str(again)],
                   capture_output=True, text=True, timeout=120, check=True)
    assert json.loads(again.read_text())["args"] == json.loads(out.read_text())["args"]
    assert json.loads(out.read_text())["args"]["max_tokens"] == "32"


@pytest.mark.parametrize("argv, message", [
    ([], "give --target and --draft (or --url of a server with a draft loaded)"),
    (["--url", "http://127.0.0.1:9", "--rates", "0.1,fast"], "--rates '0.1,fast': expected comma-separated positive floats"),
    (["--url", "http://127.0.0.1:9", "--rates", "0.1,-1"], "--rates '0.1,-1': every value must be a positive finite number"),
    (["--url", "http://127.0.0.1:9", "--rates", "0.1,0.3,1", "--num_prompts", "10,20"], "--num_prompts gives 2 counts for 3 rates"),
    (["--target", "/nonexistent/engine", "--draft", "/nonexistent/draft"], "--target /nonexistent/engine: not an engine directory"),
    (["--url", "http://127.0.0.1:9", "--guidellm", "/nonexistent/guidellm"], "guidellm not found at '/nonexistent/guidellm'"),
    (["--url", "http://127.0.0.1:9", "--methods", "auto,draft-4"], "--methods auto,draft-4: give target-only"),
    (["--url", "http://127.0.0.1:9", "--methods", "target-only,medusa"], "--methods: unknown method 'medusa'"),
    (["--report", "/nonexistent/load.json"], "--report /nonexistent/load.json: expected a bench_load.py --output_json file"),
])
def test_bad_arguments_are_one_line_before_any_work(argv, message):
    proc = subprocess.run([sys.executable, str(SCRIPT), *argv], capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""
