"""The CLIs as a user meets them: click's runner, and one real subprocess each."""

import json
import subprocess
import sys

import pytest
from click.testing import CliRunner
from conftest import spec_build

from specdec.builder.build import build_engine
from specdec.cli.build import main as build_main
from specdec.cli.run import main as run_main


@pytest.fixture(scope="module")
def engines(tmp_path_factory, llama_ckpt):
    d = tmp_path_factory.mktemp("cli")
    build_engine(llama_ckpt, d / "target", spec_build(4), say=lambda _: None)
    build_engine(llama_ckpt, d / "draft", spec_build(0), say=lambda _: None)
    (d / "prompts.csv").write_text("5,6,7,8\n9,10,11\n")
    return d


def invoke(cli, *args):
    return CliRunner().invoke(cli, [str(a) for a in args])


def test_build_cli_with_dashed_aliases(tmp_path, llama_ckpt):
    r = invoke(build_main, "--model-dir", llama_ckpt, "--output-dir", tmp_path / "e", "--max-seq-len", 64,
               "--speculative-decoding-mode", "draft_tokens_external", "--max-draft-len", 3)
    assert r.exit_code == 0, r.output
    assert "built" in r.output and "draft 3 (draft_tokens_external)" in r.output
    cfg = json.loads((tmp_path / "e" / "config.json").read_text())
    assert cfg["build"]["max_draft_len"] == 3 and cfg["build"]["max_input_len"] == 32


def test_build_cli_errors_are_one_line(tmp_path, llama_ckpt):
    r = invoke(build_main, "--checkpoint_dir", llama_ckpt, "--output_dir", tmp_path / "e", "--max_seq_len", 64, "--max_input_len", 64)
    assert r.exit_code == 1
    errors = [line for line in r.output.splitlines() if line.startswith("error:")]
    assert errors == ["error: invalid build configuration: max_input_len=64 must be smaller than max_seq_len=64 (room for output tokens)."]
    assert "Traceback" not in r.output


@pytest.mark.parametrize(("flags", "message"), [
    (["--trt_version_compatible"], "error: --trt_version_compatible only applies to --backend tensorrt (this build uses onnxruntime)."),
    (["--backend", "onnxruntime", "--trt_timing_cache", "t.cache", "--trt_version_compatible"],
     "error: --trt_timing_cache, --trt_version_compatible only apply to --backend tensorrt (this build uses onnxruntime)."),
    (["--backend", "tensorrt", "--trt_exclude_lean_runtime"],
     "error: --trt_exclude_lean_runtime only applies to version-compatible plans: add --trt_version_compatible."),
])
def test_build_cli_refuses_tensorrt_options_that_cannot_apply(tmp_path, llama_ckpt, flags, message):
    r = invoke(build_main, "--checkpoint_dir", llama_ckpt, "--output_dir", tmp_path / "e", "--max_seq_len", 64, *flags)
    assert r.exit_code == 1 and message in r.output.splitlines(), r.output
    assert not (tmp_path / "e").exists() and not list(tmp_path.glob(".e.*"))


def test_run_cli_stop_words_without_tokenizer_is_one_line(engines):
    r = invoke(run_main, "--engine_dir", engines / "target", "--input_file", engines / "prompts.csv", "--stop_words", "return")
    assert r.exit_code == 1
    assert "error: --stop_words needs a tokenizer: pass --tokenizer_dir." in r.output and "Traceback" not in r.output


def test_run_cli_draft_target_writes_outputs(engines, tmp_path):
    r = invoke(run_main, "--engine_dir", engines / "target", "--draft_engine_dir", engines / "draft",
               "--draft_target_model_config", "[4,[0],[0],False]", "--input_file", engines / "prompts.csv",
               "--max_output_len", 12, "--baseline", "--output_json", tmp_path / "o.json", "--output_csv", tmp_path / "o.csv",
               "--output_npy", tmp_path / "o.npy")
    assert r.exit_code == 0, r.output
    assert "acceptance rate 1.000" in r.output  # the draft is the target itself
    assert "outputs identical to target-only: yes" in r.output
    report = json.loads((tmp_path / "o.json").read_text())
    assert [len(q["output_ids"]) for q in report["requests"]] == [12, 12]
    assert report["requests"][0]["input_ids"] == [5, 6, 7, 8]
    assert report["metrics"]["acceptance_rate"] == 1.0
    rows = (tmp_path / "o.csv").read_text().splitlines()
    assert [int(x) for x in rows[0].split(",")] == report["requests"][0]["output_ids"]
    import numpy as np

    assert np.load(tmp_path / "o.npy").tolist() == [q["output_ids"] for q in report["requests"]]
    r = invoke(run_main, "--engine_dir", engines / "target", "--input_file", engines / "prompts.csv", "--max_output_len", 4,
               "--output_npy", tmp_path / "ids.bin")
    assert r.exit_code == 0 and np.load(tmp_path / "ids.bin").shape == (2, 4) and not (tmp_path / "ids.bin.npy").exists()  # the path given


def test_the_baseline_caches_prefixes_as_the_method_does(engines, tmp_path):
    """--baseline's target-only run takes the method's prefix-cache settings: a baseline that reused shared prefixes where the
    method may not would skew the speedup (it used to cache whatever the flags said)."""
    shared = tmp_path / "shared.csv"
    prefix = ",".join(str(5 + i % 40) for i in range(40))
    shared.write_text(f"{prefix},50\n{prefix},51\n{prefix},52\n")
    for flag, cached in (("--no_enable_prefix_caching", False), ("--enable_prefix_caching", True)):
        r = invoke(run_main, "--engine_dir", engines / "target", "--draft_engine_dir", engines / "draft", "--input_file", shared,
                   "--max_output_len", 4, "--baseline", flag, "--output_json", tmp_path / "b.json")
        assert r.exit_code == 0, r.output
        report = json.loads((tmp_path / "b.json").read_text())
        assert (report["baseline"]["metrics"]["cached_tokens"] > 0) == cached, report["baseline"]["metrics"]


def test_run_cli_measures_step_costs_at_load_when_asked(engines, tmp_path):
    """--measure_step_costs on times the target's calls before decoding; the output is the same as without it (greedy), and an
    unknown value is click's usage error, not a traceback."""
    args = ["--engine_dir", engines / "target", "--ngram_config", "[4,2,[0]]", "--draft_len", "auto", "--input_file", engines / "prompts.csv",
            "--max_output_len", 8]
    on = invoke(run_main, *args, "--measure_step_costs", "on", "--output_json", tmp_path / "on.json")
    off = invoke(run_main, *args, "--measure_step_costs", "off", "--output_json", tmp_path / "off.json")
    assert on.exit_code == 0 and off.exit_code == 0, on.output + off.output
    outs = [[q["output_ids"] for q in json.loads((tmp_path / f"{n}.json").read_text())["requests"]] for n in ("on", "off")]
    assert outs[0] == outs[1] and all(len(o) == 8 for o in outs[0])
    assert "note: timed the target's calls at 15 shapes (batch sizes 1, 2, 4; widths 1-5)" in on.output and "timed the target" not in off.output
    bad = invoke(run_main, *args, "--measure_step_costs", "always")
    assert bad.exit_code == 2 and "'always' is not one of 'auto', 'on', 'off'" in bad.output and "Traceback" not in bad.output


@pytest.mark.parametrize(
    "args,message",
    [
        (["--draft_target_model_config", "[4,[0],[0]]"],
         "malformed (wrong shape); expected [draft_len, [draft device ids], [target device ids], use_logits], e.g."),
        (["--draft_target_model_config", "__import__('os')"], "is malformed"),
        (["--draft_target_model_config", "[9,[0],[0],False]"], "draft_len=9 is larger than the target engine's max_draft_len=4"),
        (["--draft_target_model_config", "[2,[0],[1],False]"], "target device 1 does not exist"),
        (["--draft_target_model_config", "[2,[0,0],[0],False]"], "names 2 device(s), but the draft engine"),
        (["--ngram_config", "[4,2,[0]]", "--draft_target_model_config", "[2,[0],[0],False]"], "mutually exclusive"),
        (["--ngram_config", "[10,2]"], "--ngram_config '[10,2]' is malformed"),
        (["--ngram_config", "[10,2,[0]]"], "ngram max_draft_len=10 is larger than the target engine's max_draft_len=4"),
        # each names what the user gave: --draft_len itself, or the suffix config's own limit (they were named the other way round)
        (["--ngram_config", "[4,2,[0]]", "--draft_len", "12"], "error: draft_len=12 is larger than the target engine's max_draft_len=4"),
        (["--suffix_config", '{"max_draft_len": 12}'], "suffix max_draft_len=12 is larger than the target engine's max_draft_len=4"),
        (["--suffix_config", '{"min_token_prob": 2}'], "is malformed (min_token_prob must be in [0, 1], found 2"),
        (["--ngram_config", "[4,2,[]]"], "is malformed (the device list needs the target's device id"),  # was read as [0]
    ],
)
def test_run_cli_errors(engines, args, message):
    alone = any("ngram" in a or "suffix" in a for a in args) and not any("draft_target" in a for a in args)  # methods without a draft
    draft = [] if alone else ["--draft_engine_dir", engines / "draft"]
    r = invoke(run_main, "--engine_dir", engines / "target", *draft, *args, "--input_file", engines / "prompts.csv")
    assert r.exit_code == 1, r.output
    assert message in r.output
    assert "Traceback" not in r.output


def test_run_cli_target_without_draft_mode(engines):
    r = invoke(run_main, "--engine_dir", engines / "draft", "--draft_engine_dir", engines / "draft",  # built without draft mode
               "--draft_target_model_config", "[2,[0],[0],False]", "--input_file", engines / "prompts.csv")
    assert r.exit_code == 1
    assert "cannot verify drafts (a draft or plain engine). If it is the draft, pass it as the draft engine" in r.output
    assert "rebuild the target with --speculative_decoding_mode draft_tokens_external --max_draft_len 8." in r.output


def test_run_cli_another_tokenizer_drafts_through_text(engines, tmp_path):
    import shutil

    from tokenizers import Tokenizer, models, pre_tokenizers

    def with_tokenizer(src, dst, words):
        shutil.copytree(src, dst)
        tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token=words[0]))
        tok.pre_tokenizer = pre_tokenizers.Whitespace()
        tok.save(str(dst / "tokenizer.json"))

    with_tokenizer(engines / "target", tmp_path / "t", ["<unk>", "a", "b"])
    with_tokenizer(engines / "draft", tmp_path / "d", ["<unk>", "x", "y"])
    # the copied tokenizer changed the engine's files: re-hash via a fresh config is not allowed, so skip hash checks
    for d in (tmp_path / "t", tmp_path / "d"):
        cfg = json.loads((d / "config.json").read_text())
        from specdec.formats.engine_format import sha256_file

        cfg["files"]["tokenizer.json"] = sha256_file(d / "tokenizer.json")
        (d / "config.json").write_text(json.dumps(cfg))
    r = invoke(run_main, "--engine_dir", tmp_path / "t", "--draft_engine_dir", tmp_path / "d",
               "--draft_target_model_config", "[2,[0],[0],False]", "--input_text", "a b", "--max_output_len", 8, "--baseline")
    assert r.exit_code == 0, r.output
    assert "cross-tokenizer mode" in r.output and "outputs identical to target-only: yes" in r.output
    # --allow_vocab_mismatch takes the ids as they are, with a warning
    r = invoke(run_main, "--engine_dir", tmp_path / "t", "--draft_engine_dir", tmp_path / "d", "--allow_vocab_mismatch",
               "--draft_target_model_config", "[2,[0],[0],False]", "--input_text", "a b", "--max_output_len", 8)
    assert r.exit_code == 0 and "pairing:" not in r.output


@pytest.mark.parametrize("use_logits,same", [("False", True), ("True", None)])
def test_run_cli_baseline_says_whether_a_sample_is_target_onlys(engines, use_logits, same):
    """A sampled --baseline: drafts verified by token compare give target-only's sample for the seed (the line says so and
    it is so); rejection sampling's follows its drafts (the line says that instead of promising)."""
    r = invoke(run_main, "--engine_dir", engines / "target", "--draft_engine_dir", engines / "draft", "--draft_target_model_config",
               f"[3,[0],[0],{use_logits}]", "--temperature", 0.8, "--top_p", 0.9, "--random_seed", 3, "--input_file",
               engines / "prompts.csv", "--max_output_len", 16, "--baseline", "--draft_len", "auto" if same else 3)
    assert r.exit_code == 0, r.output
    line = next(x for x in r.output.splitlines() if x.startswith("outputs identical to target-only"))
    if same:
        assert line == "outputs identical to target-only: yes (sampled by token compare: target-only's draws, expected to be identical)"
    else:
        assert line.endswith("(rejection sampling: the sample follows the drafts, not expected to be identical)")


def test_run_cli_suffix_config(engines):
    r = invoke(run_main, "--engine_dir", engines / "target", "--suffix_config", '{"max_draft_len": 4, "global_cache": false}',
               "--input_file", engines / "prompts.csv", "--max_output_len", 12, "--baseline")
    assert r.exit_code == 0, r.output
    assert "--- suffix ---" in r.output and "outputs identical to target-only: yes" in r.output
    r = invoke(run_main, "--engine_dir", engines / "target", "--suffix_config", "[4, 24, 7]", "--input_text", "x")
    assert r.exit_code == 1 and r.output.count("\n") == 1 and "a list holds 1 or 2 numbers" in r.output
    r = invoke(run_main, "--engine_dir", engines / "target", "--suffix_config", "[4]", "--ngram_config", "[4,2,[0]]", "--input_text", "x")
    assert r.exit_code == 1 and "--suffix_config is a drafting method of its own" in r.output


def test_run_cli_subprocess(engines):
    """One real process: exit code and stderr as a shell user sees them."""
    ok = subprocess.run([sys.executable, "-m", "specdec.cli.run", "--engine_dir", str(engines / "target"), "--ngram_config", "[4,2,[0]]",
                         "--input_file", str(engines / "prompts.csv"), "--max_output_len", "8"], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    assert "--- ngram ---" in ok.stdout
    bad = subprocess.run([sys.executable, "-m", "specdec.cli.run", "--engine_dir", str(engines / "nothere"), "--input_text", "x"],
                         capture_output=True, text=True)
    assert bad.returncode == 1
    assert bad.stderr.strip().startswith("error: engine directory") and "Traceback" not in bad.stderr


def test_run_cli_input_files_and_output_dirs(engines, tmp_path):
    import numpy as np

    bad = tmp_path / "bad.csv"
    bad.write_text("5,6,x\n")
    r = invoke(run_main, "--engine_dir", engines / "target", "--input_file", bad)
    assert r.exit_code == 1 and "line 1: expected comma-separated token ids" in r.output
    r = invoke(run_main, "--engine_dir", engines / "target", "--input_file", tmp_path / "missing.txt")
    assert r.exit_code == 1 and "does not exist" in r.output

    padded = tmp_path / "ids.npy"
    np.save(padded, np.array([[5, 6, 7, 8], [9, 10, -1, -1]]))  # right-padded rows, as TensorRT-LLM writes them
    out = tmp_path / "new" / "dir" / "o.json"  # parents are created
    r = invoke(run_main, "--engine_dir", engines / "target", "--input_file", padded, "--max_output_len", 3, "--top_p", 0, "--output_json", out)
    assert r.exit_code == 0, r.output
    assert [q["input_ids"] for q in json.loads(out.read_text())["requests"]] == [[5, 6, 7, 8], [9, 10]]


def test_engine_directory_is_readable_by_others(engines):
    import stat

    for f in [engines / "target", *(engines / "target").iterdir()]:
        mode = stat.S_IMODE(f.stat().st_mode)
        assert mode & 0o044 == 0o044, (f, oct(mode))


def test_run_cli_streaming_prints_tokens_as_accepted(engines, tmp_path):
    (tmp_path / "one.csv").write_text("5,6,7,8\n")
    args = ["--engine_dir", engines / "target", "--draft_engine_dir", engines / "draft", "--draft_target_model_config", "[3,[0],[0],False]",
            "--input_file", tmp_path / "one.csv", "--max_output_len", 10]
    plain = invoke(run_main, *args, "--output_json", tmp_path / "o.json")
    streamed = invoke(run_main, *args, "--streaming")
    assert plain.exit_code == 0 and streamed.exit_code == 0, streamed.output
    want = json.loads((tmp_path / "o.json").read_text())["requests"][0]["output_ids"]
    first_line = streamed.output.splitlines()[0]  # no tokenizer: ids are streamed as numbers
    assert [int(t) for t in first_line.split()] == want
    many = invoke(run_main, *args[:4], "--input_file", engines / "prompts.csv", "--streaming")
    assert many.exit_code == 1 and "exactly one prompt" in many.output


def test_run_cli_says_before_the_first_round_that_untokenized_vocabularies_differ(engines, tmp_path):
    """A draft and a target without tokenizer.json whose vocabularies differ in size: nothing can show that their ids
    mean the same. specdec-run says so, naming both sizes, before its first round (it used to run at 0% acceptance
    without a word); --allow_vocab_mismatch silences it."""
    from checkpoints import make_checkpoint

    other = make_checkpoint(tmp_path / "other", num_hidden_layers=1, hidden_size=32, intermediate_size=64, vocab_size=80)
    build_engine(other, tmp_path / "draft80", spec_build(0), say=lambda _: None)
    args = ("--engine_dir", engines / "target", "--draft_engine_dir", tmp_path / "draft80", "--draft_target_model_config", "[3,[0],[0],False]",
            "--input_file", engines / "prompts.csv", "--max_output_len", 8)
    r = invoke(run_main, *args)
    assert r.exit_code == 0, r.output
    warned = [line for line in r.stderr.splitlines() if line.startswith("warning:") and "vocabularies of 80 and 96 ids" in line]
    assert len(warned) == 1 and "neither holds a tokenizer.json" in warned[0], r.stderr
    assert r.output.index(warned[0]) < r.output.index("drafted")  # before any round's figures
    quiet = invoke(run_main, *args, "--allow_vocab_mismatch")
    assert quiet.exit_code == 0 and "vocabularies of" not in quiet.output
