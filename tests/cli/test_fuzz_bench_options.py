"""Fuzzing specdec-bench's options and dataset lines (tests/fuzzing.py: the budget and the property).

prepare-dataset: a dataset of what was asked, or one clean line and no file; run: a measured sweep, or one
clean line and no report.
"""

from __future__ import annotations

import json

import pytest
from checkpoints import add_word_tokenizer, make_checkpoint
from click.testing import CliRunner
from conftest import spec_build
from fuzzing import any_text, argv, assert_clean, dumps, fuzz_settings, json_values, mostly, mutated, no_hang, number_text
from hypothesis import given, strategies as st

from specdec.builder.build import build_engine
from specdec.cli.bench import main as bench_main

pytestmark = pytest.mark.fuzz


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    d = tmp_path_factory.mktemp("fuzz-bench")
    ckpt = add_word_tokenizer(make_checkpoint(d / "ckpt", num_hidden_layers=1, tie_word_embeddings=True))
    build_engine(ckpt, d / "target", spec_build(4), say=lambda _: None)
    build_engine(ckpt, d / "draft", spec_build(0), say=lambda _: None)
    (d / "data.jsonl").write_text("".join(json.dumps({"input_ids": [5, 6, 7, 8 + i], "output_len": 6}) + "\n" for i in range(2)))
    return d


def bench(*args):
    with no_hang(what=args):
        return CliRunner().invoke(bench_main, [str(a) for a in args])



PREPARE = {
    "num_requests": mostly(st.integers(1, 4)), "input_mean": mostly(st.floats(1, 20)), "input_stdev": mostly(st.floats(0, 5)),
    "output_mean": mostly(st.floats(1, 20)), "output_stdev": mostly(st.floats(0, 5)), "random_seed": mostly(st.integers(0, 2**64)),
    "vocab_size": mostly(st.integers(1, 200)),
}


@fuzz_settings(60)
@given(st.permutations(sorted(PREPARE)), st.integers(1, 3), st.data())
def test_prepare_dataset_options(tmp_path_factory, names, count, data):
    flags = {"num_requests": "2", "input_mean": "8", "output_mean": "8", "vocab_size": "96"}
    flags |= {name: data.draw(PREPARE[name], label=name) for name in names[:count]}
    out = tmp_path_factory.mktemp("p") / "data.jsonl"
    args = ["prepare-dataset", "--output", out]
    args += argv(flags)
    r = bench(*args)
    assert_clean(r, out)
    if r.exit_code == 0:
        lines = [json.loads(line) for line in out.read_text().splitlines()]
        assert len(lines) == int(flags["num_requests"])
        vocab = int(flags["vocab_size"])
        assert all(line["input_ids"] and all(0 <= t < vocab for t in line["input_ids"]) and line["output_len"] >= 1 for line in lines)


VALID_LINES = [{"task_id": 0, "input_ids": [5, 6, 7], "output_len": 4}, {"prompt": "w5 w6 w7", "output_len": 3}, {"prompt": "w8", "output_tokens": 2}]
dataset_lines = st.one_of(st.sampled_from(VALID_LINES).flatmap(mutated).map(dumps), json_values().map(dumps), any_text(40),
                          st.sampled_from(["[" * 100_000 + "]" * 100_000, '{"prompt": "\\ud800"}', '{"input_ids": [5, 1e400]}']))


@fuzz_settings(60)
@given(st.lists(dataset_lines, min_size=1, max_size=3))
def test_dataset_lines(engines, tmp_path_factory, lines):
    d = tmp_path_factory.mktemp("l")
    (d / "in.jsonl").write_bytes("\n".join(lines).encode("utf-8", "surrogatepass"))
    out = d / "data.jsonl"
    r = bench("prepare-dataset", "--jsonl", d / "in.jsonl", "--tokenizer_dir", engines / "target", "--output_mean", 4, "--output", out)
    assert_clean(r, out)


RUN = {
    "batch_size": mostly(st.integers(1, 3)), "warmup": mostly(st.integers(0, 1)), "step_cost_reps": mostly(st.integers(1, 3)),
    "num_threads": mostly(st.just(1)), "ngram_size": mostly(st.integers(1, 3)), "max_output_len": mostly(st.integers(1, 8)),
    "draft_lens": st.one_of(st.sampled_from(["1,2", "4", "1"]), any_text(6), number_text()),
}


@fuzz_settings(25)
@given(st.permutations(sorted(RUN)), st.integers(1, 2), st.data())
def test_run_options(engines, tmp_path_factory, names, count, data):
    flags = {"draft_lens": "2", "warmup": "0", "step_cost_reps": "2", "num_threads": "1"}
    flags |= {name: data.draw(RUN[name], label=name) for name in names[:count]}
    out = tmp_path_factory.mktemp("r") / "bench.json"
    args = ["run", "--engine_dir", engines / "target", "--draft_engine_dir", engines / "draft", "--dataset", engines / "data.jsonl",
            "--method", "none,draft,ngram", "--output_json", out]
    args += argv(flags)
    r = bench(*args)
    assert_clean(r, out)
    if r.exit_code == 0:
        rows = json.loads(out.read_text())["rows"]
        assert rows and all(row["identical_to_target_only"] for row in rows)  # greedy, every method


@pytest.mark.parametrize(("args", "message"), [
    (["--vocab_size", str(2**40)], "--vocab_size=1099511627776 must be at most 16777216"),  # np.arange(2**40): MemoryError
    (["--input_mean", "1e12"], "make 1e+12 prompt tokens, more than one dataset holds"),  # 8 TiB of token ids: MemoryError
    # a prompt total past float's range: formatting it for the message was an OverflowError (found by the 10x run)
    (["--input_mean", "1e308", "--input_stdev", "0", "--num_requests", "1000"], "make about 1e311 prompt tokens, more than one dataset holds"),
    (["--random_seed", "-1"], "--random_seed=-1 must be an integer >= 0"),  # numpy's ValueError
])
def test_prepare_dataset_regressions(tmp_path, args, message):
    flags = {"--num_requests": "1", "--input_mean": "8", "--output_mean": "8", "--vocab_size": "96"} | dict(zip(args[::2], args[1::2], strict=True))
    r = bench("prepare-dataset", "--output", tmp_path / "d.jsonl", *[x for kv in flags.items() for x in kv])
    assert_clean(r, tmp_path / "d.jsonl")
    assert r.exit_code == 1 and message in r.stderr, r.output


@pytest.mark.parametrize(("content", "message"), [
    (b'{"input_ids": [5, 6], "output_len": 3}\n' + b"[" * 100_000 + b"]" * 100_000 + b"\n", "in.jsonl:2 nests JSON too deeply"),  # RecursionError
    (b'{"input_ids": [5, 6], "output_len": 3}\n{"prompt": "w5 \xff"}\n', "in.jsonl:2 is not UTF-8 text (byte 0xff)"),  # UnicodeDecodeError
    # the tokenizers library's TypeError
    (b'{"prompt": "w5 \\udcff w6"}\n', "in.jsonl:1 holds text that is not valid Unicode: a lone surrogate '\\udcff'"),
])
def test_dataset_regressions(engines, tmp_path, content, message):
    (tmp_path / "in.jsonl").write_bytes(content)
    r = bench("prepare-dataset", "--jsonl", tmp_path / "in.jsonl", "--tokenizer_dir", engines / "target", "--output_mean", 4, "--output",
              tmp_path / "o.jsonl")
    assert_clean(r, tmp_path / "o.jsonl")
    assert r.exit_code == 1 and message in r.stderr, r.output


def test_run_refuses_endless_step_timing_before_measuring(engines, tmp_path):
    r = bench("run", "--engine_dir", engines / "target", "--draft_engine_dir", engines / "draft", "--dataset", engines / "data.jsonl",
              "--method", "none,draft", "--draft_lens", "2", "--step_cost_reps", str(2**31), "--output_json", tmp_path / "b.json")
    assert_clean(r, tmp_path / "b.json")  # regression: 2**31 timed steps, a hang
    assert r.exit_code == 1 and "--step_cost_reps=2147483648 must be from 1 to 10000" in r.stderr
