"""Fuzzing specdec-run's options as a user types them: numbers at the edges in every numeric flag and in the
config strings, text at the edges in prompts and stop words (tests/fuzzing.py: the budget and the property).

Each example runs the CLI in-process (click's CliRunner) on tiny engines. The property: exit 0 with an
output no longer than asked and, for settings that reduce to greedy, exactly the greedy tokens; or one
clean error line and no output file.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from checkpoints import add_word_tokenizer, make_checkpoint
from click.testing import CliRunner
from conftest import spec_build
from fuzzing import any_text, argv, assert_clean, fuzz_settings, mostly, no_hang, number_text
from hypothesis import given, strategies as st

from specdec.builder.build import build_engine
from specdec.cli.run import main as run_main
from specdec.runtime.sampling import GREEDY_TEMPERATURE

pytestmark = pytest.mark.fuzz
PROMPT = "w5 w6 w7 w5 w6"


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    d = tmp_path_factory.mktemp("fuzz-run")
    ckpt = add_word_tokenizer(make_checkpoint(d / "ckpt", tie_word_embeddings=True))
    build_engine(ckpt, d / "target", spec_build(4), say=lambda _: None)
    build_engine(ckpt, d / "draft", spec_build(0), say=lambda _: None)
    return d


def run(*args):
    with no_hang(what=args):
        return CliRunner().invoke(run_main, [str(a) for a in args])


def greedy_reference(engines, max_output_len: int) -> list[int]:
    r = run("--engine_dir", engines / "target", "--input_text", PROMPT, "--max_output_len", max_output_len, "--output_json", engines / "greedy.json",
            "--num_threads", 1)
    assert r.exit_code == 0, r.output
    return json.loads((engines / "greedy.json").read_text())["requests"][0]["output_ids"]



NUMERIC = {
    "max_output_len": mostly(st.integers(1, 40)),
    "end_id": mostly(st.integers(-2, 100)),
    "temperature": mostly(st.one_of(st.floats(0, 2), st.sampled_from([0.0, 5e-324, 1e-300, 9.99e-6, 1e-5, 1e-4]))),
    "top_k": mostly(st.integers(0, 100)),
    "top_p": mostly(st.floats(0, 1)),
    "random_seed": mostly(st.integers(0, 2**64)),
    "repeat": mostly(st.integers(1, 3)),
    "num_threads": mostly(st.integers(1, 2)),
    "draft_num_threads": mostly(st.integers(1, 2)),
    "ngram_min_match": mostly(st.integers(1, 4)),
    "draft_confidence_threshold": mostly(st.floats(0, 1)),
    "draft_len": st.one_of(mostly(st.integers(0, 4)), st.just("auto")),
}


def _float(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


@st.composite
def run_options(draw) -> tuple[str, dict[str, str], list[str]]:
    """(method, {flag: value as typed}, more argv): a few numeric flags, some at the edges, on top of a valid command."""
    method = draw(st.sampled_from(["none", "draft", "ngram"]))
    flags = {name: draw(NUMERIC[name]) for name in draw(st.permutations(sorted(NUMERIC)))[: draw(st.integers(1, 3))]}
    more: list[str] = []
    number, device = mostly(st.integers(1, 4)), mostly(st.just(0))
    if method == "draft":
        more += ["--draft_target_model_config", f"[{draw(number)},[{draw(device)}],[{draw(device)}],{draw(st.sampled_from(['True', 'False']))}]"]
    elif method == "ngram":
        more += ["--ngram_config", f"[{draw(number)},{draw(number)},[0]]"]
    if "repeat" in flags:
        more.append("--baseline")
    if draw(st.integers(0, 3)) == 0:
        more += ["--stop_words", draw(any_text(6))]
    return method, flags, more


@fuzz_settings(60)
@given(run_options())
def test_numeric_options_run_correctly_or_fail_in_one_line(engines, tmp_path_factory, options):
    method, flags, more = options
    out = tmp_path_factory.mktemp("o") / "out.json"
    args = ["--engine_dir", engines / "target", "--input_text", PROMPT, "--output_json", out, *more]
    if method == "draft":
        args += ["--draft_engine_dir", engines / "draft"]
    flags = {"num_threads": "1", "max_output_len": "24", **flags}  # one thread unless fuzzed: the machine is shared
    args += argv(flags)
    r = run(*args)
    assert_clean(r, out)
    if r.exit_code != 0:
        return
    report = json.loads(out.read_text())
    (request,) = report["requests"]
    wanted = int(flags["max_output_len"])
    assert 1 <= len(request["output_ids"]) <= wanted
    temperature, top_k = _float(flags.get("temperature", "0")), flags.get("top_k", "0")
    stops = "--stop_words" in more
    if (temperature < GREEDY_TEMPERATURE or top_k.strip() == "1") and not stops and flags.get("end_id", "-1").strip().lstrip("-").isdigit():
        end_id = int(flags.get("end_id", "-1"))
        reference = greedy_reference(engines, min(wanted, 90))
        if end_id >= 0 and end_id in reference:
            reference = reference[: reference.index(end_id) + 1]
        assert request["output_ids"] == reference[: len(request["output_ids"])]  # greedy, whatever the method and the draft


DRAFT = ("--draft_target_model_config", "[3,[0],[0],True]")


@pytest.mark.parametrize(("flag", "value", "message"), [
    ("--temperature", "1e-320", None),  # subnormal: logits / T overflowed to inf, and NaN picked a garbage token
    ("--temperature", "nan", "temperature=nan must be a finite number"),
    ("--random_seed", "-1", "random_seed=-1 must be an integer >= 0"),  # was a numpy ValueError traceback
    ("--num_threads", "99999999999", "--num_threads 99999999999: expected a number of threads from 1"),  # a pybind TypeError traceback
    ("--draft_confidence_threshold", "nan", "--draft_confidence_threshold nan: expected a probability"),  # was accepted
    ("--ngram_min_match", "-5", "--ngram_min_match -5: expected a pattern length >= 1"),  # was clamped silently
    ("--ngram_min_match", "3", "--ngram_min_match 3: expected a pattern length >= 1 and at most max_matching_ngram_size (2)"),  # likewise
    ("--repeat", "1000000", "--repeat 1000000: expected a number from 1 to 100"),  # ran two million timed decodes
])
def test_numbers_at_the_edges_regressions(engines, tmp_path, flag, value, message):
    out = tmp_path / "out.json"
    method = ("--ngram_config", "[3,2,[0]]") if flag == "--ngram_min_match" else ("--draft_engine_dir", engines / "draft", *DRAFT)
    method += ("--baseline",) if flag == "--repeat" else ()
    r = run("--engine_dir", engines / "target", *method, "--input_text", PROMPT, "--max_output_len", 12, "--num_threads", 1, "--output_json", out,
            flag, value)
    assert_clean(r, out)
    if message is None:  # below GREEDY_TEMPERATURE: exactly greedy
        assert r.exit_code == 0, r.output
        assert json.loads(out.read_text())["requests"][0]["output_ids"] == greedy_reference(engines, 12)
    else:
        assert r.exit_code == 1 and message in r.stderr, r.stderr


@pytest.mark.parametrize(("args", "message"), [
    (["--ngram_min_match", "2"], "--ngram_min_match is a setting of the 'ngram' method, which is not asked for: add --ngram_config"),
    (["--ngram_keep_newest"], "--ngram_keep_newest is a setting of the 'ngram' method"),
    (["--ngram_config", "[3,2,[0]]", "--draft_confidence_threshold", "0.5"],
     "--draft_confidence_threshold is a setting of the 'draft' method, which is not asked for: add --draft_engine_dir"),
    (["--draft_len", "2"], "draft_len=2 but no drafting method is loaded"),
    (["--prefix_cache_slots", "2", "--no_enable_prefix_caching"], "prefix_cache_slots=2 with prefix caching off"),
    (["--end_id", "100000"], "--end_id 100000 is outside the engine's vocabulary"),  # no request could stop on it
    (["--tokenizer_dir", Path(__file__).resolve().parents[2] / "examples" / "demo-pair" / "target"],
     "uses token ids up to 4095, past the engine's vocabulary"),  # another model's tokenizer: its ids are not this model's
])
def test_a_setting_nothing_would_use_is_refused(engines, tmp_path, args, message):
    """Each of these ran before, the setting dropped without a word."""
    r = run("--engine_dir", engines / "target", "--input_text", PROMPT, "--max_output_len", 4, "--num_threads", 1, "--output_json",
            tmp_path / "o.json", *args)
    assert_clean(r, tmp_path / "o.json")
    assert r.exit_code == 1 and message in r.stderr, r.stderr


def test_a_prompt_that_is_not_unicode_is_one_clean_line(engines, tmp_path):
    # regression: a lone surrogate (undecodable argv bytes) reached the tokenizers library, which raised TypeError
    r = run("--engine_dir", engines / "target", "--input_text", "w5 \udcff w6", "--output_json", tmp_path / "o.json")
    assert_clean(r, tmp_path / "o.json")
    assert r.exit_code == 1 and "is not valid Unicode: a lone surrogate '\\udcff' at character 3" in r.stderr


@st.composite
def input_files(draw) -> tuple[str, bytes]:
    """(suffix, content) of an --input_file: text of any characters, CSV rows at the edges, .npy arrays of any dtype and
    shape, and .npy files cut short or of random bytes."""
    import io

    import numpy as np

    suffix = draw(st.sampled_from([".txt", ".csv", ".npy"]))
    if suffix == ".txt":
        return suffix, draw(any_text(80)).encode("utf-8", "surrogatepass")
    if suffix == ".csv":
        rows = draw(st.lists(st.lists(st.one_of(number_text(), st.integers(0, 95).map(str)), max_size=5), min_size=1, max_size=3))
        return suffix, "\n".join(",".join(r) for r in rows).encode("utf-8", "surrogatepass")
    if draw(st.booleans()):
        return suffix, draw(st.binary(max_size=200))
    dtype = draw(st.sampled_from(["int64", "int32", "uint64", "int8", "float32", "bool", "complex64"]))
    shape = draw(st.lists(st.integers(0, 4), max_size=3))
    values = draw(st.lists(st.integers(-(2**63), 2**63 - 1), min_size=int(np.prod(shape)), max_size=int(np.prod(shape))))
    buf = io.BytesIO()
    np.save(buf, np.array(values, dtype=np.int64).reshape(shape).astype(dtype))
    data = buf.getvalue()
    return suffix, data[: draw(st.integers(0, len(data)))] if draw(st.booleans()) else data


@fuzz_settings(80)
@given(input_files())
def test_input_files_run_or_fail_in_one_line(engines, tmp_path_factory, file):
    suffix, content = file
    d = tmp_path_factory.mktemp("f")
    (d / f"prompts{suffix}").write_bytes(content)
    r = run("--engine_dir", engines / "target", "--input_file", d / f"prompts{suffix}", "--max_output_len", 4, "--num_threads", 1,
            "--output_json", d / "out.json")
    assert_clean(r, d / "out.json")


def test_an_empty_npy_input_file_is_one_clean_line(engines, tmp_path):
    (tmp_path / "p.npy").write_bytes(b"")  # regression: np.load's EOFError, which click turns into "Aborted!"
    r = run("--engine_dir", engines / "target", "--input_file", tmp_path / "p.npy", "--output_json", tmp_path / "o.json")
    assert_clean(r, tmp_path / "o.json")
    assert r.exit_code == 1 and "is not a plain numpy array" in r.stderr
