"""What a new user meets in the first hour (issue 14), one test per finding, on the demo pair's real engines."""

import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from click.testing import CliRunner

from specdec.bench import peers
from specdec.builder.build import build_engine
from specdec.cli.bench import main as bench_main
from specdec.cli.build import main as build_main
from specdec.cli.run import main as run_main
from specdec.formats.engine_format import BuildConfig

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "examples" / "demo-pair"
BIN = Path(sys.executable).parent
PROMPT = "def fibonacci(n):"


def invoke(cli, *args):
    return CliRunner().invoke(cli, [str(a) for a in args])


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """The demo pair as the quickstart builds it (smaller limits: faster to build), plus a draft with small limits."""
    d = tmp_path_factory.mktemp("demo")
    limits = dict(max_batch_size=4, max_input_len=128, max_seq_len=256)
    build_engine(DEMO / "target", d / "target", BuildConfig(**limits, max_draft_len=8, speculative_decoding_mode="draft_tokens_external"),
                 say=lambda _: None)
    build_engine(DEMO / "draft", d / "draft", BuildConfig(**limits), say=lambda _: None)
    build_engine(DEMO / "draft", d / "small-draft", BuildConfig(max_batch_size=4, max_input_len=8, max_seq_len=256), say=lambda _: None)
    return d


# 1. --compare without onnxruntime-genai: skipped with a note, nothing measured is lost


def bench_compare(demo, tmp_path, monkeypatch, peers_python: str):
    """specdec-bench run --compare with onnxruntime-genai as the peer, not importable here."""
    monkeypatch.setattr(peers, "PEERS_PYTHON", peers_python)
    monkeypatch.setattr(peers, "_have_ortgenai", lambda: False)
    data = tmp_path / "data.jsonl"
    data.write_text(json.dumps({"prompt": PROMPT, "output_len": 8}) + "\n")
    out = tmp_path / "bench.json"
    r = invoke(bench_main, "run", "--engine_dir", demo / "target", "--dataset", data, "--method", "none", "--step_cost_reps", 2,
               "--compare", "--compare_peers", "ortgenai", "--output_json", out)
    return r, out


def test_bench_compare_skips_a_missing_peer_and_keeps_results(demo, tmp_path, monkeypatch):
    r, out = bench_compare(demo, tmp_path, monkeypatch, "")
    assert r.exit_code == 0, r.output
    assert "note: onnxruntime-genai skipped: onnxruntime-genai is not installed here" in r.output
    result = json.loads(out.read_text())
    assert result["rows"] and result["compare"][0]["skipped"].startswith("onnxruntime-genai is not installed")


def test_bench_compare_a_failing_peer_keeps_what_was_measured(demo, tmp_path, monkeypatch):
    r, out = bench_compare(demo, tmp_path, monkeypatch, str(tmp_path))  # not a Python: the peer cannot start
    assert r.exit_code == 0 and "is not an executable Python" in r.output, r.output
    assert json.loads(out.read_text())["rows"]


# 2. unwritable outputs: one line, before the work


def test_build_refuses_an_unwritable_output_dir_before_building(tmp_path):
    (tmp_path / "file").write_text("")
    r = invoke(build_main, "--checkpoint_dir", DEMO / "draft", "--output_dir", tmp_path / "file" / "engine")
    assert r.exit_code == 1 and "Traceback" not in r.output
    assert re.search(r"^error: --output_dir .*file/engine cannot be written", r.output, re.M), r.output


def test_build_refuses_a_read_only_place_before_building():
    r = invoke(build_main, "--checkpoint_dir", DEMO / "draft", "--output_dir", "/proc/specdec-engine")  # /proc takes no new files, even as root
    assert r.exit_code == 1 and "Traceback" not in r.output
    assert "error: --output_dir /proc/specdec-engine cannot be written: no file can be created in /proc" in r.output, r.output


@pytest.mark.parametrize("flag", ["--output_json", "--output_csv", "--output_npy"])
def test_run_checks_output_paths_before_decoding(demo, tmp_path, flag):
    for where, message in ((tmp_path, "is a directory"), (tmp_path / "file" / "out", "cannot be written")):
        (tmp_path / "file").write_text("")
        r = invoke(run_main, "--engine_dir", demo / "target", "--input_text", PROMPT, "--max_output_len", 4, flag, where)
        assert r.exit_code == 1, r.output
        assert message in r.output and "output (" not in r.output, r.output  # refused before any decoding


# 7. a runtime-only install: specdec-build says which extra to install


def test_build_without_the_build_extra_is_one_line(tmp_path):
    code = ("import sys; sys.modules['onnx'] = None; "  # what a runtime-only install looks like to Python
            f"sys.argv = ['specdec-build', '--checkpoint_dir', {str(DEMO / 'draft')!r}, '--output_dir', {str(tmp_path / 'e')!r}]; "
            "from specdec.cli.build import main; main()")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.strip().splitlines() == [
        "error: specdec-build needs the build extra (onnx is not installed): pip install 'specdec[build]' "
        "(from a clone: pip install '.[build]'). Running engines does not need it."
    ]


# 8. a draft with smaller limits: one warning line at load, and errors that name the draft


def test_draft_limits_warn_once_and_errors_name_the_draft(demo):
    r = invoke(run_main, "--engine_dir", demo / "target", "--draft_engine_dir", demo / "small-draft", "--input_text", PROMPT * 3, "--max_output_len",
               4)
    assert r.exit_code == 1
    warnings = [line for line in r.output.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and "max_input_len 8 < 128" in warnings[0], r.output
    assert "PairWarning" not in r.output and "check_pair(" not in r.output
    assert f"more than max_input_len=8 of the draft engine {demo / 'small-draft'} (the target's is 128)" in r.output


# 9. TensorRT-LLM run.py command lines paste cleanly


def test_run_py_command_lines_paste(demo, tmp_path):
    out = tmp_path / "out.json"
    r = invoke(run_main, "--engine_dir", demo / "target", "--input_text", PROMPT, "import os", "--max_output_len", 4,
               "--use_py_session", "--kv_cache_free_gpu_memory_fraction", 0.4, "--kv_cache_enable_block_reuse", "--num_beams", 1, "--output_json",
               out)
    assert r.exit_code == 0, r.output
    assert len(json.loads(out.read_text())["requests"]) == 2  # both prompts after one --input_text
    assert "note: --use_py_session is ignored" in r.output and "note: --kv_cache_free_gpu_memory_fraction is ignored" in r.output
    assert "note: --kv_cache_enable_block_reuse is ignored" in r.output


def test_run_refuses_beam_search_in_words(demo):
    r = invoke(run_main, "--engine_dir", demo / "target", "--input_text", PROMPT, "--num_beams", 2)
    assert r.exit_code == 1 and "Did you mean" not in r.output
    assert "error: --num_beams 2: beam search is not supported." in r.output


def test_run_positional_text_needs_input_text(demo):
    r = invoke(run_main, "--engine_dir", demo / "target", "stray")
    assert r.exit_code == 1 and "unexpected argument 'stray'" in r.output
    r = invoke(run_main, "--engine_dir", demo / "target", "--input_text", PROMPT, "--max_output_len", 4, "stray")  # not after --input_text
    assert r.exit_code == 1 and "unexpected argument 'stray'" in r.output


def test_run_py_several_stop_and_bad_words_after_one_flag(demo, tmp_path):
    """run.py's nargs="+" options: the words after --stop_words / --bad_words are theirs (they were read as more prompts)."""
    from specdec.cli.compat import spread_many_values

    assert spread_many_values(["--input_text", "a", "b", "--bad-words", " x", "-1", "--top_k", "2", "--stop_words=s", "t"]) == [
        "--input_text", "a", "--input_text", "b", "--bad-words", " x", "--bad-words", "-1", "--top_k", "2", "--stop_words=s", "t"]
    # argparse's values that start with a dash: numbers, and anything with a space (a markdown "- " stop word)
    assert spread_many_values(["--stop_words", "a", "- b", "-.5", "--baseline"]) == [
        "--stop_words", "a", "--stop_words", "- b", "--stop_words", "-.5", "--baseline"]
    texts = []
    for bans in ([], ["--bad_words", " name", "self"]):
        out = tmp_path / "out.json"
        r = invoke(run_main, "--engine_dir", demo / "target", "--input_text", "class Stack:", "--max_output_len", 24, *bans,
                   "--stop_words", "zzz", "yyy", "--output_json", out)
        assert r.exit_code == 0, r.output
        requests = json.loads(out.read_text())["requests"]
        assert len(requests) == 1
        texts.append(requests[0]["text"])
    assert " name" in texts[0] and "self" in texts[0]  # the demo target's __init__(self, name, name, ...)
    assert " name" not in texts[1] and "self" not in texts[1]


# 10. hints that do not mislead


def test_a_draft_engine_as_target_says_so(demo):
    r = invoke(run_main, "--engine_dir", demo / "draft", "--draft_engine_dir", demo / "target", "--draft_target_model_config", "[1,[0],[0],False]",
               "--input_text", PROMPT)
    assert r.exit_code == 1
    assert "If it is the draft, pass it as the draft engine (--draft_engine_dir)" in r.output
    assert "--max_draft_len 8" in r.output and "--max_draft_len 1" not in r.output


def test_an_engine_dir_as_checkpoint_says_so(demo, tmp_path):
    r = invoke(build_main, "--checkpoint_dir", demo / "draft", "--output_dir", tmp_path / "e")
    assert r.exit_code == 1 and "architecture None" not in r.output
    assert (f"is an engine directory (made by specdec-build), not a Hugging Face checkpoint. It was built from {DEMO / 'draft'}; "
            "pass that.") in r.output


def test_stop_words_match_text(demo, tmp_path):
    out = tmp_path / "out.json"
    r = invoke(run_main, "--engine_dir", demo / "target", "--input_text", 'def f(x):\n    """Return a', "--max_output_len", 48, "--end_id", -1,
               "--output_json", out)
    full = json.loads(out.read_text())["requests"][0]["text"]
    word = next(w for w in re.findall(r"[a-z]{4,}", full[4:]))  # a word inside the output, preceded by a space or not
    r = invoke(run_main, "--engine_dir", demo / "target", "--input_text", 'def f(x):\n    """Return a', "--max_output_len", 48, "--end_id", -1,
               "--stop_words", word, "--output_json", out)
    assert r.exit_code == 0, r.output
    req = json.loads(out.read_text())["requests"][0]
    assert req["finish_reason"] == "stop_words" and req["text"].endswith(word) and full.startswith(req["text"])
    assert len(req["output_ids"]) < 48


# 11. logs without progress-bar frames; the dependency claim stays true


def test_build_writes_no_progress_frames_into_a_log(tmp_path):
    r = subprocess.run([str(BIN / "specdec-build"), "--checkpoint_dir", DEMO / "draft", "--output_dir", tmp_path / "e", "--max_seq_len", "64"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "\r" not in r.stdout + r.stderr and "built " in r.stdout


def test_readme_names_the_runtime_dependencies():
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    names = [re.split(r"[<>=!~ ;\[]", d)[0] for d in deps]
    assert names == ["numpy", "onnxruntime", "tokenizers", "click"]
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert "Running an engine needs only numpy, onnxruntime, tokenizers and click" in readme
    install = " ".join((ROOT / "docs" / "install.md").read_text().split())  # the README's install link: what pip brings with them
    assert "tokenizers pulls huggingface_hub" in install and "(docs/install.md)" in readme


# 6. the repeated, interleaved comparison


def test_run_repeat_interleaves_and_reports_the_spread(demo, tmp_path):
    out = tmp_path / "out.json"
    r = invoke(run_main, "--engine_dir", demo / "target", "--draft_engine_dir", demo / "draft", "--draft_target_model_config", "[4,[0],[0],False]",
               "--input_text", PROMPT, "--max_output_len", 16, "--baseline", "--repeat", 3, "--output_json", out)
    assert r.exit_code == 0, r.output
    assert "tokens/s (median, min-max)" in r.output and "3 interleaved runs each" in r.output
    assert "outputs identical to target-only: yes" in r.output
    reps = json.loads(out.read_text())["baseline"]["repeats"]
    assert len(reps["speedups"]) == len(reps["tokens_per_s"]) == len(reps["target_only_tokens_per_s"]) == 3
    r = invoke(run_main, "--engine_dir", demo / "target", "--input_text", PROMPT, "--repeat", 3)
    assert r.exit_code == 1 and "used with --baseline" in r.output
