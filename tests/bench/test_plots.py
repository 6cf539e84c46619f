"""bench/plots.py: the chart a benchmark writes beside its JSON, and what a host without matplotlib gets."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from specdec.bench.plots import Bar, beside, spread_bar, write_bars

ROOT = Path(__file__).resolve().parents[2]
PNG = b"\x89PNG\r\n\x1a\n"


def test_a_chart_is_a_png_beside_the_json(tmp_path):
    path = beside(tmp_path / "run.json")
    assert path == tmp_path / "run.png"
    panels = {"agentic": [spread_bar("suffix", {"median": 1.57, "min": 1.55, "max": 1.69}), Bar("ngram", 1.02)], "demo": [Bar("ngram", 1.22)]}
    assert write_bars(path, "speed over target-only", panels) == path
    assert path.read_bytes()[:8] == PNG


def test_without_matplotlib_no_chart_and_one_note(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)  # `from matplotlib.figure import ...` raises ImportError
    assert write_bars(tmp_path / "x.png", "t", {"p": [Bar("a", 1.0)]}) is None
    assert not (tmp_path / "x.png").exists()
    assert "matplotlib is not installed" in capsys.readouterr().err


def test_empty_panels_draw_nothing(tmp_path):
    assert write_bars(tmp_path / "x.png", "t", {"p": []}) is None
    assert not (tmp_path / "x.png").exists()


@pytest.mark.slow
def test_bench_decode_writes_its_chart_beside_its_json_and_reports_each_round(tmp_path):
    """A method-comparing benchmark end to end on the demo pair: per-round progress lines, the JSON, the PNG beside it."""
    out = tmp_path / "decode.json"
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_decode.py"), "--target", str(ROOT / "examples/demo-pair/target"),
                        "--draft", str(ROOT / "examples/demo-pair/draft"), "--num_prompts", "1", "--prompt_tokens", "32", "--max_new_tokens", "8",
                        "--draft_lens", "2", "--repeats", "2", "--peers", "", "--work", str(tmp_path / "engines"), "--json", str(out)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "round 1/2:" in r.stdout and "round 2/2:" in r.stdout
    results = json.loads(out.read_text())["results"]
    assert {"specdec target-only", "specdec draft-target k=2", "specdec ngram k=8 n=3"} <= set(results)
    assert all(row["greedy_equal_to_target_only"] for row in results.values())
    assert out.with_suffix(".png").read_bytes()[:8] == PNG
