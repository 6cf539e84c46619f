"""specdec-bench: prepare a dataset, then sweep target-only / draft-target / n-gram over draft lengths.

The analogue of TensorRT-LLM's prepare_dataset.py + trtllm-bench. The logic
lives in specdec.bench (datasets.py, sweep.py); this is the command-line face (plus the plot
and the peer comparison, which need matplotlib and torch/transformers).
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import click

from ..bench.datasets import dumps_dataset, prepare_from_jsonl, prepare_synthetic, special_token_ids
from ..bench.sweep import parse_draft_lens, parse_methods, run_sweep, token_agreement
from ..formats.engine_format import TREE_MODES, load_engine_dir
from ..formats.errors import RequestError
from ..formats.sampling_params import SamplingConfig
from ..formats.tokenizer import Tokenizer
from ..runtime.proposers.peagle import MAX_REFINE, refine_value
from .common import check_output_file, clean_errors, engine_tokenizer, fmt_or_dash, option, verify_engine_option, yes_no_dash

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}
DEFAULT_DRAFT_LENS = "1,2,4,8"


class RefineCalls(click.ParamType):
    """--peagle_refine: a number of refining calls, or auto."""

    name = f"[0-{MAX_REFINE}|auto]"

    def get_metavar(self, param, ctx=None) -> str:  # (click would print the name in capitals)
        return self.name

    def convert(self, value, param, ctx):
        try:
            return refine_value(value)
        except RequestError as e:
            self.fail(str(e), param, ctx)


@click.group(context_settings=CONTEXT)
def main() -> None:
    """Benchmark speculative decoding on your engines.

    \b
    specdec-bench prepare-dataset --tokenizer_dir engines/target --num_requests 32 \\
        --input_mean 128 --input_stdev 16 --output_mean 128 --output_stdev 0 --output data.jsonl
    specdec-bench run --engine_dir engines/target --draft_engine_dir engines/draft \\
        --dataset data.jsonl --draft_lens 1,2,4,8 --output_json bench.json --plot bench.png
    """


# --------------------------------------------------------------------------- prepare-dataset


@main.command("prepare-dataset", context_settings=CONTEXT)
@option("num_requests", type=int, help="How many requests to generate (synthetic).")
@option("input_mean", type=float, help="Mean prompt length in tokens (normal distribution, rounded up, >= 1).")
@option("input_stdev", type=float, default=0.0, show_default=True, help="Standard deviation of the prompt length.")
@option("output_mean", type=float, help="Mean output length in tokens; with --jsonl, the length of lines that have none.")
@option("output_stdev", type=float, default=0.0, show_default=True, help="Standard deviation of the output length.")
@option("random_seed", type=int, default=0, show_default=True, help="Same seed, same file.")
@option("tokenizer_dir", "--tokenizer", type=click.Path(),
        help="Tokenizer (a directory with tokenizer.json, e.g. an engine dir): vocabulary and special ids to avoid; needed for --jsonl prompts.")
@option("vocab_size", type=int, help="Draw token ids from [0, vocab_size) instead of a tokenizer's vocabulary.")
@option("jsonl", type=click.Path(),
        help='Instead of random tokens: a .jsonl of {"prompt": str} or {"input_ids": [...]} lines, optional "output_len".')
@option("output", "-o", type=click.Path(), default="-", show_default=True, help="Dataset file to write (.jsonl); '-' for stdout.")
@clean_errors
def prepare_dataset(num_requests, input_mean, input_stdev, output_mean, output_stdev, random_seed, tokenizer_dir, vocab_size, jsonl, output) -> None:
    """Write a benchmark dataset: one {"task_id", "input_ids", "output_len"} line per request.

    \b
    Synthetic, TensorRT-LLM's token-norm-dist (lengths ~ normal, rounded up, >= 1; token ids
    uniform over the vocabulary minus special ids):
      specdec-bench prepare-dataset --tokenizer_dir engines/target --num_requests 64 \\
          --input_mean 128 --input_stdev 0 --output_mean 128 --output_stdev 0 -o data.jsonl
    From your own prompts:
      specdec-bench prepare-dataset --jsonl prompts.jsonl --tokenizer_dir engines/target \\
          --output_mean 128 -o data.jsonl
    """
    tok = Tokenizer(tokenizer_dir) if tokenizer_dir else None
    if jsonl:
        if num_requests is not None or input_mean is not None:
            raise RequestError("--jsonl takes its prompts from the file: drop --num_requests / --input_mean.")
        records = prepare_from_jsonl(jsonl, tok, output_mean, output_stdev, random_seed)
    else:
        missing = [f"--{n}" for n, v in (("num_requests", num_requests), ("input_mean", input_mean), ("output_mean", output_mean)) if v is None]
        if missing:
            raise RequestError(f"a synthetic dataset needs {', '.join(missing)} (or give --jsonl with your prompts).")
        if (tok is None) == (vocab_size is None):
            raise RequestError("give exactly one of --tokenizer_dir (ids from its vocabulary, special ids avoided) or --vocab_size.")
        if tok is not None:
            vocab_size = max(tok.vocab().values()) + 1
            special = special_token_ids(tok)
        else:
            special = []
        records = prepare_synthetic(num_requests, input_mean, input_stdev, output_mean, output_stdev, vocab_size, random_seed, special)
    text = dumps_dataset(records)
    if output == "-":
        sys.stdout.write(text)
        return
    Path(output).write_text(text, encoding="utf-8")
    ins = [len(r["input_ids"]) for r in records]
    outs = [r["output_len"] for r in records]
    click.echo(
        f"wrote {len(records)} requests to {output}: input tokens {min(ins)}..{max(ins)} (mean {sum(ins) / len(ins):.1f}), "
        f"output tokens {min(outs)}..{max(outs)} (mean {sum(outs) / len(outs):.1f})",
        err=True,
    )


# --------------------------------------------------------------------------- run


@main.command("run", context_settings=CONTEXT)
@option("engine_dir", required=True, type=click.Path(), help="Target engine directory.")
@option("draft_engine_dir", type=click.Path(), help="Draft engine directory (for --method draft).")
@option("method", multiple=True,
        help="none | draft | ngram | medusa | eagle | peagle | suffix; repeatable or a comma list [default: none, plus draft with a draft "
        "engine, plus ngram when the target verifies drafts, plus medusa / eagle / peagle when such a target is given].")
@option("medusa_engine_dir", type=click.Path(),
        help="The same model built with --speculative_decoding_mode medusa (for --method medusa) [default: --engine_dir if it is one].")
@option("eagle_engine_dir", type=click.Path(),
        help="The same model built with --speculative_decoding_mode eagle (for --method eagle) [default: --engine_dir if it is one].")
@option("peagle_engine_dir", type=click.Path(),
        help="The same model built with --speculative_decoding_mode peagle (for --method peagle) [default: --engine_dir if it is one].")
@option("medusa_choices", type=str, default=None,
        help='Also measure this Medusa tree (TensorRT-LLM\'s format), e.g. "[[0],[1],[0,0],[0,1],[0,0,0]]".')
@option("eagle_choices", type=str, default=None, help='Also measure this EAGLE tree (TensorRT-LLM\'s format), e.g. "[[0],[1],[0,0],[0,1],[0,0,0]]".')
@option("peagle_choices", type=str, default=None,
        help='Also measure this P-EAGLE tree (TensorRT-LLM\'s format), e.g. "[[0],[1],[0,0],[0,1],[0,0,0]]".')
@option("peagle_refine", type=RefineCalls(), default="0", show_default=True,
        help=f"P-EAGLE: module calls after the first each round, each reading the previous call's drafts (a module trained with "
             f"specdec-train --peagle_refine), 0 to {MAX_REFINE}, or auto: chosen per request and round (chains only).")
@option("draft_lens", type=str, default=None,
        help=f"Draft lengths to sweep, e.g. \"1,2,4,8\" [default: {DEFAULT_DRAFT_LENS}, up to the target's max_draft_len].")
@option("ngram_size", "--max_matching_ngram_size", type=int, default=2, show_default=True,
        help="N-gram: tokens matched against the prompt and output so far.")
@option("dataset", required=True, type=click.Path(), help="Dataset .jsonl from prepare-dataset (or {\"prompt\"} / {\"input_ids\"} lines).")
@option("max_output_len", type=int, default=None, help="Output length of dataset lines that have no output_len.")
@option("tokenizer_dir", type=click.Path(), help="Tokenizer for text prompts in the dataset [default: the engine's].")
@option("batch_size", type=int, default=1, show_default=True,
        help="Requests per generate call (static batching; a batch runs to its longest output_len).")
@option("warmup", type=int, default=1, show_default=True, help="Batches decoded before measuring, per configuration.")
@option("temperature", type=float, default=0.0, show_default=True,
        help="Sample every request at this temperature (0 = greedy): acceptance under sampling is what sampled traffic gets.")
@option("top_k", type=int, default=0, show_default=True, help="With --temperature: 0 = off.")
@option("top_p", type=float, default=1.0, show_default=True, help="With --temperature: 1.0 = off.")
@option("random_seed", type=int, default=0, show_default=True,
        help="With --temperature: the batch starting at request i is seeded random_seed + i, the same for every configuration.")
@option("num_threads", type=int, default=None, help="ONNX Runtime intra-op threads (and torch threads for --compare) [default: all cores, up to 8].")
@option("step_cost_reps", type=int, default=100, show_default=True, help="One-token steps timed per engine to measure c = draft/target step cost.")
@option("output_json", type=click.Path(), help="Write settings, step costs and every row (and peer results).")
@option("plot", type=click.Path(), help="Draw speedup and acceptance rate vs draft length, with the analytic bound, to this .png (needs matplotlib).")
@option("compare", is_flag=True,
        help="Also run the peers (HF transformers generate, onnxruntime-genai) on the same checkpoints and inputs, and print ratios.")
@option("target_checkpoint", type=click.Path(), help="HF checkpoint of the target for --compare [default: the one the engine was built from].")
@option("draft_checkpoint", type=click.Path(), help="HF checkpoint of the draft for --compare [default: the one the draft engine was built from].")
@option("compare_peers", type=str, default="hf,ortgenai", show_default=True, help="Which peers --compare runs (comma list of hf, ortgenai).")
@option("peers_work_dir", type=click.Path(), help="Where --compare writes the onnxruntime-genai exports [default: a temporary directory].")
@verify_engine_option
@clean_errors
def run(engine_dir, draft_engine_dir, method, medusa_engine_dir, eagle_engine_dir, peagle_engine_dir, medusa_choices, eagle_choices, peagle_choices,
        peagle_refine, draft_lens, ngram_size, dataset, max_output_len, tokenizer_dir, batch_size, warmup, temperature, top_k, top_p, random_seed,
        num_threads, step_cost_reps, output_json, plot, compare, target_checkpoint, draft_checkpoint, compare_peers, peers_work_dir,
        verify_engine) -> None:
    """Measure target-only, draft-target, n-gram, Medusa and EAGLE decoding on a dataset, sweeping draft lengths.

    Every request generates exactly its output_len tokens (no EOS stop), greedy (or sampled: --temperature),
    one request per call (--batch_size 1). tokens/s = generated tokens / summed request latency, time to first
    token included; speedups are against target-only measured in the same run.

    \b
      specdec-bench run --engine_dir engines/target --draft_engine_dir engines/draft \\
          --dataset data.jsonl --method none,draft,ngram --draft_lens 1,2,4,8 \\
          --output_json bench.json --plot bench.png
      specdec-bench run --engine_dir engines/target --medusa_engine_dir engines/medusa --eagle_engine_dir engines/eagle \\
          --dataset data.jsonl --method none,medusa,eagle --draft_lens 1,2,3 --eagle_choices "[[0],[1],[0,0],[0,1],[0,0,0]]"
    """
    target = load_engine_dir(engine_dir, verify=verify_engine)
    max_draft = target.config.build.max_draft_len
    given = (("medusa", medusa_engine_dir), ("eagle", eagle_engine_dir), ("peagle", peagle_engine_dir))
    heads_dirs = {m: load_engine_dir(d, verify=verify_engine) for m, d in given if d}
    if target.config.build.speculative_decoding_mode in TREE_MODES:
        heads_dirs.setdefault(target.config.build.speculative_decoding_mode, target)
    methods = parse_methods(method) if method else (["none"] + (["draft"] if draft_engine_dir else []) + (["ngram"] if max_draft else [])
                                                    + list(heads_dirs))
    if draft_lens is None:
        # a target that cannot verify drafts keeps [1]: loading it for drafting then says how to rebuild it
        lens = [k for k in parse_draft_lens(DEFAULT_DRAFT_LENS) if k <= max_draft] or [max(max_draft, 1)]
    else:
        lens = parse_draft_lens(draft_lens)
    if draft_engine_dir and "draft" not in methods:
        click.echo("note: --draft_engine_dir given but --method has no 'draft': the draft engine is not used.", err=True)
    if plot:
        _import_matplotlib()  # fail before the measurements, not after
    if compare and batch_size != 1:
        raise RequestError("--compare runs the peers one request at a time: use --batch_size 1.")
    sampling = SamplingConfig(temperature=temperature, top_k=top_k, top_p=top_p, random_seed=random_seed)
    if compare and not sampling.greedy:
        raise RequestError(f"--compare runs the peers greedy, token for token against ours: leave --temperature {temperature:g} out "
                           "(or measure the sampled sweep without --compare).")
    if sampling.greedy and (top_k, top_p, random_seed) != (0, 1.0, 0) and top_k != 1:
        click.echo("note: --top_k, --top_p and --random_seed apply to sampled runs: without --temperature the run is greedy.", err=True)
    draft = load_engine_dir(draft_engine_dir, verify=verify_engine) if draft_engine_dir and "draft" in methods else None
    peer_setup = _check_compare(compare_peers, target, draft, target_checkpoint, draft_checkpoint) if compare else None  # before measuring
    check_output_file(output_json, "--output_json")  # before measuring: results must not be lost to an unwritable path
    check_output_file(plot, "--plot")
    tok = engine_tokenizer(target, tokenizer_dir)
    records = prepare_from_jsonl(dataset, tok, max_output_len)

    drafting = [m for m in methods if m != "none"]
    click.echo(f"{len(records)} requests, batch {batch_size}, methods {', '.join(methods)}, draft lengths "
               f"{','.join(map(str, lens)) if drafting and lens else '-'}", err=True)
    result = run_sweep(target, methods, draft, lens, ngram_size, records, num_threads, warmup, batch_size,
                       step_cost_reps, say=lambda what: click.echo(f"  measuring {what}", err=True), heads_dirs=heads_dirs,
                       choices={"medusa": medusa_choices, "eagle": eagle_choices, "peagle": peagle_choices}, cut_lens=draft_lens is None,
                       sampling=sampling, peagle_refine=peagle_refine)
    base_ids = result.pop("target_only_output_ids")
    click.echo(sweep_table(result))
    # our measurements are written before the peers run: a failing peer never costs them
    if output_json:
        Path(output_json).write_text(json.dumps(result, indent=2) + "\n")
    if plot:
        plot_sweep(result, plot)
        click.echo(f"wrote {plot}", err=True)
    if compare:
        result["compare"] = _compare(result, records, base_ids, *peer_setup, peers_work_dir, num_threads, ngram_size, lens, methods)
        click.echo(compare_table(result["compare"]))
        if output_json:
            Path(output_json).write_text(json.dumps(result, indent=2) + "\n")
    if output_json:
        click.echo(f"wrote {output_json}", err=True)


def sweep_table(result: dict[str, Any]) -> str:
    head = (f"{'method':<20}{'tokens/s':>10}{'speedup':>9}{'acceptance':>12}{'mean acc.len':>13}{'bound':>7}"
            f"{'p50 ms':>9}{'p90 ms':>9}{'p99 ms':>9}{'same as TO':>11}")
    lines = [head]
    for r in result["rows"]:
        lines.append(
            f"{r['label']:<20}{r['output_tokens_per_s']:>10.1f}{r['speedup']:>8.2f}x{fmt_or_dash(r['acceptance_rate'], '.3f'):>12}"
            f"{fmt_or_dash(r['mean_acceptance_length'], '.2f'):>13}{fmt_or_dash(r.get('analytic_bound'), '.2f'):>7}"
            f"{r['latency_p50_s'] * 1e3:>9.1f}{r['latency_p90_s'] * 1e3:>9.1f}{r['latency_p99_s'] * 1e3:>9.1f}"
            f"{yes_no_dash(None if r['method'] == 'none' or not r['identical_expected'] else r['identical_to_target_only']):>11}"
        )
    cost = result.get("step_cost")
    if cost:
        lines.append(
            f"c = draft/target one-token step cost = {cost['draft_step_s'] * 1e3:.3f} ms / {cost['target_step_s'] * 1e3:.3f} ms = {cost['c']:.3f}; "
            "bound = (1 - a^(k+1)) / ((1 - a)(k c + 1)), a = measured acceptance"
        )
    s = result["settings"]
    lines.append(f"{s['requests']} requests, {s['input_tokens']} input tokens, batch {s['batch_size']}; tokens/s include time to first token")
    if s.get("sampling"):
        sp = s["sampling"]
        lines.append(f"sampled: temperature {sp['temperature']:g}, top_k {sp['top_k']}, top_p {sp['top_p']:g}, seeds from {sp['random_seed']}; "
                     "same as TO '-': rejection sampling follows its drafts (the target's distribution, not its tokens)")
    return "\n".join(lines)


# --------------------------------------------------------------------------- plot


def _import_matplotlib():
    try:
        import matplotlib  # noqa: F401
        from matplotlib.figure import Figure
    except ImportError:
        raise RequestError("--plot needs matplotlib: pip install 'specdec[bench]' (or pip install matplotlib).") from None
    return Figure


def plot_sweep(result: dict[str, Any], path: str | Path) -> None:
    """Speedup and acceptance rate vs draft length; the analytic bound of draft-target dashed."""
    Figure = _import_matplotlib()
    rows = result["rows"]
    fig = Figure(figsize=(10, 4), layout="constrained")
    ax_s, ax_a = fig.subplots(1, 2)
    styles = {"draft": ("tab:blue", "o", "draft-target"), "ngram": ("tab:orange", "s", "n-gram"), "medusa": ("tab:green", "^", "Medusa chain"),
              "eagle": ("tab:red", "D", "EAGLE chain"), "peagle": ("tab:purple", "v",
                                                                   "P-EAGLE chain")}  # trees are one row each: in the table, not on these lines
    for kind, (color, marker, name) in styles.items():
        rs = sorted((r for r in rows if r["method"] == kind and not r.get("tree")), key=lambda r: r["draft_len"])
        if not rs:
            continue
        ks = [r["draft_len"] for r in rs]
        ax_s.plot(ks, [r["speedup"] for r in rs], color=color, marker=marker, label=f"{name} (measured)")
        if kind == "draft":
            ax_s.plot(ks, [r["analytic_bound"] for r in rs], color=color, linestyle="--",
                      label=f"{name} analytic bound (c={result['step_cost']['c']:.2f})")
        ax_a.plot(ks, [r["acceptance_rate"] or 0.0 for r in rs], color=color, marker=marker, label=name)
    ax_s.axhline(1.0, color="gray", linestyle=":", label="target-only")
    ax_s.set(xlabel="draft length", ylabel="speedup over target-only", title="Speedup (output tokens/s, TTFT included)")
    ax_a.set(xlabel="draft length", ylabel="acceptance rate", title="Acceptance rate (accepted / drafted)", ylim=(0, 1.05))
    all_ks = sorted({r["draft_len"] for r in rows if r["method"] != "none"})
    for ax in (ax_s, ax_a):
        if all_ks:
            ax.set_xticks(all_ks)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    s = result["settings"]
    fig.suptitle(f"{Path(s['engine_dir']).name}: {s['requests']} requests, batch {s['batch_size']}")
    fig.savefig(path, dpi=100, format="png")


# --------------------------------------------------------------------------- peers


def _checkpoint(given: str | None, engine: Any, what: str, flag: str) -> str:
    path = given or engine.config.extra.get("checkpoint")
    if not given and engine.config.extra.get("lora"):  # the recorded checkpoint is the base, not the model the engine decodes
        raise RequestError(f"--compare runs the peers on the HF checkpoint, and the {what} engine merged LoRA adapters into {path} at build "
                           f"(its config.json's extra.lora): the peers would run the base model. Save the merged model (peft's "
                           f"merge_and_unload().save_pretrained(DIR)) and pass it as {flag}.")
    if not path or not Path(path).is_dir():
        where = f"the {what} engine was built from {path}, which is not here" if path else f"the {what} engine does not record its checkpoint"
        raise RequestError(f"--compare runs the peers on the HF checkpoint: {where}; pass {flag}.")
    return str(path)


def _check_compare(which: str, target: Any, draft: Any, target_ckpt: str | None, draft_ckpt: str | None) -> tuple[list[str], str, str | None]:
    """(peers wanted, target checkpoint, draft checkpoint): every --compare input checked before the sweep runs."""
    wanted = [p.strip() for p in which.split(",") if p.strip()]
    unknown = set(wanted) - {"hf", "ortgenai"}
    if unknown:
        raise RequestError(f"--compare_peers {which!r}: unknown peer(s) {', '.join(sorted(unknown))}; choose from hf, ortgenai.")
    t_ckpt = _checkpoint(target_ckpt, target, "target", "--target_checkpoint")
    d_ckpt = _checkpoint(draft_ckpt, draft, "draft", "--draft_checkpoint") if draft is not None else None
    if "hf" in wanted:
        try:
            import torch  # noqa: F401
            import transformers  # noqa: F401
        except ImportError:
            raise RequestError("--compare with the hf peer needs torch and transformers: pip install 'specdec[hf]' (CPU torch: "
                               "torch==2.13.0).") from None
    if "ortgenai" in wanted:
        from ..bench import peers

        why = peers.ortgenai_unavailable()
        if why:  # a missing peer is skipped with a note, as docs/bench.md says, and recorded as skipped
            click.echo(f"note: onnxruntime-genai skipped: {why}.", err=True)
            wanted = [p for p in wanted if p != "ortgenai"] + [f"ortgenai-skipped:{why}"]
    return wanted, t_ckpt, d_ckpt


def _compare(result, records, base_ids, wanted, t_ckpt, d_ckpt, work_dir, threads, ngram_size, lens, methods) -> list[dict]:
    try:
        from ..bench import peers
    except ImportError as err:  # pragma: no cover
        raise RequestError(f"--compare: {err}") from None
    prompts = [r["input_ids"] for r in records]
    n_new = [r["output_len"] for r in records]
    ours = {r["label"]: r for r in result["rows"]}
    pairs: list[tuple[str, str, Any]] = []  # (our label, peer name, thunk)
    if "hf" in wanted:
        pairs.append(("target-only", "hf target-only", lambda: peers.hf_generate(t_ckpt, prompts, n_new, num_threads=threads)))
        if d_ckpt:
            for k in lens:
                pairs.append((f"draft-target k={k}", f"hf assisted k={k}",
                              lambda k=k: peers.hf_generate(t_ckpt, prompts, n_new, assistant_dir=d_ckpt, num_assistant_tokens=k,
                                                            num_threads=threads)))
        if "ngram" in methods:
            for k in lens:
                pairs.append((f"ngram k={k} n={ngram_size}", f"hf prompt-lookup k={k} n={ngram_size}",
                              lambda k=k: peers.hf_generate(t_ckpt, prompts, n_new, prompt_lookup_num_tokens=k, max_matching_ngram_size=ngram_size,
                                                            num_threads=threads)))
    og_skip: str | None = None
    out: list[dict] = []
    for w in wanted:
        if w.startswith("ortgenai-skipped:"):
            out.append({"ours": "-", "peer": "onnxruntime-genai", "skipped": w.split(":", 1)[1]})
    if "ortgenai" in wanted:
        work = Path(work_dir or tempfile.mkdtemp(prefix="specdec-bench-peers-"))
        og: dict[str, str] = {}

        def og_dir(name: str, ckpt: str) -> str:
            if name not in og:
                og[name] = peers.ortgenai_build(ckpt, str(work / f"ortgenai-{name}"))
            return og[name]

        pairs.append(("target-only", "ortgenai target-only",
                      lambda: peers.ortgenai_generate(og_dir("target", t_ckpt), prompts, n_new, num_threads=threads)))
        if d_ckpt:
            for k in lens:
                pairs.append((f"draft-target k={k}", f"ortgenai draft k={k}",
                              lambda k=k: peers.ortgenai_generate(og_dir("target", t_ckpt), prompts, n_new, draft_dir=og_dir("draft", d_ckpt),
                                                                  num_draft_tokens=k, num_threads=threads)))
        if "ngram" in methods:
            # onnxruntime-genai's ngram_size counts the drafted-from token too: our n matched tokens = its n + 1
            for k in lens:
                pairs.append((f"ngram k={k} n={ngram_size}", f"ortgenai ngram k={k} n={ngram_size}",
                              lambda k=k: peers.ortgenai_generate(og_dir("target", t_ckpt), prompts, n_new, ngram=ngram_size + 1, num_draft_tokens=k,
                                                                  num_threads=threads)))
    for label, peer, thunk in pairs:
        if peer.startswith("ortgenai") and og_skip:
            continue
        click.echo(f"  peer {peer}", err=True)
        try:
            r = thunk()
        except Exception as err:  # a peer that fails is recorded as skipped; what was measured stays
            why = str(err).strip().splitlines()[-1][:300] if str(err).strip() else type(err).__name__
            out.append({"ours": label, "peer": peer, "skipped": why})
            click.echo(f"  {peer} skipped: {why}", err=True)
            if peer.startswith("ortgenai"):
                og_skip = why
            continue
        agree = token_agreement(r["output_ids"], base_ids)
        mine = ours[label]["output_tokens_per_s"]
        out.append({
            "ours": label,
            "peer": peer,
            "ours_tokens_per_s": mine,
            "peer_tokens_per_s": r["tokens_per_s"],
            "ratio": mine / r["tokens_per_s"] if r["tokens_per_s"] else None,
            "peer_acceptance_rate": r.get("acceptance_rate"),
            "peer_seconds": r["seconds"],
            "peer_new_tokens": r["new_tokens"],
            "agreement_with_our_target_only": agree,
            **{k: v for k, v in r.items() if k.endswith("_version")},
        })
    return out


def compare_table(rows: list[dict]) -> str:
    lines = [f"{'ours':<20}{'peer':<32}{'ours tok/s':>11}{'peer tok/s':>11}{'ours/peer':>10}{'peer acc.':>10}{'same seqs':>10}"]
    for r in rows:
        if "skipped" in r:
            lines.append(f"{r['ours']:<20}{r['peer']:<32}  skipped: {r['skipped'][:120]}")
            continue
        lines.append(
            f"{r['ours']:<20}{r['peer']:<32}{r['ours_tokens_per_s']:>11.1f}{r['peer_tokens_per_s']:>11.1f}{fmt_or_dash(r['ratio'], '.2f'):>9}x"
            f"{fmt_or_dash(r['peer_acceptance_rate'], '.3f'):>10}{r['agreement_with_our_target_only']['sequences']:>10.0%}"
        )
    lines.append("same seqs: the peer's outputs identical to our target-only outputs (greedy: should be 100%, up to float ties)")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
