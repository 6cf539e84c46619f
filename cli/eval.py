"""specdec-eval: accuracy of an engine against references and against Hugging Face transformers.

The analogue of TensorRT-LLM's examples/summarize.py --test_hf --test_trt_llm
--check_accuracy: decode a dataset of {"prompt", "reference"} lines greedily
with HF transformers and with the engine (target-only, and with drafting if
asked), then report ROUGE-1/2/L F-measure against the references (Google's
rouge-score package) and how often the engine's tokens equal HF's.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import click

from ..bench.datasets import jsonl_values
from ..bench.sweep import generate_each, token_agreement
from ..formats.config_strings import DTM_FORM, NGRAM_FORM, parse_draft_target_config, parse_ngram_config
from ..formats.engine_format import check_decodes_alone, is_engine_config, load_engine_dir, read_config_json
from ..formats.errors import RequestError
from ..hardware.cpu import check_num_threads
from ..runtime.devices import placement
from ..runtime.engine import check_draft_len
from ..runtime.loading import load_orchestrator
from ..runtime.pairing import pair
from ..runtime.proposers.draft import DraftModelConfig
from .common import check_output_file, clean_errors, end_ids, engine_tokenizer, fmt_or_dash, option, verify_engine_option, yes_no_dash

ROUGE_KEYS = ("rouge1", "rouge2", "rougeL")


def read_eval_set(path: str | Path, limit: int | None = None) -> list[dict[str, str]]:
    path = Path(path)
    if not path.is_file():
        raise RequestError(f"--dataset {path} does not exist.")
    items = []
    for where, item in jsonl_values(path):
        if not (isinstance(item, dict) and isinstance(item.get("prompt"), str) and isinstance(item.get("reference"), str)):
            raise RequestError(f'{where}: expected {{"prompt": str, "reference": str}}.')
        items.append({"prompt": item["prompt"], "reference": item["reference"]})
        if limit is not None and len(items) >= limit:
            break
    if not items:
        raise RequestError(f"--dataset {path} has no examples.")
    return items


def rouge_scores(predictions: list[str], references: list[str]) -> dict[str, float]:
    """Mean ROUGE-1/2/L F-measure over the examples (no stemming, like `evaluate`'s rouge default)."""
    try:
        from rouge_score import rouge_scorer
    except ImportError:
        raise RequestError("specdec-eval needs the rouge-score package: pip install 'specdec[bench]' (or pip install rouge-score).") from None
    scorer = rouge_scorer.RougeScorer(list(ROUGE_KEYS), use_stemmer=False)
    totals = dict.fromkeys(ROUGE_KEYS, 0.0)
    for pred, ref in zip(predictions, references, strict=True):
        s = scorer.score(ref, pred)  # (target, prediction)
        for k in ROUGE_KEYS:
            totals[k] += s[k].fmeasure
    return {k: v / len(predictions) for k, v in totals.items()}


def _threshold(value: float) -> float:
    """A fraction; values above 1 are TensorRT-LLM style percent (14 -> 0.14)."""
    if value < 0 or value > 100:
        raise RequestError(f"--rouge_threshold={value} must be a fraction in [0, 1] or a percentage in (1, 100].")
    return value / 100 if value > 1 else value


def _vocab_size(config: object) -> int | None:
    """A Hugging Face config's vocab_size (its text_config's for a multimodal one), None where it says none."""
    size = config.get("vocab_size", (config.get("text_config") or {}).get("vocab_size")) if isinstance(config, dict) else None
    return size if isinstance(size, int) else None


@contextmanager
def _no_hf_progress_bars() -> Iterator[None]:
    """transformers' own bars ("Loading weights") off while HF decodes: our progress lines say what runs, and a tqdm bar's
    carriage returns garble a log. Put back as found after, for a caller in the same process."""
    from transformers.utils import logging as hf_logging

    was_on = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_on:
            hf_logging.enable_progress_bar()


def _hf_available() -> bool:
    import importlib.util

    return all(importlib.util.find_spec(m) is not None for m in ("torch", "transformers"))


@click.command(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@option("engine_dir", required=True, type=click.Path(), help="Target engine directory.")
@option("draft_engine_dir", type=click.Path(), help="Draft engine: also evaluate draft-target decoding.")
@option("draft_target_model_config", type=str, help=f'Draft-target settings: "{DTM_FORM}" [default: draft_len min(4, max_draft_len)].')
@option("ngram_config", "--prompt_lookup_config", type=str, help=f'Also evaluate n-gram decoding: "{NGRAM_FORM}", e.g. "[4,2,[0]]".')
@option("dataset", required=True, type=click.Path(), help='.jsonl of {"prompt": str, "reference": str} lines.')
@option("num_examples", "--max_examples", type=int, default=None, help="Use the first N examples [default: all].")
@option("hf_model_dir", type=click.Path(), help="HF checkpoint to compare with [default: the one the engine was built from].")
@click.option("--test_hf/--no_test_hf", "--test-hf/--no-test-hf", "test_hf", default=None,
              help="Also decode with HF transformers (greedy, fp32) [default: when the checkpoint and torch/transformers are there].")
@option("test_trt_llm", is_flag=True, hidden=True, help="Accepted for TensorRT-LLM's summarize.py habits: the engine is always evaluated.")
@option("tokenizer_dir", type=click.Path(), help="Tokenizer [default: the engine's]; HF decodes the same token ids.")
@option("max_input_len", "--max_input_length", type=int, default=None, help="Keep the last N prompt tokens [default: the engines' max_input_len].")
@option("max_output_len", "--output_len", type=int, default=64, show_default=True,
        help="Most new tokens per example (fewer where max_seq_len is reached).")
@option("end_id", type=int, default=None, help="Token that ends an output [default: the tokenizer's EOS]; -1: never stop early.")
@option("check_accuracy", is_flag=True, help="Exit non-zero when an engine run's ROUGE-1 is below --rouge_threshold.")
@option("rouge_threshold", "--tensorrt_llm_rouge1_threshold", type=float, default=14.0, show_default=True,
        help="ROUGE-1 F-measure threshold for --check_accuracy: a fraction, or percent like TensorRT-LLM when > 1 (14 = 0.14). "
             "The default is TensorRT-LLM summarize.py's, meant for real models summarizing CNN/DailyMail; set one your model and "
             "dataset meet (the demo pair scores about 10 on examples/eval: use 8 there).")
@option("num_threads", type=int, default=None, help="ONNX Runtime intra-op threads (and torch threads for HF) [default: all cores, up to 8].")
@option("device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True,
        help="Where the engines run (as specdec-run): auto = the backend's own (a GPU for torch engines).")
@option("output_json", type=click.Path(), help="Write scores, agreement and every example's outputs.")
@verify_engine_option
@clean_errors
def main(engine_dir, draft_engine_dir, draft_target_model_config, ngram_config, dataset, num_examples, hf_model_dir, test_hf, test_trt_llm,
         tokenizer_dir, max_input_len, max_output_len, end_id, check_accuracy, rouge_threshold, num_threads, device, output_json,
         verify_engine) -> None:
    """Score an engine's greedy outputs with ROUGE and against HF transformers.

    \b
      specdec-eval --engine_dir engines/target --dataset examples/eval/heldout_functions.jsonl \\
          --draft_engine_dir engines/draft --draft_target_model_config "[4,[0],[0],False]" \\
          --check_accuracy --rouge_threshold 8 --output_json eval.json
    """
    del test_trt_llm
    threshold = _threshold(rouge_threshold)
    check_output_file(output_json, "--output_json")  # before decoding, not after
    if max_output_len < 1:
        raise RequestError(f"--max_output_len={max_output_len} must be >= 1.")
    if num_examples is not None and num_examples < 1:
        raise RequestError(f"--num_examples={num_examples} must be >= 1 (leave it out for every example).")
    check_num_threads(num_threads)
    dtm = parse_draft_target_config(draft_target_model_config) if draft_target_model_config else None
    ngram = parse_ngram_config(ngram_config) if ngram_config else None
    if dtm and not draft_engine_dir:
        raise RequestError("--draft_target_model_config needs a draft engine: pass --draft_engine_dir.")
    examples = read_eval_set(dataset, num_examples)
    rouge_scores([""], [""])  # fail on a missing rouge-score before decoding anything

    target = load_engine_dir(engine_dir, verify=verify_engine)
    draft = load_engine_dir(draft_engine_dir, verify=verify_engine) if draft_engine_dir else None
    engines = [target] + ([draft] if draft else [])
    tok = engine_tokenizer(target, tokenizer_dir)
    if tok is None:
        raise RequestError("the engine has no tokenizer.json: pass --tokenizer_dir.")
    ends = end_ids(end_id, tok, target)

    in_cap = min(e.config.build.max_input_len for e in engines)
    if max_input_len is not None:
        if max_input_len < 1:
            raise RequestError(f"--max_input_len={max_input_len} must be >= 1.")
        in_cap = min(in_cap, max_input_len)
    seq_cap = min(e.config.build.max_seq_len for e in engines)
    prompts, truncated = [], 0
    for ex in examples:
        ids = tok.encode(ex["prompt"])
        if not ids:
            raise RequestError(f"a prompt encodes to no tokens: {ex['prompt'][:40]!r}.")
        truncated += len(ids) > in_cap
        prompts.append(ids[-in_cap:])  # keep the end: the text next to what is to be generated
    n_new = [min(max_output_len, seq_cap - len(p)) for p in prompts]
    if truncated:
        click.echo(f"note: {truncated} prompt(s) longer than {in_cap} tokens keep their last {in_cap} tokens.", err=True)

    hf_dir = hf_model_dir or target.config.extra.get("checkpoint")
    if not hf_model_dir and target.config.extra.get("lora"):  # the recorded checkpoint is the base of a merged LoRA fine-tune
        if test_hf:
            raise RequestError("--test_hf compares with transformers on the engine's checkpoint, and the engine merged LoRA adapters into it "
                               "at build (extra.lora): save the merged model (peft's merge_and_unload().save_pretrained(DIR)) and pass it "
                               "as --hf_model_dir.")
        if test_hf is None:
            click.echo("note: skipping HF transformers: the engine merged LoRA adapters into its checkpoint (extra.lora); pass the merged "
                       "model as --hf_model_dir to compare with it.", err=True)
        hf_dir, test_hf = None, False
    hf_config = read_config_json(Path(hf_dir)) if hf_dir else None
    if is_engine_config(hf_config):
        raise RequestError(f"{hf_dir} is a specdec engine, not a Hugging Face checkpoint: pass the checkpoint it was built from as "
                           "--hf_model_dir (its config.json's extra.checkpoint), or --no_test_hf.")
    hf_vocab = _vocab_size(hf_config) if test_hf is not False else None
    if hf_vocab is not None and hf_vocab != target.config.model.vocab_size:  # another model: its agreement would read 0, not a fault
        raise RequestError(f"--hf_model_dir {hf_dir} has a vocabulary of {hf_vocab}, the engine {target.config.model.vocab_size}: it is not "
                           "the model the engine was built from; pass that checkpoint, or --no_test_hf.")
    if test_hf is None:
        test_hf = bool(hf_dir and Path(hf_dir).is_dir() and _hf_available())
        if not test_hf:
            click.echo("note: skipping HF transformers (no checkpoint or no torch/transformers here; --test_hf to insist).", err=True)
    elif test_hf:
        if not hf_dir or not Path(hf_dir).is_dir():
            raise RequestError(f"--test_hf needs the HF checkpoint: {hf_dir or 'the engine records none'} is not a directory; pass --hf_model_dir.")
        if not _hf_available():
            raise RequestError("--test_hf needs torch and transformers: pip install 'specdec[hf]' (CPU torch: torch==2.13.0).")

    configs: list[tuple[str, dict[str, Any]]] = [("target-only", {})]
    if draft_engine_dir:
        configs.append(("draft-target", {"draft_dir": draft, "draft_target": dtm}))
    if ngram:
        configs.append((f"ngram k={ngram.max_draft_len} n={ngram.max_matching_ngram_size}", {"ngram": ngram}))
    # what the engines will refuse, checked before anything decodes (a refusal costs no run) without opening them: opened
    # one at a time below, after Hugging Face's float32 copy is gone
    placement([0], target, "target", device, num_threads)  # (the target's check_decodes_alone ran in engine_tokenizer)
    if draft is not None:
        check_decodes_alone(draft, "draft")
        pair(target, draft)
        check_draft_len(target, DraftModelConfig(draft_engine_dir, dtm).resolved(target.config.build.max_draft_len).draft_len)
    if ngram is not None:
        check_draft_len(target, ngram.max_draft_len, "ngram max_draft_len")

    runs: list[tuple[str, dict[str, Any]]] = []
    click.echo(f"{len(examples)} example{'s' if len(examples) != 1 else ''}, up to {max_output_len} new tokens each, greedy", err=True)
    if test_hf:
        from ..bench import peers

        click.echo("  decoding with HF transformers", err=True)
        with _no_hf_progress_bars():
            r = peers.hf_generate(str(hf_dir), prompts, n_new, num_threads=num_threads, stop_ids=list(ends))
        runs.append(("hf", {"output_ids": r["output_ids"], "output_tokens_per_s": r["tokens_per_s"], "acceptance_rate": None}))
    target_ex = None
    for name, kw in configs:  # engines loaded (and hashed) once; one target session serves every configuration
        orch = load_orchestrator(target, num_threads=num_threads, target_executor=target_ex, device=device, **kw)
        target_ex = orch.target
        if name == "draft-target":
            name = f"draft-target k={orch.draft_len}"
        click.echo(f"  decoding with the engine: {name}", err=True)
        runs.append((name, generate_each(orch, prompts, n_new, ends, warmup=1)))  # first calls pay one-time costs: not timed

    references = [ex["reference"] for ex in examples]
    hf_ids = runs[0][1]["output_ids"] if test_hf else None
    base_ids = next(r["output_ids"] for name, r in runs if name == "target-only")
    rows, texts = [], {}
    for name, r in runs:
        texts[name] = [tok.decode(ids) for ids in r["output_ids"]]
        row: dict[str, Any] = {"name": name, **rouge_scores(texts[name], references),
                               "output_tokens_per_s": r["output_tokens_per_s"], "acceptance_rate": r["acceptance_rate"]}
        if name != "hf":
            row["agreement_with_hf"] = token_agreement(r["output_ids"], hf_ids) if hf_ids is not None else None
            row["identical_to_target_only"] = r["output_ids"] == base_ids if name != "target-only" else None
        rows.append(row)
    click.echo(eval_table(rows))

    failed = [r for r in rows if r["name"] != "hf" and r["rouge1"] < threshold]
    report = {
        "settings": {
            "engine_dir": str(engine_dir), "draft_engine_dir": str(draft_engine_dir) if draft_engine_dir else None,
            "ngram_config": ngram_config, "hf_model_dir": str(hf_dir) if test_hf else None, "dataset": str(dataset),
            "examples": len(examples), "max_output_len": max_output_len, "max_input_len": in_cap, "end_ids": list(ends),
            "rouge": "rouge-score, F-measure, no stemmer, mean over examples", "rouge1_threshold": threshold,
        },
        "rows": rows,
        "accuracy_check": None if not check_accuracy else {"threshold": threshold, "passed": not failed, "failed": [r["name"] for r in failed]},
        "examples": [{**ex, "outputs": {name: texts[name][i] for name in texts}} for i, ex in enumerate(examples)],
    }
    if output_json:
        Path(output_json).write_text(json.dumps(report, indent=2) + "\n")
        click.echo(f"wrote {output_json}", err=True)
    if check_accuracy:
        for r in rows:
            if r["name"] == "hf":
                continue
            verdict = "passed" if r["rouge1"] >= threshold else "FAILED"
            click.echo(f"accuracy check {verdict}: {r['name']} ROUGE-1 {r['rouge1'] * 100:.2f} {'>=' if r['rouge1'] >= threshold else '<'} threshold "
                       f"{threshold * 100:.2f}")
        if failed:
            sys.exit(1)


def eval_table(rows: list[dict[str, Any]]) -> str:
    """ROUGE in percent, as TensorRT-LLM's summarize.py prints it."""
    lines = [f"{'run':<22}{'ROUGE-1':>9}{'ROUGE-2':>9}{'ROUGE-L':>9}{'tokens = HF':>13}{'seqs = HF':>11}{'same as TO':>12}{'acceptance':>12}"]
    for r in rows:
        agree = r.get("agreement_with_hf")
        same = r.get("identical_to_target_only")
        tokens = fmt_or_dash(agree and agree["tokens"], ".3f")
        seqs = fmt_or_dash(agree and agree["sequences"], ".3f")
        lines.append(
            f"{r['name']:<22}{r['rouge1'] * 100:>9.2f}{r['rouge2'] * 100:>9.2f}{r['rougeL'] * 100:>9.2f}"
            f"{tokens:>13}{seqs:>11}{yes_no_dash(same):>12}{fmt_or_dash(r['acceptance_rate'], '.3f'):>12}"
        )
    lines.append("ROUGE: F-measure x100 against the references; tokens = HF: position-wise token agreement with HF greedy; seqs = HF: identical "
                 "outputs")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
