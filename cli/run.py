"""specdec-run: decode with a target engine, alone or with a draft model or n-gram drafts."""

from __future__ import annotations

import csv
import json
import statistics
import sys
from pathlib import Path

import click
import numpy as np

from ..formats.engine_format import load_engine_dir
from ..formats.errors import RequestError
from ..formats.tokenizer import Tokenizer
from ..runtime.engine import Engine
from ..runtime.guards import SILENT_DRAFT_ROUNDS, silent_draft_message
from ..runtime.loading import load_orchestrator
from ..runtime.orchestrator import GenerationConfig, Orchestrator
from ..runtime.prefix_cache import PrefixCacheConfig
from ..runtime.request import AUTO
from ..runtime.sampling import SamplingConfig
from .common import (
    STEP_COSTS,
    check_output_file,
    clean_errors,
    end_ids,
    engine_tokenizer,
    measure_step_costs_option,
    method_configs,
    method_options,
    option,
    prefix_caching_options,
    verify_engine_option,
)
from .compat import RunPyCommand, check_run_py_options, run_py_options
from .stops import decode_text, generate_with_stops

MAX_REPEAT = 100  # interleaved timings: the median of 100 pairs is as steady as a busy machine allows; more only takes longer


def read_inputs(texts: tuple[str, ...], input_file: str | None, tok: Tokenizer | None, add_special: bool, pad_id: int | None) -> list[list[int]]:
    """Prompts from --input_text and/or --input_file (.txt text, .csv / .npy token ids)."""
    lines = list(texts)
    prompts: list[list[int]] = []
    if input_file:
        path = Path(input_file)
        if not path.is_file():
            raise RequestError(f"--input_file {path} does not exist.")
        if path.suffix == ".txt":
            lines += [line for line in path.read_text(errors="replace").splitlines() if line.strip()]
        elif path.suffix == ".csv":
            with open(path, newline="") as f:
                for n, row in enumerate(csv.reader(f), 1):
                    try:
                        ids = [int(x) for x in row if x.strip()]
                    except ValueError:
                        raise RequestError(f"--input_file {path} line {n}: expected comma-separated token ids, got {','.join(row)[:60]!r}.") from None
                    if ids:
                        prompts.append(ids)
        elif path.suffix == ".npy":
            try:
                arr = np.load(path, allow_pickle=False)
            except (ValueError, EOFError) as err:  # not a .npy, pickled, or cut short (np.load's EOFError: click would say "Aborted!")
                raise RequestError(f"--input_file {path} is not a plain numpy array: {str(err)[:120] or 'the file ends early'}") from None
            if arr.ndim not in (1, 2) or not np.issubdtype(arr.dtype, np.integer):
                raise RequestError(f"--input_file {path}: expected a 1-D or 2-D integer array of token ids, got {arr.ndim}-D {arr.dtype}.")
            for row in np.atleast_2d(arr).astype(np.int64).tolist():
                # rows of a 2-D array are right-padded, as TensorRT-LLM writes them: drop trailing pad ids and negatives
                while row and (row[-1] < 0 or row[-1] == pad_id):
                    row.pop()
                prompts.append(row)
        else:
            raise RequestError(f"--input_file {path}: expected .txt (one prompt per line), .csv (token ids per row) or .npy.")
    if lines:
        if tok is None:
            raise RequestError("text prompts need a tokenizer: the engine has no tokenizer.json, pass --tokenizer_dir.")
        prompts = [tok.encode(line.replace("\\n", "\n"), add_special_tokens=add_special) for line in lines] + prompts
    if not prompts:
        raise RequestError("no input: give --input_text (repeatable) or --input_file.")
    return prompts


@click.command(cls=RunPyCommand, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@option("engine_dir", required=True, type=click.Path(), help="Target engine directory (from specdec-build).")
@method_options
@option("draft_len", type=str, default=None,
        help="Drafts per round: a number (overrides the config string's), or 'auto': chosen each round from the measured "
             "acceptance and step costs, 0 when drafting does not pay (docs/speculative-decoding.md).")
@option("device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True,
        help="Where engines run; device ids in the config strings index devices of this kind. auto: cpu for onnxruntime engines, cuda for tensorrt "
             "and torch engines (a float32 torch engine runs on a CPU with --device cpu).")
@option("allow_vocab_mismatch", is_flag=True,
        help="Take a draft's token ids as the target's although their tokenizers differ, with a warning (default: such a draft drafts through text).")
@option("input_text", multiple=True,
        help="A prompt (repeatable, or several after one flag as run.py takes them; several run as one batch). '\\n' is read as a newline.")
@option("input_file", type=click.Path(), help=".txt (one prompt per line), .csv (token ids per row) or .npy (token ids).")
@option("tokenizer_dir", type=click.Path(), help="Tokenizer directory [default: the engine's own].")
@option("no_add_special_tokens", is_flag=True, help="Do not add BOS/special tokens when encoding prompts.")
@option("max_output_len", type=int, default=128, show_default=True, help="Most new tokens per request.")
@option("end_id", type=int, default=None, help="Token id that ends a request [default: the tokenizer's EOS]; -1: never stop on EOS.")
@option("stop_words", multiple=True,
        help="A string that ends a request when the output text contains it (matched on text, not tokens; kept in the output; repeatable, or "
             "several after one flag as run.py takes them).")
@option("temperature", type=float, default=0.0, show_default=True, help="0 = greedy.")
@option("top_k", type=int, default=0, show_default=True, help="0 = off.")
@option("top_p", type=float, default=1.0, show_default=True, help="1.0 = off.")
@option("random_seed", type=int, default=0, show_default=True, help="Same seed, same output.")
@option("min_p", type=float, default=0.0, show_default=True, help="Drop tokens less likely than min_p x the most likely one; 0 = off.")
@option("repetition_penalty", type=float, default=1.0, show_default=True,
        help="Tokens of the prompt or output: positive logits divided by it, negative ones multiplied; 1.0 = off.")
@option("presence_penalty", type=float, default=0.0, show_default=True, help="Subtracted once from the logit of every token in the output.")
@option("frequency_penalty", type=float, default=0.0, show_default=True, help="Subtracted from a token's logit per time it is in the output.")
@option("bad_words", multiple=True,
        help="A string never produced (repeatable, or several after one flag): tokenized as given (' London' and 'London' differ), its last "
             "token is banned where its other tokens end the prompt + output.")
@option("no_repeat_ngram_size", type=int, default=0, show_default=True, help="No n-gram of this size occurs twice in prompt + output; 0 = off.")
@option("min_output_len", type=int, default=0, show_default=True,
        help="New tokens before an end id or a stop word may end a request (vLLM's min_tokens, transformers' min_new_tokens).")
@option("streaming", is_flag=True, help="Print text as tokens are accepted (one prompt).")
@option("baseline", is_flag=True, help="Also run target-only decoding on the same inputs first, and report the speedup and whether outputs match.")
@option("repeat", type=int, default=1, show_default=True,
        help="With --baseline: time target-only and the method this many times each, interleaved (A B B A ...), and report the median "
             "tokens/s and speedup with their spread. One run is noisy on a busy machine.")
@option("output_csv", type=click.Path(), help="Write output token ids (new tokens), one request per row.")
@option("output_npy", type=click.Path(), help="Write output token ids as a [requests, max_len] array padded with -1.")
@option("output_json", type=click.Path(), help="Write every request (input_ids, output_ids, text, finish_reason) and the metrics.")
@option("num_threads", type=int, default=None, help="ONNX Runtime intra-op threads of the target engine [default: all cores, up to 8].")
@option("draft_num_threads", type=int, default=1, show_default=True,
        help="Threads of the draft engine: a small draft gains nothing from more, and two sessions spinning threads on the same cores slow each "
             "other down.")
@prefix_caching_options
@measure_step_costs_option
@verify_engine_option
@run_py_options
@click.argument("more_input_text", nargs=-1, metavar="")
@clean_errors
def main(engine_dir, input_text, input_file, tokenizer_dir, no_add_special_tokens, max_output_len, end_id, stop_words, temperature, top_k, top_p,
         random_seed, min_p, repetition_penalty, presence_penalty, frequency_penalty, bad_words, no_repeat_ngram_size, min_output_len, streaming,
         baseline, repeat, output_csv, output_npy, output_json, num_threads, draft_num_threads, draft_len, device,
         allow_vocab_mismatch, prefix_cache_slots, enable_prefix_caching, measure_step_costs, verify_engine, more_input_text, **flags) -> None:
    """Run a target engine, optionally with speculative decoding.

    \b
    Draft-target (TensorRT-LLM's Draft-Target-Model):
      specdec-run --engine_dir engines/target --draft_engine_dir engines/draft \\
          --draft_target_model_config "[4,[0],[0],False]" --input_text "def fib(n):"
    NGram / prompt lookup:
      specdec-run --engine_dir engines/target --ngram_config "[8,2,[0]]" --input_file prompts.txt
    Medusa / EAGLE / P-EAGLE (a target built with --speculative_decoding_mode medusa, eagle or peagle drafts with its own heads):
      specdec-run --engine_dir engines/eagle --eagle_choices "[[0],[1],[0,0],[0,1],[0,0,0]]" --input_text "def fib(n):"
      specdec-run --engine_dir engines/peagle --draft_len 4 --input_text "def fib(n):"
    Target only (the baseline):
      specdec-run --engine_dir engines/target --input_text "def fib(n):"
    """
    drafters = method_configs(flags)  # each drafting method's flags (runtime/methods.py) -> its config
    check_run_py_options(flags)
    if more_input_text:  # run.py's --input_text "a" "b" (and --stop_words, --bad_words) were spread over their flags: a stray value
        raise RequestError(f"unexpected argument {more_input_text[0]!r}: prompts go after --input_text, stop strings after --stop_words, "
                           "bad words after --bad_words (several may follow one flag).")
    if not 1 <= repeat <= MAX_REPEAT or (repeat > 1 and not baseline):
        raise RequestError(f"--repeat {repeat}: expected a number from 1 to {MAX_REPEAT}, used with --baseline (it repeats the timed comparison).")
    for path, flag in ((output_csv, "--output_csv"), (output_npy, "--output_npy"), (output_json, "--output_json")):
        check_output_file(path, flag)  # before decoding: an unwritable output must not cost the results
    own = [m for m, _ in drafters if m.target_mode is None]  # a target's own drafter comes with it, beside any other
    if len(own) > 1:
        raise RequestError(f"{' and '.join(m.flag for m in own)} are mutually exclusive: {own[-1].flag} is a drafting method of its own, "
                           "and specdec-run decodes with one (specdec-serve serves several).")
    carried = [m for m, _ in drafters if m.target_mode is not None]  # a target's own drafter, asked for by its flags (a tree)
    if own and carried:
        raise RequestError(f"{carried[0].flag} asks for the target's own {carried[0].name} drafter and {own[0].flag} for {own[0].name}: "
                           "specdec-run decodes with one method (specdec-serve serves several); drop one of the two.")
    target = load_engine_dir(engine_dir, verify=verify_engine)
    tok = engine_tokenizer(target, tokenizer_dir)
    prompts = read_inputs(input_text, input_file, tok, not no_add_special_tokens, target.config.model.pad_token_id)
    if (stop_words or bad_words) and tok is None:
        raise RequestError(f"{'--stop_words' if stop_words else '--bad_words'} needs a tokenizer: pass --tokenizer_dir.")
    words = [tuple(tok.encode(w.replace("\\n", "\n"), add_special_tokens=False)) for w in bad_words] if tok is not None else []
    if () in words:
        raise RequestError(f"--bad_words {bad_words[words.index(())]!r} is no token at all.")
    bans = tuple(dict.fromkeys(words))
    sampling = SamplingConfig(temperature=temperature, top_k=top_k, top_p=top_p, random_seed=random_seed, min_p=min_p,
                              repetition_penalty=repetition_penalty, presence_penalty=presence_penalty, frequency_penalty=frequency_penalty,
                              bad_words_ids=bans, no_repeat_ngram_size=no_repeat_ngram_size)
    ends = end_ids(end_id, tok, target)
    if "" in stop_words:
        raise RequestError("--stop_words '' is empty: give the text that ends a request.")
    stops = tuple(s.replace("\\n", "\n") for s in stop_words)  # matched on the output text (cli/stops.py)
    gen = GenerationConfig(max_output_len=max_output_len, sampling=sampling, end_ids=ends, min_output_len=min_output_len)
    caching = PrefixCacheConfig(enable_prefix_caching, prefix_cache_slots)
    orch = load_orchestrator(target, drafters=[config for _, config in drafters], draft_len=parse_draft_len(draft_len), num_threads=num_threads,
                             draft_num_threads=draft_num_threads, device=device, allow_vocab_mismatch=allow_vocab_mismatch, verify=verify_engine,
                             prefix_caching=caching,
                             measure_step_costs=STEP_COSTS[measure_step_costs])
    if orch.engine.prefix_caching_off:
        click.echo(f"note: {orch.engine.prefix_caching_off}", err=True)
    if orch.engine.step_costs_note:
        click.echo(f"note: {orch.engine.step_costs_note}", err=True)
    if orch.engine.pairing is not None and orch.engine.pairing.mode != "shared":  # the mode worth knowing about
        click.echo(f"pairing: {orch.engine.pairing.note}", err=True)
    if streaming and len(prompts) != 1:
        raise RequestError("--streaming prints one request as it is decoded: give exactly one prompt.")

    method = method_label(orch.engine)
    # the same target session (no second copy of the engine), with the method's prefix caching: a baseline that caches
    # where the method does not (or the other way round) would skew the speedup
    base_orch = Orchestrator.from_engine(Engine(orch.target, prefix_caching=caching)) if baseline else None
    for o in (base_orch, orch) if baseline else ():  # first calls pay one-time costs: keep them out of both timings
        o.generate([prompts[0][:8]], GenerationConfig(max_output_len=4, sampling=sampling))
    runs: list[tuple[str, object]] = []  # (method, (outputs, metrics)), in the order they ran
    for i in range(repeat if baseline else 0):
        order = [("target-only", base_orch), (method, orch)]
        for name, o in order if i % 2 == 0 else order[::-1]:  # A B B A ...: drift hits both alike
            if name == method and i == repeat - 1:
                continue  # the last run of the method is the one shown below
            runs.append((name, generate_with_stops(o, prompts, gen, tok, stops)))

    on_text = None
    if streaming:
        def on_text(_request: int, text: str) -> None:
            sys.stdout.write(text)
            sys.stdout.flush()

    outputs, metrics = generate_with_stops(orch, prompts, gen, tok, stops, on_text)
    runs.append((method, (outputs, metrics)))
    if streaming:
        click.echo()
    for i, out in enumerate(outputs):
        out.text = decode_text(tok, out, stops, min_output_len) if tok else None
        if not streaming:
            shown = repr(tok.decode(out.input_ids)) if tok else str(out.input_ids)
            click.echo(f"[{i}] input: {shown}")
            click.echo(f"[{i}] output ({len(out.output_ids)} tokens, {out.finish_reason}): {out.text if tok else out.output_ids}")
    click.echo(f"--- {method} ---\n{metrics.summary()}")
    silent = [i for i, out in enumerate(outputs) if out.metrics and out.metrics.silent_drafts]
    if silent:  # said once for the run, not once per request
        which = f"request {silent[0]}" if len(silent) == 1 else f"{len(silent)} of {len(outputs)} requests"
        speculation = orch.engine.speculation
        click.echo(f"warning: {which}: {silent_draft_message(speculation.method, SILENT_DRAFT_ROUNDS, speculation.draft_len == AUTO)}", err=True)
    report = {"method": method, "metrics": metrics.to_dict()}
    if baseline:
        base_runs = [r for name, r in runs if name == "target-only"]
        spec_runs = [r for name, r in runs if name == method]
        base_out, base_metrics = base_runs[-1]
        same = all(a.output_ids == b.output_ids for r in spec_runs for a, b in zip(r[0], base_out, strict=True))
        click.echo(summary_table([("target-only", base_metrics), (method, metrics)]) if repeat == 1 else
                   repeat_table(method, [m for _, m in base_runs], [m for _, m in spec_runs]))
        click.echo(f"outputs identical to target-only: {'yes' if same else 'no'}{_sampled_note(orch.engine, sampling)}")
        speedups = [s.tokens_per_s / b.tokens_per_s for (_, b), (_, s) in zip(base_runs, spec_runs, strict=True) if b.tokens_per_s]
        report["baseline"] = {"metrics": base_metrics.to_dict(), "speedup": statistics.median(speedups) if speedups else 0.0,
                              "identical_outputs": same}
        if repeat > 1:
            report["baseline"]["repeats"] = {"target_only_tokens_per_s": [m.tokens_per_s for _, m in base_runs],
                                             "tokens_per_s": [m.tokens_per_s for _, m in spec_runs], "speedups": speedups}
    _write_outputs(outputs, report, output_csv, output_npy, output_json)
    failed = [(i, out.error) for i, out in enumerate(outputs) if out.finish_reason == "error"]
    if failed:  # the others' results are printed and written (finish_reason "error" marks these); the exit status says it failed
        more = f" ({len(failed) - 1} more request(s) stopped the same way)" if len(failed) > 1 else ""
        raise RequestError(f"request {failed[0][0]} stopped: {failed[0][1]}{more}")


def method_label(engine: Engine) -> str:
    """How a run is named in tables: its default method's proposer's label (draft-target, ngram, medusa / eagle chain or
    tree, ...), or target-only; with what it really ran where that differs: no drafts (--draft_len 0)."""
    proposer = engine.proposers.get(engine.speculation.method)
    if proposer is None:
        return "target-only"
    if engine.speculation.draft_len == 0:
        return f"{proposer.name}, --draft_len 0: target-only"
    return proposer.label


def _sampled_note(engine: Engine, sampling: SamplingConfig) -> str:
    """What --baseline's identity line may expect of a sampled run: token compare draws target-only's tokens for the
    seed, rejection sampling follows its drafts, and a padded draft cuts sampling to the ids both share."""
    if sampling.greedy or engine.speculation.method not in engine.proposers:
        return ""
    why = engine.sample_differs()
    return f" ({why}, not expected to be identical)" if why else " (sampled by token compare: target-only's draws, expected to be identical)"


def parse_draft_len(value: str | None) -> int | str | None:
    if value is None or value == "auto":
        return value
    try:
        n = int(value)
    except ValueError:
        n = -1
    if n < 0:
        raise RequestError(f"--draft_len {value!r}: expected a number >= 0 or 'auto'.")
    return n


def summary_table(rows) -> str:
    """A compact comparison, the first row being the baseline."""
    base = rows[0][1].tokens_per_s or 1.0
    w = max(14, *(len(name) + 2 for name, _ in rows))  # the longest label keeps the columns aligned
    lines = [f"{'method':<{w}}{'tokens/s':>10}{'speedup':>9}{'acceptance':>12}{'mean acc. len':>15}{'TTFT ms':>9}"]
    for name, m in rows:
        acc = f"{m.acceptance_rate:.3f}" if m.drafted else "-"
        mal = f"{m.mean_acceptance_length:.2f}" if m.drafted else "-"
        lines.append(f"{name:<{w}}{m.tokens_per_s:>10.1f}{m.tokens_per_s / base:>8.2f}x{acc:>12}{mal:>15}{m.mean_ttft_s * 1e3:>9.1f}")
    return "\n".join(lines)


def repeat_table(method: str, base: list, spec: list) -> str:
    """Medians over interleaved repeats, with the spread (min-max); speedups are per pair of neighbouring runs."""
    def spread(xs: list[float], fmt: str) -> str:
        return f"{format(min(xs), fmt)}-{format(max(xs), fmt)}"

    b_tps, s_tps = [m.tokens_per_s for m in base], [m.tokens_per_s for m in spec]
    ups = [s / b for b, s in zip(b_tps, s_tps, strict=True) if b]
    last = spec[-1]
    lines = [f"{'method':<14}{'tokens/s (median, min-max)':>30}{'speedup (median, min-max)':>29}{'acceptance':>12}{'mean acc. len':>15}",
             f"{'target-only':<14}{statistics.median(b_tps):>14.1f} {spread(b_tps, '.1f'):>15}{'1.00x':>29}{'-':>12}{'-':>15}",
             f"{method:<14}{statistics.median(s_tps):>14.1f} {spread(s_tps, '.1f'):>15}{statistics.median(ups):>13.2f}x {spread(ups, '.2f'):>14}"
             f"{(f'{last.acceptance_rate:.3f}' if last.drafted else '-'):>12}{(f'{last.mean_acceptance_length:.2f}' if last.drafted else '-'):>15}",
             f"{len(ups)} interleaved runs each (A B B A ...); speedup = method / target-only of the neighbouring run"]
    return "\n".join(lines)


def _write_outputs(outputs, report: dict, output_csv, output_npy, output_json) -> None:
    for path in (output_csv, output_npy, output_json):
        if path:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
    if output_csv:
        with open(output_csv, "w", newline="") as f:
            csv.writer(f).writerows(o.output_ids for o in outputs)
    if output_npy:
        width = max(len(o.output_ids) for o in outputs)
        arr = np.full((len(outputs), width), -1, np.int64)
        for i, o in enumerate(outputs):
            arr[i, : len(o.output_ids)] = o.output_ids
        with open(output_npy, "wb") as f:  # the path as given: np.save(path) would append .npy to one without it
            np.save(f, arr)
    if output_json:
        requests = [dict(input_ids=o.input_ids, output_ids=o.output_ids, text=o.text, finish_reason=o.finish_reason,
                         **({"error": o.error} if o.error else {}))
                    for o in outputs]
        Path(output_json).write_text(json.dumps({"requests": requests, **report}, indent=2) + "\n")


if __name__ == "__main__":
    main()
