"""Fuzzing specdec-build's numeric options (tests/fuzzing.py: the budget and the property).

Each example builds in-process (click's CliRunner) from a tiny checkpoint: an engine whose config.json holds
the limits asked for, or one clean error line and nothing on disk (neither the engine nor its temporary).
"""

from __future__ import annotations

import json

import pytest
from checkpoints import make_checkpoint
from click.testing import CliRunner
from fuzzing import argv, assert_clean, fuzz_settings, mostly, no_hang
from hypothesis import given, strategies as st

from specdec.cli.build import main as build_main

pytestmark = pytest.mark.fuzz


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return make_checkpoint(tmp_path_factory.mktemp("fuzz-build") / "ckpt", num_hidden_layers=1, tie_word_embeddings=True)


def build(*args):
    with no_hang(what=args):
        return CliRunner().invoke(build_main, [str(a) for a in args])



NUMERIC = {
    "max_batch_size": mostly(st.integers(1, 8)),
    "max_input_len": mostly(st.integers(1, 64)),
    "max_seq_len": mostly(st.integers(2, 256)),
    "max_draft_len": mostly(st.integers(0, 8)),
    "group_size": mostly(st.sampled_from([0, 32, 64, 128])),
    "tp_size": mostly(st.just(1)),
    "calib_size": mostly(st.integers(1, 4)),
}


@st.composite
def build_options(draw) -> tuple[dict[str, str], list[str]]:
    flags = {name: draw(NUMERIC[name]) for name in draw(st.permutations(sorted(NUMERIC)))[: draw(st.integers(1, 3))]}
    more = []
    if "max_draft_len" in flags or draw(st.booleans()):
        more += ["--speculative_decoding_mode", draw(st.sampled_from(["draft_tokens_external", "none"]))]
    if "group_size" in flags:
        more += ["--qformat", draw(st.sampled_from(["int4_wo", "int8_wo", "none"]))]
    return flags, more


@fuzz_settings(60)
@given(build_options())
def test_numeric_build_options_build_what_was_asked_or_fail_in_one_line(ckpt, tmp_path_factory, options):
    flags, more = options
    out = tmp_path_factory.mktemp("b") / "engine"
    args = ["--checkpoint_dir", ckpt, "--output_dir", out, *more]
    args += argv(flags)
    r = build(*args)
    assert_clean(r, out)
    if r.exit_code != 0:
        return
    built = json.loads((out / "config.json").read_text())["build"]
    for name in ("max_batch_size", "max_input_len", "max_seq_len", "max_draft_len"):
        if name in flags:
            assert built[name] == int(flags[name])
    assert 1 <= built["max_input_len"] < built["max_seq_len"] and 0 <= built["max_draft_len"] < built["max_seq_len"]


@pytest.mark.parametrize(("flags", "message"), [
    # regressions: both were accepted; the first built a 61 MiB engine whose KV cache held a million draft slots,
    # the second dropped the last calibration sample ([:-1])
    (["--speculative_decoding_mode", "draft_tokens_external", "--max_draft_len", "1000000", "--max_seq_len", "64"],
     "max_draft_len=1000000 must be smaller than max_seq_len=64"),
    (["--calib_size", "-1", "--qformat", "int4_awq", "--calib_dataset", "README.md"], "--calib_size -1 must be >= 1"),
    # found by the 10x run: a KV cache past 1e308 bytes could not be written as a float (OverflowError)
    (["--max_seq_len", "1" + "0" * 400], "max_seq_len=about 1e400 with max_batch_size=8 needs a KV cache of about 1e403 bytes"),
    # the message named the defaults that follow from it (max_input_len=1 must be smaller than max_seq_len=0)
    (["--max_seq_len", "0"], "--max_seq_len 0 must be >= 2"),
])
def test_build_numbers_at_the_edges_regressions(ckpt, tmp_path, flags, message):
    r = build("--checkpoint_dir", ckpt, "--output_dir", tmp_path / "e", *flags)
    assert_clean(r, tmp_path / "e")
    assert r.exit_code == 1 and message in r.stderr, r.output
