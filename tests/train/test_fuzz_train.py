"""Fuzzing specdec-train's inputs: training-data lines and the numeric options of `run` (tests/fuzzing.py: the budget
and the property). A data line gives a training sequence or one clean error naming its line; an option run trains
and writes its heads, or is refused in one line with nothing written."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from fuzzing import any_text, argv, assert_clean, assert_one_line, dumps, fuzz_settings, json_values, mostly, mutated, no_hang, number_text
from hypothesis import given, strategies as st
from train_fixtures import repetitive_data, tiny_base  # noqa: F401 (fixtures)

from specdec.cli.train import main as train_main
from specdec.formats.tokenizer import Tokenizer
from specdec.train.data import Sequence, read_prompts, read_sequences
from specdec.train.errors import TrainConfigError

pytestmark = pytest.mark.fuzz

# Valid lines of each kind a user may hand over: prepare-data's records, ModelOpt / ShareGPT / OpenAI conversations, plain prompts.
VALID_LINES = [
    {"conversation_id": 0, "conversations": [{"role": "user", "content": "w5 w6"}, {"role": "assistant", "content": "w7 w8 w9"}],
     "input_ids": [1, 5, 6, 7, 8, 9], "prompt_len": 3},
    {"conversations": [{"from": "human", "value": "w5 w6 w7"}, {"from": "gpt", "value": "w8 w9 w10"}]},
    {"messages": [{"role": "user", "content": "w5"}, {"role": "assistant", "content": "w6 w7 w8"}]},
    {"prompt": "w5 w6 w7 w8"},
    {"text": "w9 w10 w11"},
    {"input_ids": [5, 6, 7, 8, 9]},
]

lines = st.one_of(
    st.sampled_from(VALID_LINES).flatmap(mutated).map(dumps),
    json_values().map(dumps),
    any_text(60),
    st.sampled_from(['{"input_ids": [5, 6, 7, 8], "prompt_len": null}', '{"input_ids": [5, 6, 7], "prompt_len": "x"}', '{"prompt": "\\ud800"}',
                     '{"input_ids": [5, 6, 7, 1e400]}', '{"prompt_len": NaN, "input_ids": [5, 6, 7, 8]}', "[" * 100_000 + "]" * 100_000]),
)


@pytest.fixture(scope="module")
def tokenizer(tiny_base):
    return Tokenizer(tiny_base)


def _file(tmp_path_factory, suffix: str, content: list[str]):
    path = tmp_path_factory.mktemp("data") / f"data{suffix}"
    path.write_bytes("\n".join(content).encode("utf-8", "surrogatepass"))  # what an editor may save: surrogates as WTF-8 bytes
    return path


@fuzz_settings(150)
@given(st.lists(lines, min_size=1, max_size=4))
def test_data_lines_give_sequences_or_one_clean_line(tmp_path_factory, tokenizer, content):
    path = _file(tmp_path_factory, ".jsonl", content)
    with no_hang(what=content):
        try:
            seqs = read_sequences(path, tokenizer, max_len=16, vocab_size=96)
        except TrainConfigError as err:
            assert_one_line(err)
        else:
            assert seqs and all(isinstance(s, Sequence) and 3 <= len(s.ids) <= 16 and 0 <= s.prompt_len < len(s.ids) for s in seqs)
            assert all(0 <= t < 96 for s in seqs for t in s.ids)
        try:
            prompts = read_prompts(path)
        except TrainConfigError as err:
            assert_one_line(err)
        else:
            assert prompts and all(isinstance(p, str) and p.strip() for p in prompts)
            for p in prompts:
                p.encode("utf-8")  # a prompt the tokenizer can take


@pytest.mark.parametrize(("line", "message"), [
    ('{"input_ids": [5, 6, 7, 8], "prompt_len": null}', None),  # null = absent: was int(None), a TypeError
    ('{"input_ids": [5, 6, 7, 8], "prompt_len": "x"}', "line 1: prompt_len must be an integer >= 0"),  # a ValueError
    ('{"input_ids": [5, 6, 7, 8], "prompt_len": NaN}', "line 1: prompt_len must be an integer >= 0"),  # a ValueError
    ('{"prompt": "\\ud800 w5", "input_ids": [5, 6, 7, 8]}', "line 1 holds text that is not valid Unicode"),
    ('{"conversations": [{"role": "user", "content": "w5 \\udcff"}, {"role": "assistant", "content": "w6 w7"}]}',
     "line 1 holds text that is not valid Unicode"),  # the tokenizers library raised TypeError
])
def test_training_data_regressions(tmp_path, tokenizer, line, message):
    path = tmp_path / "d.jsonl"
    path.write_text(line + "\n")
    if message is None:
        assert read_sequences(path, tokenizer, vocab_size=96) == [Sequence([5, 6, 7, 8], 0)]
        return
    with pytest.raises(TrainConfigError, match=message) as info:
        read_sequences(path, tokenizer, vocab_size=96)
    assert_one_line(info.value)


def test_a_file_that_is_not_utf8_names_its_line(tmp_path):
    path = tmp_path / "p.txt"
    path.write_bytes(b"w5 w6\nw7 \xff w8\n")  # regression: a UnicodeDecodeError traceback
    with pytest.raises(TrainConfigError, match=r"line 2 is not UTF-8 text \(byte 0xff\)"):
        read_prompts(path)


# -- specdec-train run: numeric options ------------------------------------------------------------


NUMERIC = {
    "num_epochs": mostly(st.integers(1, 2)), "max_steps": mostly(st.integers(1, 2)), "lr": mostly(st.floats(1e-5, 1e-2)),
    "warmup_steps": mostly(st.integers(0, 2)), "batch_size": mostly(st.integers(1, 8)), "training_seq_len": mostly(st.integers(3, 40)),
    "save_steps": mostly(st.integers(1, 3)), "medusa_num_heads": mostly(st.integers(1, 3)), "medusa_num_layers": mostly(st.integers(0, 2)),
    "eagle_num_layers": mostly(st.integers(1, 2)), "eagle_ttt_steps": mostly(st.integers(1, 3)), "eagle_loss_decay_factor": mostly(st.floats(0.1, 1)),
    "eval_fraction": mostly(st.floats(0, 0.5)), "max_time": mostly(st.floats(0.5, 5)), "seed": mostly(st.integers(0, 2**32)),
    "num_threads": mostly(st.just(1)), "eagle_aux_layer_ids": st.one_of(st.just("0,1"), st.just("1,2,3"), any_text(8), number_text()),
    "peagle_depths": mostly(st.integers(1, 6)), "peagle_mask_token_id": mostly(st.integers(0, 95)),
    "peagle_down_sample_ratio": mostly(st.floats(0.1, 1)), "peagle_down_sample_ratio_min": mostly(st.floats(0, 1)),
    "max_cpu_time": mostly(st.floats(0.5, 5)),
}


@fuzz_settings(25)
@given(st.sampled_from(["medusa", "eagle", "peagle"]), st.permutations(sorted(NUMERIC)), st.integers(1, 2), st.data())
def test_numeric_train_options_train_or_fail_in_one_line(tmp_path_factory, tiny_base, repetitive_data, mode, names, count, data):
    flags = {"max_steps": "1", "num_threads": "1", "max_time": "5"}  # bounded work unless fuzzed: num_epochs alone would run every epoch
    fuzzed = [n for n in names if not (n == "max_steps" and "max_time" in names[:count])][:count]
    flags |= {name: data.draw(NUMERIC[name], label=name) for name in fuzzed}
    out = tmp_path_factory.mktemp("t") / "heads"
    args = ["run", "--mode", mode, "--model", tiny_base, "--data", repetitive_data, "--output_dir", out, "-q"]
    args += argv(flags)
    with no_hang(what=args):
        r = CliRunner().invoke(train_main, [str(a) for a in args])
    assert_clean(r, out)
    if r.exit_code == 0:
        assert (out / "model.safetensors").is_file() and json.loads((out / "config.json").read_text())


@pytest.mark.parametrize(("flags", "message"), [
    # allocated until killed
    (["--medusa_num_heads", str(2**31 - 1)], "--medusa_num_heads 2147483647 --medusa_num_layers 1: training them needs about"),
    (["--max_time", "nan"], "--max_time nan must be > 0 seconds"),  # was accepted: a time budget that never ends
    (["--max_cpu_time", "nan"], "--max_cpu_time nan must be > 0 seconds"),
])
def test_train_numbers_at_the_edges_regressions(tmp_path, tiny_base, repetitive_data, flags, message):
    args = ["run", "--mode", "medusa", "--model", tiny_base, "--data", repetitive_data, "--output_dir", tmp_path / "out", "--max_steps", "1", *flags]
    with no_hang(what=args):
        r = CliRunner().invoke(train_main, [str(a) for a in args])
    assert_clean(r, tmp_path / "out")
    assert r.exit_code == 1 and message in r.stderr, r.output


# -- specdec-train prepare-data: numeric options -------------------------------------------------------

PREPARE = {
    "max_token": mostly(st.integers(1, 6)), "max_prompt_tokens": mostly(st.integers(1, 8)), "temperature": mostly(st.floats(0, 2)),
    "top_k": mostly(st.integers(0, 5)), "top_p": mostly(st.floats(0, 1)), "seed": mostly(st.integers(0, 2**32)), "limit": mostly(st.integers(1, 3)),
    "num_threads": mostly(st.just(1)),
}


@pytest.fixture(scope="module")
def base_engine(tiny_base, tmp_path_factory):
    from conftest import spec_build

    from specdec.builder.build import build_engine

    out = tmp_path_factory.mktemp("prep") / "engine"
    build_engine(tiny_base, out, spec_build(0), say=lambda _: None)
    return out


@fuzz_settings(40)
@given(st.permutations(sorted(PREPARE)), st.integers(1, 3), st.data())
def test_prepare_data_options(tmp_path_factory, tiny_base, base_engine, names, count, data):
    d = tmp_path_factory.mktemp("pd")
    (d / "p.txt").write_text("w5 w6\nw7 w8 w9\n")
    flags = {"max_token": "4", "num_threads": "1"} | {name: data.draw(PREPARE[name], label=name) for name in names[:count]}
    args = ["prepare-data", "--model_dir", tiny_base, "--engine_dir", base_engine, "--data_path", d / "p.txt", "--output_path", d / "o.jsonl", "-q"]
    args += argv(flags)
    with no_hang(what=args):
        r = CliRunner().invoke(train_main, [str(a) for a in args])
    assert_clean(r, d / "o.jsonl")
    if r.exit_code == 0:
        records = [json.loads(line) for line in (d / "o.jsonl").read_text().splitlines()]
        assert records and all(len(rec["input_ids"]) - rec["prompt_len"] <= int(flags["max_token"]) for rec in records)
