"""specdec-train as a user meets it: a happy path, and bad inputs answered with one line, exit 1, no traceback, nothing written."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from train_fixtures import repetitive_data, tiny_base  # noqa: F401 (fixtures)

from specdec.cli.train import main

DEMO = Path(__file__).resolve().parents[2] / "examples" / "demo-pair"


def invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def test_run_and_prepare_data_through_the_cli(tmp_path, tiny_base, repetitive_data):
    prompts = tmp_path / "p.txt"
    prompts.write_text("w5 w6\nw7 w8\n")
    r = invoke("prepare-data", "--model_dir", tiny_base, "--data_path", prompts, "--output_path", tmp_path / "d.jsonl", "--max_token", 4, "-q")
    assert r.exit_code == 0, r.output
    assert "wrote 2 answers" in r.output and len((tmp_path / "d.jsonl").read_text().splitlines()) == 2
    r = invoke("run", "--mode", "medusa", "--model", tiny_base, "--data", repetitive_data, "--output_dir", tmp_path / "out",
               "--max_steps", 3, "--save_steps", 2, "--lr", 1e-3, "--medusa_num_heads", 3, "--medusa-num-layers", 2, "-q", "--num_threads", 1)
    assert r.exit_code == 0, r.output
    assert "trained medusa for 3 steps" in r.output
    cfg = json.loads((tmp_path / "out" / "config.json").read_text())
    assert cfg["medusa"] == {"num_medusa_heads": 3, "num_medusa_layers": 2}
    assert {p.name for p in (tmp_path / "out").iterdir()} >= {"checkpoint-2", "checkpoint-3", "README.md", "loss_curve.png", "model.safetensors"}
    r = invoke("run", "--mode", "eagle", "--model", tiny_base, "--data", repetitive_data, "--output_dir", tmp_path / "e",
               "--max_steps", 1, "--eagle_aux_layer_ids", "0,2,3", "--eagle-ttt-steps", 2, "-q", "--num_threads", 1)
    assert r.exit_code == 0, r.output
    assert r.output.split("top-1 ")[1].split(";")[0].count(",") == 1  # top-1 at depths 1 and 2
    cfg = json.loads((tmp_path / "e" / "config.json").read_text())
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [0, 2, 3]
    assert cfg["specdec_train"]["eagle_ttt_steps"] == 2
    r = invoke("run", "--mode", "peagle", "--model", tiny_base, "--data", repetitive_data, "--output_dir", tmp_path / "p",
               "--max_steps", 1, "--peagle_depths", 3, "--peagle_mask_token_id", 7, "--peagle_gate", "greedy", "-q", "--num_threads", 1)
    assert r.exit_code == 0, r.output
    assert r.output.split("top-1 ")[1].split(";")[0].count(",") == 2  # top-1 at drafting positions 1, 2, 3
    cfg = json.loads((tmp_path / "p" / "config.json").read_text())
    assert (cfg["ptd_token_id"], cfg["para_depths"], cfg["peagle_placeholders"]) == (7, 3, "anchored")
    assert cfg["specdec_train"]["peagle_gate"] == "greedy"  # the recipe, in the module's provenance
    r = invoke("run", "--mode", "peagle", "--model", tiny_base, "--data", repetitive_data, "--output_dir", tmp_path / "c",
               "--max_steps", 1, "--peagle_depths", 3, "--peagle_placeholders", "constant", "-q", "--num_threads", 1)
    assert r.exit_code == 0, r.output
    assert "peagle_placeholders" not in json.loads((tmp_path / "c" / "config.json").read_text())  # vLLM's layout, as speculators writes it


def _empty(tmp_path):
    p = tmp_path / "empty.jsonl"
    p.write_text("")
    return p


@pytest.mark.parametrize("case, extra, message", [
    ("missing data", lambda t: ["--data", t / "nope.jsonl"], "--data .*nope.jsonl does not exist"),
    ("empty data", lambda t: ["--data", _empty(t)], "empty.jsonl is empty; nothing to train on"),
    ("unknown mode", lambda t: ["--mode", "lookahead"], "--mode 'lookahead' is not one of medusa, eagle"),
    ("no heads", lambda t: ["--medusa_num_heads", 0], "--medusa_num_heads 0 must be >= 1"),
    ("no ttt steps", lambda t: ["--mode", "eagle", "--eagle_ttt_steps", 0], "--eagle_ttt_steps 0 must be >= 1"),
    ("decay out of range", lambda t: ["--mode", "eagle", "--eagle_loss_decay_factor", 1.5], r"--eagle_loss_decay_factor 1.5 must be in \(0, 1\]"),
    ("aux layer out of range", lambda t: ["--mode", "eagle", "--eagle_aux_layer_ids", "1,9"],
     r"--eagle_aux_layer_ids \[1, 9\]: the base model has layers 0..3 only"),
    ("no parallel depths", lambda t: ["--mode", "peagle", "--peagle_depths", 0], "--peagle_depths 0 must be >= 2"),
    ("one parallel depth", lambda t: ["--mode", "peagle", "--peagle_depths", 1], "--peagle_depths 1 must be >= 2.*1 trains no placeholder"),
    ("mask token out of range", lambda t: ["--mode", "peagle", "--peagle_mask_token_id", 96],
     r"--peagle_mask_token_id 96 is outside the base model's vocabulary \(0..95\)"),
    ("sample ratio out of range", lambda t: ["--mode", "peagle", "--peagle_down_sample_ratio", 0],
     r"--peagle_down_sample_ratio 0.0 must be in \(0, 1\]"),
    ("resume with nothing", lambda t: ["--resume", True], "holds no checkpoint-N folder to resume from"),
    ("warmup past the steps", lambda t: ["--warmup_steps", 5], "--warmup_steps 5 is more than --max_steps 2"),
    ("empty eval data", lambda t: ["--eval_data", _empty(t)], "--eval_data .*empty.jsonl is empty; nothing to report on"),
    ("not a model", lambda t: ["--model", t], "is not a Hugging Face model directory"),
    ("heads, not a base", lambda t: ["--model", DEMO / "heads" / "peagle"],
     "holds draft heads .* --model takes the base model they are trained on"),
    ("medusa heads, not a base", lambda t: ["--model", DEMO / "heads" / "medusa"], "holds draft heads"),
])
def test_bad_inputs_are_one_line_errors(tmp_path, tiny_base, repetitive_data, case, extra, message):
    args = {"--mode": "medusa", "--model": tiny_base, "--data": repetitive_data, "--output_dir": tmp_path / "out", "--max_steps": 2}
    more = extra(tmp_path)
    args |= dict(zip(more[::2], more[1::2], strict=True))
    r = invoke("run", *[x for flag, value in args.items() for x in ([flag] if value is True else [flag, value])])
    assert r.exit_code == 1, (case, r.output)
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), r.output
    assert __import__("re").search(message, lines[0]), lines[0]
    assert "Traceback" not in r.output
    assert not (tmp_path / "out").exists(), "a refused run left an output directory"


def test_refuses_a_non_empty_output_dir(tmp_path, tiny_base, repetitive_data):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep.txt").write_text("mine")
    r = invoke("run", "--mode", "eagle", "--model", tiny_base, "--data", repetitive_data, "--output_dir", tmp_path / "out", "--max_steps", 1)
    assert r.exit_code == 1 and "pass --resume to continue its run or --overwrite_output_dir" in r.output
    assert (tmp_path / "out" / "keep.txt").read_text() == "mine"


def test_subprocess_error_has_no_traceback(tmp_path):
    # the installed console script's entry point, in a real process
    proc = subprocess.run([sys.executable, "-m", "specdec.cli.train", "prepare-data", "--model_dir", tmp_path, "--data_path",
                           tmp_path / "missing.txt", "--output_path", tmp_path / "o.jsonl"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    assert proc.stderr.strip() == f"error: --data_path {tmp_path / 'missing.txt'} does not exist or is not a file."
    assert not (tmp_path / "o.jsonl").exists()


def test_data_without_answer_tokens_is_refused(tmp_path, tiny_base):
    prompts_only = tmp_path / "prompts_only.jsonl"
    prompts_only.write_text(json.dumps({"input_ids": [5, 6, 7, 8], "prompt_len": 4}) + "\n" + json.dumps({"input_ids": [5, 6],
                                                                                                          "prompt_len": 0}) + "\n")
    r = invoke("run", "--mode", "medusa", "--model", tiny_base, "--data", prompts_only, "--output_dir", tmp_path / "out")
    assert r.exit_code == 1 and "has no sequence with a token to learn (of 2 lines" in r.output, r.output
    assert not (tmp_path / "out").exists()


def test_resume_refuses_to_end_before_the_checkpoints_step(tmp_path, tiny_base, repetitive_data):
    """--max_steps below the step a checkpoint reached trained nothing and rewrote the outputs as a run of that many steps."""
    base = ["run", "--mode", "medusa", "--model", tiny_base, "--data", repetitive_data, "--output_dir", tmp_path / "out", "--lr", 1e-2,
            "-q", "--num_threads", 1]
    r = invoke(*base, "--max_steps", 8, "--save_steps", 4)  # 24 sequences in batches of 4: an epoch is 6 steps
    assert r.exit_code == 0, r.output
    written = {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in (tmp_path / "out").iterdir() if p.is_file()}
    for extra, message in [
        (["--max_steps", 3], "--max_steps 3 ends before step 8, where {ckpt} already is; resume with --max_steps 8 or more, or leave out"),
        ([], "--num_epochs 1 (6 steps) ends before step 8, where {ckpt} already is; resume with --num_epochs 2 or more (or --max_steps 8)"),
    ]:
        r = invoke(*base, "--resume", *extra)
        assert r.exit_code == 1, r.output
        lines = r.output.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: --resume: "), r.output
        assert message.format(ckpt=tmp_path / "out" / "checkpoint-8") in lines[0], r.output
        assert {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in (tmp_path / "out").iterdir() if p.is_file()} == written
    r = invoke(*base, "--resume", "--max_steps", 8)  # at the step asked for: the outputs are written again (an interrupted end)
    assert r.exit_code == 0 and "already at step 8 of 8" in r.output, r.output


@pytest.mark.parametrize("mode, flag, value, owners", [
    ("eagle", "--peagle_depths", 4, "peagle"),
    ("eagle", "--peagle-placeholders", "constant", "peagle"),  # the dashed spelling too
    ("eagle", "--peagle_gate", "greedy", "peagle"),
    ("medusa", "--eagle_num_layers", 2, "eagle or peagle"),
    ("medusa", "--eagle_aux_layer_ids", "0,1", "eagle or peagle"),
    ("peagle", "--eagle_ttt_steps", 2, "eagle"),  # P-EAGLE drafts its depths in one pass: no TTT steps
    ("eagle", "--medusa_num_heads", 3, "medusa"),
    ("peagle", "--medusa_num_layers", 1, "medusa"),  # given, though equal to the default
])
def test_another_modes_flags_are_refused(tmp_path, tiny_base, repetitive_data, mode, flag, value, owners):
    """They were dropped without a word: --mode eagle --peagle_depths 4 trained an EAGLE-3 module and said nothing."""
    r = invoke("run", "--mode", mode, "--model", tiny_base, "--data", repetitive_data, "--output_dir", tmp_path / "out", "--max_steps", 1,
               flag, value)
    assert r.exit_code == 1, r.output
    name = flag.replace("-", "_").replace("__", "--")
    assert r.output.strip() == (f"error: {name} is a setting of --mode {owners}, not of --mode {mode}: drop it, or train with "
                                f"--mode {owners.split()[0]}."), r.output
    assert not (tmp_path / "out").exists()
