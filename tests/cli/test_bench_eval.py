"""specdec-bench and specdec-eval end to end on tiny engines (click's runner)."""

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from checkpoints import add_word_tokenizer, make_checkpoint
from click.testing import CliRunner
from conftest import spec_build
from safetensors.torch import load_file, save_file

from specdec.bench import peers
from specdec.bench.datasets import prepare_from_jsonl, prepare_synthetic
from specdec.bench.sweep import token_agreement
from specdec.builder.build import build_engine
from specdec.cli.bench import main as bench_main
from specdec.cli.eval import main as eval_main
from specdec.formats.errors import RequestError
from specdec.formats.tokenizer import Tokenizer as EngineTokenizer

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def perturbed_copy(src: Path, dst: Path, scale: float = 0.5) -> Path:
    """The same model with Gaussian noise (scale x each matrix's std) on every weight matrix."""
    shutil.copytree(src, dst)
    tensors = load_file(src / "model.safetensors")
    g = torch.Generator().manual_seed(1)
    noisy = {k: (v + scale * v.float().std() * torch.randn(v.shape, generator=g)).to(v.dtype) if v.dim() == 2 else v for k, v in tensors.items()}
    save_file(noisy, dst / "model.safetensors", metadata={"format": "pt"})
    return dst


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    d = tmp_path_factory.mktemp("bench")
    quiet = dict(say=lambda _: None)
    target = add_word_tokenizer(make_checkpoint(d / "ckpt-target", "LlamaForCausalLM", tie_word_embeddings=True))
    draft = add_word_tokenizer(make_checkpoint(d / "ckpt-draft", "LlamaForCausalLM", num_hidden_layers=1, tie_word_embeddings=True))
    noisy = perturbed_copy(target, d / "ckpt-noisy")
    build_engine(target, d / "target", spec_build(4, max_batch_size=2), **quiet)
    build_engine(draft, d / "draft", spec_build(0, max_batch_size=2), **quiet)
    build_engine(noisy, d / "noisy", spec_build(4, max_batch_size=2), **quiet)
    return d


def invoke(cli, *args):
    return CliRunner().invoke(cli, [str(a) for a in args])


# --------------------------------------------------------------------------- prepare-dataset


def test_prepare_dataset_is_reproducible(work, tmp_path):
    args = ["prepare-dataset", "--tokenizer_dir", work / "target", "--num_requests", 20, "--input_mean", 10, "--input_stdev", 3,
            "--output_mean", 12, "--output-stdev", 4]  # dashed alias works too
    files = []
    for name, seed in (("a", 7), ("b", 7), ("c", 8)):
        r = invoke(bench_main, *args, "--random_seed", seed, "--output", tmp_path / f"{name}.jsonl")
        assert r.exit_code == 0, r.output
        files.append((tmp_path / f"{name}.jsonl").read_bytes())
    assert files[0] == files[1] and files[0] != files[2]
    lines = [json.loads(x) for x in files[0].decode().splitlines()]
    assert [x["task_id"] for x in lines] == list(range(20))
    assert all(len(x["input_ids"]) >= 1 and x["output_len"] >= 1 for x in lines)
    ids = {i for x in lines for i in x["input_ids"]}
    assert ids <= set(range(4, 96)), "special ids (pad, bos, eos, unk) must not appear in synthetic prompts"
    assert len({len(x["input_ids"]) for x in lines}) > 1  # stdev > 0: lengths vary


def test_prepare_synthetic_semantics():
    fixed = prepare_synthetic(5, 8, 0, 3, 0, vocab_size=50, seed=0, special_ids=[0, 1, 2])
    assert [len(r["input_ids"]) for r in fixed] == [8] * 5 and [r["output_len"] for r in fixed] == [3] * 5
    assert min(i for r in fixed for i in r["input_ids"]) >= 3
    wide = prepare_synthetic(200, 2, 10, 2, 10, vocab_size=50, seed=0)
    assert min(len(r["input_ids"]) for r in wide) == 1 and min(r["output_len"] for r in wide) == 1  # clipped to >= 1
    assert prepare_synthetic(3, 5, 1, 5, 1, 50, seed=4) == prepare_synthetic(3, 5, 1, 5, 1, 50, seed=4)


@pytest.mark.parametrize(
    "args,message",
    [
        (["--num_requests", 0, "--input_mean", 5, "--output_mean", 5, "--vocab_size", 50], "--num_requests=0 must be >= 1"),
        (["--num_requests", 3, "--input_mean", 0.5, "--output_mean", 5, "--vocab_size", 50], "--input_mean=0.5 must be >= 1"),
        (["--num_requests", 3, "--input_mean", 5, "--output_mean", 5, "--output_stdev", -1, "--vocab_size", 50], "--output_stdev=-1.0 must be >= 0"),
        (["--num_requests", 3, "--input_mean", 5, "--input_stdev", -2, "--output_mean", 5, "--vocab_size", 50], "--input_stdev=-2.0 must be >= 0"),
        (["--num_requests", 3, "--input_mean", 5, "--output_mean", 5], "give exactly one of --tokenizer_dir"),
        (["--num_requests", 3, "--output_mean", 5, "--vocab_size", 50], "a synthetic dataset needs --input_mean"),
        (["--num_requests", 3, "--input_mean", 5, "--output_mean", 5, "--vocab_size", 0], "--vocab_size=0 must be >= 1"),
    ],
)
def test_prepare_dataset_validates(args, message):
    r = invoke(bench_main, "prepare-dataset", *args)
    assert r.exit_code == 1, r.output
    assert message in r.output and "Traceback" not in r.output


def test_prepare_from_jsonl(work, tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text('{"prompt": "w5 w6 w7"}\n\n{"input_ids": [9, 10], "output_len": 4}\n{"input_ids": [11], "output_tokens": 6}\n')
    tok = EngineTokenizer(work / "target")
    recs = prepare_from_jsonl(src, tok, output_mean=3)
    assert recs == [{"input_ids": [1, 5, 6, 7], "output_len": 3}, {"input_ids": [9, 10], "output_len": 4}, {"input_ids": [11], "output_len": 6}]
    with pytest.raises(RequestError, match="has no output_len"):
        prepare_from_jsonl(src, tok)
    with pytest.raises(RequestError, match="text prompt but there is no tokenizer"):
        prepare_from_jsonl(src, None, output_mean=3)
    (tmp_path / "bad.jsonl").write_text('{"input_ids": [1, -2], "output_len": 3}\n')
    with pytest.raises(RequestError, match=r"bad.jsonl:1: input_ids must be"):
        prepare_from_jsonl(tmp_path / "bad.jsonl", None)
    r = invoke(bench_main, "prepare-dataset", "--jsonl", src, "--tokenizer_dir", work / "target", "--output_mean", 3, "-o", tmp_path / "out.jsonl")
    assert r.exit_code == 0, r.output
    assert json.loads((tmp_path / "out.jsonl").read_text().splitlines()[0]) == {"task_id": 0, "input_ids": [1, 5, 6, 7], "output_len": 3}


# --------------------------------------------------------------------------- run


@pytest.fixture(scope="module")
def dataset(work):
    path = work / "data.jsonl"
    r = invoke(bench_main, "prepare-dataset", "--vocab_size", 96, "--num_requests", 4, "--input_mean", 8, "--input_stdev", 2,
               "--output_mean", 10, "--output_stdev", 2, "--random_seed", 1, "--output", path)
    assert r.exit_code == 0, r.output
    return path


def test_bench_run_writes_json_and_plot(work, dataset, tmp_path):
    r = invoke(bench_main, "run", "--engine_dir", work / "target", "--draft_engine_dir", work / "draft", "--dataset", dataset,
               "--method", "none,draft", "--method", "ngram", "--draft_lens", "1,2", "--num_threads", 1, "--step_cost_reps", 10,
               "--output_json", tmp_path / "b.json", "--plot", tmp_path / "b.png")
    assert r.exit_code == 0, r.output
    assert "draft-target k=2" in r.stdout and "c = draft/target one-token step cost" in r.stdout
    report = json.loads((tmp_path / "b.json").read_text())
    labels = [row["label"] for row in report["rows"]]
    assert labels == ["target-only", "draft-target k=1", "draft-target k=2", "ngram k=1 n=2", "ngram k=2 n=2"]
    expected_tokens = sum(json.loads(x)["output_len"] for x in dataset.read_text().splitlines())
    for row in report["rows"]:
        assert row["output_tokens"] == expected_tokens  # every request generated exactly its output_len
        assert row["output_tokens_per_s"] > 0 and math.isfinite(row["speedup"])
        assert 0 < row["latency_p50_s"] <= row["latency_p90_s"] <= row["latency_p99_s"]
        assert row["identical_to_target_only"] is True  # greedy drafting reproduces target-only
        if row["method"] == "none":
            assert row["speedup"] == 1.0 and row["acceptance_rate"] is None
        else:
            assert 0 <= row["acceptance_rate"] <= 1 and 1 <= row["mean_acceptance_length"] <= row["draft_len"] + 1
    c = report["step_cost"]["c"]
    assert c > 0
    for row in report["rows"][1:3]:
        a, k = row["per_token_acceptance"], row["draft_len"]  # alpha: acceptance of the drafts the target reached
        assert a >= row["acceptance_rate"]
        assert row["analytic_bound"] == pytest.approx((1 - a ** (k + 1)) / ((1 - a) * (k * c + 1)))
    png = (tmp_path / "b.png").read_bytes()
    assert png.startswith(PNG_MAGIC) and b"matplotlib" in png  # matplotlib's Software tag


def test_bench_run_batch_and_errors(work, dataset, tmp_path):
    r = invoke(bench_main, "run", "--engine_dir", work / "target", "--dataset", dataset, "--method", "none", "--batch_size", 2,
               "--num_threads", 1, "--output_json", tmp_path / "b.json")
    assert r.exit_code == 0, r.output
    assert json.loads((tmp_path / "b.json").read_text())["settings"]["batch_size"] == 2
    long = tmp_path / "long.jsonl"
    long.write_text('{"input_ids": [5, 6, 7], "output_len": 200}\n')
    for args, message in [
        (["--dataset", long, "--method", "none"], "needs 3 input + 200 output = 203 tokens, more than the engines' max_seq_len=96"),
        (["--dataset", dataset, "--method", "draft"], "--method draft needs a draft engine"),
        (["--dataset", dataset, "--method", "beam"], "--method 'beam' is not one of none, draft, ngram"),
        (["--dataset", dataset, "--method", "ngram", "--draft_lens", "8"],
         "ngram max_draft_len=8 is larger than the target engine's max_draft_len=4"),
        (["--dataset", dataset, "--batch_size", 3], "batch_size=3 exceeds the engines' max_batch_size=2"),
    ]:
        r = invoke(bench_main, "run", "--engine_dir", work / "target", "--num_threads", 1, *args)
        assert r.exit_code == 1, (args, r.output)
        assert message in r.output and "Traceback" not in r.output, r.output


def test_bench_run_sampled(work, dataset, tmp_path):
    """--temperature samples every configuration with the same seeds: drafts verified by token compare (draft-target
    without use_logits, n-gram) give target-only's tokens for the seeds, and the settings record the sampling."""
    args = ["run", "--engine_dir", work / "target", "--draft_engine_dir", work / "draft", "--dataset", dataset, "--method", "none,draft,ngram",
            "--draft_lens", "2", "--num_threads", 1, "--step_cost_reps", 10, "--temperature", 0.9, "--top_p", 0.9, "--random_seed", 5]
    r = invoke(bench_main, *args, "--output_json", tmp_path / "s.json")
    assert r.exit_code == 0, r.output
    report = json.loads((tmp_path / "s.json").read_text())
    assert report["settings"]["greedy"] is False
    assert report["settings"]["sampling"] == {"temperature": 0.9, "top_k": 0, "top_p": 0.9, "random_seed": 5}
    assert all(row["identical_to_target_only"] and row["identical_expected"] for row in report["rows"])
    assert "sampled: temperature 0.9, top_k 0, top_p 0.9, seeds from 5" in r.stdout
    greedy = invoke(bench_main, *args[:-6], "--output_json", tmp_path / "g.json")  # the same run without the sampling flags
    assert greedy.exit_code == 0 and json.loads((tmp_path / "g.json").read_text())["settings"]["sampling"] is None
    for args_, message in [
        (["--temperature", 0.5, "--compare"], "--compare runs the peers greedy"),
        (["--temperature", -1], "temperature=-1.0 must be a finite number >= 0"),
        (["--temperature", 0.5, "--top_p", 2], "top_p=2.0 must be in [0, 1]"),
    ]:
        r = invoke(bench_main, "run", "--engine_dir", work / "target", "--dataset", dataset, "--method", "none", "--num_threads", 1, *args_)
        assert r.exit_code == 1 and message in r.output and "Traceback" not in r.output, (args_, r.output)
    r = invoke(bench_main, "run", "--engine_dir", work / "target", "--dataset", dataset, "--method", "none", "--num_threads", 1, "--top_p", 0.5)
    assert r.exit_code == 0 and "note: --top_k, --top_p and --random_seed apply to sampled runs" in r.output


def test_bench_compare_with_hf(work, dataset, tmp_path):
    r = invoke(bench_main, "run", "--engine_dir", work / "target", "--draft_engine_dir", work / "draft", "--dataset", dataset,
               "--method", "none,draft", "--draft_lens", "2", "--num_threads", 1, "--step_cost_reps", 5, "--compare", "--compare_peers", "hf",
               "--output_json", tmp_path / "c.json")
    assert r.exit_code == 0, r.output
    compare = json.loads((tmp_path / "c.json").read_text())["compare"]
    assert [(x["ours"], x["peer"]) for x in compare] == [("target-only", "hf target-only"), ("draft-target k=2", "hf assisted k=2")]
    for x in compare:  # HF generates the same greedy tokens, request by request
        assert x["agreement_with_our_target_only"] == {"tokens": 1.0, "sequences": 1.0}
        assert x["ratio"] > 0


# --------------------------------------------------------------------------- eval


@pytest.fixture(scope="module")
def eval_set(work):
    """References = HF greedy continuations of the unperturbed target, so only a faithful engine scores ROUGE 1."""
    tok = EngineTokenizer(work / "target")
    prompts = ["w5 w9 w13 w40", "w77 w12", "w30 w31 w32 w33 w34", "w88 w7 w61", "w20 w50 w21 w51 w22", "w44", "w60 w70 w80", "w91 w15 w8 w66"]
    ids = [tok.encode(p) for p in prompts]
    out = peers.hf_generate(str(work / "ckpt-target"), ids, 12, stop_ids=[2], num_threads=1)["output_ids"]
    path = work / "eval.jsonl"
    path.write_text("".join(json.dumps({"prompt": p, "reference": tok.decode(o)}) + "\n" for p, o in zip(prompts, out, strict=True)))
    return path


def test_eval_passes_on_a_faithful_engine(work, eval_set, tmp_path):
    r = invoke(eval_main, "--engine_dir", work / "target", "--draft_engine_dir", work / "draft", "--draft_target_model_config", "[3,[0],[0],False]",
               "--ngram_config", "[4,2,[0]]", "--dataset", eval_set, "--max_output_len", 12, "--check_accuracy", "--rouge_threshold", 0.9,
               "--num_threads", 1, "--output_json", tmp_path / "e.json")
    assert r.exit_code == 0, r.output
    assert "accuracy check passed: target-only" in r.output
    report = json.loads((tmp_path / "e.json").read_text())
    rows = {row["name"]: row for row in report["rows"]}
    assert list(rows) == ["hf", "target-only", "draft-target k=3", "ngram k=4 n=2"]
    assert report["settings"]["hf_model_dir"] == str((work / "ckpt-target").resolve())  # from the engine's config
    for name in ("target-only", "draft-target k=3", "ngram k=4 n=2"):
        assert rows[name]["agreement_with_hf"] == {"tokens": 1.0, "sequences": 1.0}  # fp32 engine == HF, token for token
        assert rows[name]["rouge1"] == pytest.approx(1.0) and rows[name]["rougeL"] == pytest.approx(1.0)
    assert rows["draft-target k=3"]["identical_to_target_only"] is True
    assert report["accuracy_check"] == {"threshold": 0.9, "passed": True, "failed": []}
    assert len(report["examples"]) == 8 and set(report["examples"][0]["outputs"]) == set(rows)


def test_eval_fails_on_a_perturbed_engine(work, eval_set, tmp_path):
    r = invoke(eval_main, "--engine_dir", work / "noisy", "--hf_model_dir", work / "ckpt-target", "--dataset", eval_set,
               "--max_output_len", 12, "--check_accuracy", "--tensorrt_llm_rouge1_threshold", 90, "--num_threads", 1,
               "--output_json", tmp_path / "e.json")
    assert r.exit_code == 1, r.output
    assert "accuracy check FAILED: target-only ROUGE-1" in r.output and "< threshold 90.00" in r.output
    report = json.loads((tmp_path / "e.json").read_text())
    row = report["rows"][1]
    assert row["name"] == "target-only" and row["rouge1"] < 0.9
    assert row["agreement_with_hf"]["tokens"] < 0.9
    assert report["accuracy_check"]["passed"] is False


def test_eval_shows_no_transformers_progress_bar(work, eval_set):
    """HF's model load drew transformers' 'Loading weights' tqdm bar on stderr, among specdec-eval's own progress lines."""
    from transformers.utils import logging as hf_logging

    hf_logging.enable_progress_bar()  # as a fresh process has it (training tests in this process turn it off)
    r = CliRunner().invoke(eval_main, [str(a) for a in ("--engine_dir", work / "target", "--dataset", eval_set, "--num_examples", 2,
                                                         "--max_output_len", 2, "--test_hf", "--num_threads", 1)])
    assert r.exit_code == 0, r.output
    assert r.stderr.splitlines() == ["2 examples, up to 2 new tokens each, greedy", "  decoding with HF transformers",
                                     "  decoding with the engine: target-only"], r.stderr
    assert hf_logging.is_progress_bar_enabled()  # put back as found: only specdec-eval's HF run is silenced


def test_eval_errors(work, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "w5"}\n')
    r = invoke(eval_main, "--engine_dir", work / "target", "--dataset", bad)
    assert r.exit_code == 1 and 'expected {"prompt": str, "reference": str}' in r.output
    r = invoke(eval_main, "--engine_dir", work / "target", "--dataset", bad, "--rouge_threshold", 150)
    assert r.exit_code == 1 and "--rouge_threshold=150.0 must be a fraction" in r.output


def test_eval_refuses_before_decoding_anything(work, eval_set):
    """A draft length the target cannot verify, no examples, an engine where the HF checkpoint goes: refused before the HF and
    target-only runs (they used to run the whole dataset first)."""
    base = ["--engine_dir", work / "target", "--dataset", eval_set, "--max_output_len", 4]
    for args, message in [
        (["--draft_engine_dir", work / "draft", "--draft_target_model_config", "[9,[0],[0],False]"], "draft_len=9 is larger than"),
        (["--ngram_config", "[8,2,[0]]"], "ngram max_draft_len=8 is larger than"),
        (["--num_examples", 0], "--num_examples=0 must be >= 1"),
        (["--hf_model_dir", work / "draft"], "is a specdec engine, not a Hugging Face checkpoint"),
        (["--hf_model_dir", Path(__file__).resolve().parents[2] / "examples" / "demo-pair" / "target"],
         "has a vocabulary of 4096, the engine 96: it is not the model the engine was built from"),  # agreement read 0.000, silently
    ]:
        r = invoke(eval_main, *base, *args)
        assert r.exit_code == 1 and message in r.output, (args, r.output)
        assert "decoding with" not in r.output, r.output


# --------------------------------------------------------------------------- pieces


def test_token_agreement():
    assert token_agreement([[1, 2, 3], [4, 5]], [[1, 2, 3], [4, 5]]) == {"tokens": 1.0, "sequences": 1.0}
    assert token_agreement([[1, 2, 3, 4], [4, 5]], [[1, 9, 3], [4, 5]]) == {"tokens": 4 / 6, "sequences": 0.5}


def test_peers_entry_runs_by_path_and_shim_reexports():
    """The onnxruntime-genai venv has no specdec: bench/peers.py must run as a plain file."""
    path = Path(peers.__file__)
    proc = subprocess.run([sys.executable, "-I", str(path)], input='{"fn": "nope"}', capture_output=True, text=True, cwd="/")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == 'PEERS_RESULT_JSON:{"error": "\'nope\'", "error_type": "KeyError"}'
    sys.path.insert(0, str(Path(__file__).parents[2] / "benchmarks"))
    try:
        import peers as shim
    finally:
        sys.path.pop(0)
    assert shim.hf_generate is peers.hf_generate and shim.ortgenai_generate is peers.ortgenai_generate


def test_runtime_bench_imports_no_heavy_modules():
    code = ("import sys, specdec.bench.sweep, specdec.bench.datasets, specdec.cli.bench, specdec.cli.eval, specdec.bench.peers; "
            "bad = [m for m in ('torch', 'transformers', 'matplotlib', 'specdec.builder', 'rouge_score') if m in sys.modules]; "
            "assert not bad, bad")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
