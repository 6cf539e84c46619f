"""Suffix decoding, a draft with another tokenizer and draft_len=auto, against the other drafters (issue 24).

    # the 325M realistic-cost pair (benchmarks/enlarge.py), targets built with --tree_attention
    python benchmarks/bench_drafters.py speed --target T --draft D --cross_draft X --workload agentic,demo --rounds 3
    python benchmarks/bench_drafters.py speed ... --llama_lookup BIN --gguf T.gguf      # llama.cpp's n-gram cache as a peer
    python benchmarks/bench_drafters.py auto --target T --draft D --eagle_target E --tokens 32 --min_requests 4 \
        --requests_per_stream 1 --fixed_ks 4,8 --nocap ngram,suffix,draft,eagle      # auto vs target-only per concurrency
    python benchmarks/bench_drafters.py speed --target T --workload agentic --requests 24 --tokens 16 --oracle \
        --methods "ngram,ngram auto,suffix,suffix auto,suffix-chain,suffix-p0.3,suffix 4"   # suffix's levers
    python benchmarks/bench_drafters.py micro --target T                                # suffix draft cost vs a target step at 2k
    python benchmarks/bench_drafters.py serve --target T --tokens 32 --rounds 2          # the agentic requests through specdec-serve
    python benchmarks/bench_drafters.py speed --device cuda --target E --eagle_target E --oracle   # on a GPU, E an ort_cuda EAGLE
                                                   # target (BENCH=drafters bash benchmarks/gpu_session.sh builds and runs it)

Workloads:

* demo: the demo prompts (benchmarks/prompts.py: ordinary and copy-heavy functions of the held-out stdlib files).
* a ``.jsonl`` file: its ``{"prompt": ...}`` lines (examples/train_lora.py --prompts-file writes held-out ones).
* agentic: ``--requests`` requests in sequence, each a tool call of an agent editing code: one of a few fixed
  templates (a handler, a test, a config entry, a log call) filled with varying names, so the target's answers
  repeat earlier answers in part, as an agent's repeated tool calls and code edits do (agentic_prompts()).

``speed`` runs the requests one at a time, interleaved across methods (request i with every method, then
request i + 1), and repeats that ``--rounds`` times with fresh drafter state (the global suffix cache and
llama.cpp's dynamic n-gram cache start empty each round). It prints each method's speed over target-only
(median [min-max] over rounds), its acceptance, and whether its greedy output equals target-only's. With
``--temperature`` every request is sampled instead (each with --seed): speed and acceptance only, as a sample is no
other method's output (suffix's trees against ``suffix-chain``, its best path alone, say).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import host  # noqa: E402
from prompts import spread, workloads  # noqa: E402

from specdec.bench.plots import Bar, beside, spread_bar, write_bars  # noqa: E402
from specdec.formats.engine_format import load_engine_dir  # noqa: E402
from specdec.formats.jsonl import json_lines  # noqa: E402
from specdec.formats.tokenizer import Tokenizer  # noqa: E402
from specdec.runtime import DraftTargetConfig, GenerationConfig, NGramConfig, load_engine  # noqa: E402
from specdec.runtime.backends import Executor, open_executor  # noqa: E402
from specdec.runtime.devices import placement  # noqa: E402
from specdec.runtime.draft_len import AutoDraftLen  # noqa: E402
from specdec.runtime.engine import Engine, SpeculationConfig  # noqa: E402
from specdec.runtime.proposers.suffix import SuffixConfig, SuffixProposer  # noqa: E402
from specdec.runtime.sampling import SamplingConfig  # noqa: E402
from specdec.runtime.suffix_cache import ResponseCache  # noqa: E402

# -- the agentic workload ---------------------------------------------------------------------
VERBS = ["get", "set", "load", "save", "parse", "check", "update", "delete", "create", "find", "reset", "merge"]
NOUNS = ["user", "order", "config", "session", "record", "token", "buffer", "entry", "header", "path", "item", "job"]
TEMPLATES = [
    'def handle_{verb}_{noun}(request):\n    """Tool call: {verb} a {noun} for the agent."""\n    {noun}_id = request.args.get("{noun}_id")\n'
    '    if {noun}_id is None:\n        return error_response(400, "missing {noun}_id")\n',
    'class Test{Verb}{Noun}(unittest.TestCase):\n\n    def test_{verb}_{noun}(self):\n        {noun} = make_{noun}()\n'
    '        result = {verb}_{noun}({noun})\n',
    '    def {verb}_{noun}(self, {noun}, *, strict=False):\n        """{Verb} the {noun}; strict raises instead of logging."""\n'
    '        if not isinstance({noun}, {Noun}):\n',
    '        logger.info("{verb} {noun} %s", {noun}.name)\n        self._{noun}s[{noun}.name] = {noun}\n        return self.{verb}_{noun}(\n',
]


def agentic_prompts(n: int, seed: int = 0) -> list[str]:
    """``n`` tool-call prompts: a few templates filled with varying verb/noun pairs (seeded)."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        verb, noun = rng.choice(VERBS), rng.choice(NOUNS)
        out.append(TEMPLATES[i % len(TEMPLATES)].format(verb=verb, noun=noun, Verb=verb.title(), Noun=noun.title()))
    return out


# -- the methods --------------------------------------------------------------------------------
def make_methods(args, names: list[str], tex: Executor, eagle_tex: Executor | None = None) -> dict[str, Engine]:
    """One engine per method, all on one target executor ``tex`` (the same session: no second copy of the weights);
    EAGLE on the eagle target's (``eagle_tex``; the same ``tex`` when --eagle_target is --target, else its own session).
    Method names: "none", a drafter ("ngram", "suffix", "suffix-local", "draft", "cross-draft", "eagle"), then
    " auto" (draft_len=auto) or " K" (a fixed draft length K) or nothing (the method's default).
    Draft, cross-draft and EAGLE-module sessions open on ``--device`` (the EAGLE module beside its target)."""
    dev = getattr(args, "device", "auto")
    trees = bool(getattr(tex, "tree_attention", False))
    out: dict[str, Engine] = {}
    for name in names:
        kind, _, mode = name.partition(" ")
        fixed = int(mode) if mode.isdigit() else None
        k = "auto" if mode.startswith("auto") else fixed
        if kind == "none":
            out[name] = Engine(tex, [], SpeculationConfig("none", 0))
        elif kind == "ngram":
            out[name] = load_engine(args.target, ngram=NGramConfig(fixed or args.ngram_k, 3, [0]), target_executor=tex, draft_len=k or args.ngram_k,
                                    device=dev)
        # suffix[-local][-chain][-p<min_token_prob>][-f<max_spec_factor>][-d<max_tree_depth>][-t<cached_prompt_tokens>][-o<max_spec_offset>]
        elif kind.startswith("suffix"):
            parts = kind.split("-")[1:]
            opts = {"p": ("min_token_prob", float), "f": ("max_spec_factor", float), "d": ("max_tree_depth", int), "t": ("cached_prompt_tokens", int),
                    "o": ("max_spec_offset", float)}
            extra = {opts[x[0]][0]: opts[x[0]][1](x[1:]) for x in parts if x[:1] in opts and x[1:2].isdigit()}
            cfg = SuffixConfig(max_draft_len=fixed or args.suffix_k, global_cache="local" not in parts, **extra)
            out[name] = Engine(tex, [SuffixProposer(cfg, trees=trees and "chain" not in parts)], SpeculationConfig("suffix", k or cfg.max_draft_len))
        elif kind == "draft" and args.draft:
            out[name] = load_engine(args.target, args.draft, DraftTargetConfig(fixed or args.k, [0], [0], False), target_executor=tex,
                                    draft_len=k or args.k,
                                    device=dev)
        elif kind == "cross-draft" and args.cross_draft:
            out[name] = load_engine(args.target, args.cross_draft, DraftTargetConfig(fixed or args.k, [0], [0], False), target_executor=tex,
                                    draft_len=k or args.k, device=dev)
        elif kind == "eagle" and args.eagle_target:
            same = eagle_tex is None and Path(args.eagle_target).resolve() == Path(args.target).resolve()  # one EAGLE target serves all
            out[name] = load_engine(args.eagle_target, num_threads=args.threads, target_executor=tex if same else eagle_tex, draft_len=k, device=dev)
        if mode == "auto-nocap":  # draft_len=auto without the batch's width cap (SpeculativeRound.batch_cap): the comparison
            out[name].round.batch_cap = lambda reqs, drafts: drafts
    return out


def open_target(args) -> Executor:
    """The target's session alone (no drafter of its own: an EAGLE target's module opens with the "eagle" method)."""
    engine = load_engine_dir(args.target)
    return open_executor(engine, placement([0], engine, "target", args.device, args.threads))


def where(args) -> str:
    """Where the target runs, for the summary lines: its CPU threads, or the GPU."""
    kind = placement([0], load_engine_dir(args.target), "target", args.device).kind
    return f"{args.threads} threads" if kind == "cpu" else f"on {kind}"


def one(engine: Engine, ids: list[int], cfg: GenerationConfig) -> tuple[list[int], float, float, object]:
    """One request alone: (output ids, seconds with prefill, seconds to the first token, metrics)."""
    t = time.perf_counter()
    rid = engine.add_request(ids, cfg)
    out = None
    while engine.has_unfinished():
        for o in engine.step():
            if o.request_id == rid and o.finished:
                out = o
    return out.output_ids, time.perf_counter() - t, out.metrics.ttft_s[0], out.metrics


def llama_runners(args, tok: Tokenizer, cache: Path) -> dict[str, object]:
    """llama.cpp's lookup (its dynamic n-gram cache file ``cache`` kept across the round's requests) and its
    target-only llama-completion, at the same thread count as ours (benchmarks/llama_cli.py times them by
    llama.cpp's own timers: with prefill, and decode only)."""
    from llama_cli import LlamaCliRunner

    class TimingsOnly(LlamaCliRunner):  # llama.cpp's text may not echo the prompt byte for byte: only its timings are needed
        def _parse(self, out: str, err: str, prompt: str):
            return super()._parse(out, err, prompt if prompt in out else "")

    bin_dir = Path(args.llama_lookup).parent
    enc = lambda text: tok.encode(text, add_special_tokens=False)  # noqa: E731
    lookup = TimingsOnly(bin_dir / "llama-lookup", Path(args.gguf), args.threads, ["--spec-draft-n-max", str(args.ngram_k), "-lcd", str(cache)],
                            tok.decode, enc)
    completion = TimingsOnly(bin_dir / "llama-completion", Path(args.gguf), args.threads, [], tok.decode, enc)
    return {"llama-lookup": lookup, "llama-target-only": completion}


def predictable(prompts: list[list[int]], outputs: list[list[int]], depth: int = 23, tail: int = 16) -> list[list[tuple[bool, bool]]]:
    """Per output token, (from earlier responses, from the request's own text): whether suffix decoding could draft it
    at best. Token i of a response is predictable from a place (the earlier responses, each behind its prompt's last
    ``tail`` tokens as the global cache holds them; the request's own prompt + output before it) when, for the
    longest suffix of the text before it (at most ``depth`` tokens) that occurs there with a continuation, the
    token is one of those continuations. A plain scan: a measurement, not the runtime's index."""

    def continuations(hays: list[list[int]], ctx: list[int]) -> set[int]:
        best: set[int] = set()
        for m in range(1, min(depth, len(ctx)) + 1):
            suffix, found = ctx[-m:], set()
            for h in hays:
                found.update(h[j + m] for j in range(len(h) - m) if h[j : j + m] == suffix)
            if not found:
                break
            best = found
        return best

    cached = [p[len(p) - min(tail, len(p)) :] + o for p, o in zip(prompts, outputs, strict=True)]
    return [[(token in continuations(cached[:n], prompt + out[:i]), token in continuations([prompt + out[:i]], prompt + out[:i]))
             for i, token in enumerate(out)] for n, (prompt, out) in enumerate(zip(prompts, outputs, strict=True))]


def oracle(flags: list[list[tuple[bool, bool]]]) -> dict[str, float]:
    """The shares of output tokens predictable from earlier responses, the request's own text, either."""
    every = [f for row in flags for f in row]
    return {"global": sum(g for g, _ in every) / len(every), "own": sum(o for _, o in every) / len(every),
            "either": sum(g or o for g, o in every) / len(every)}


def perfect_drafter(flags: list[list[tuple[bool, bool]]], costs: dict[int, float], k: int, own_only: bool) -> dict[str, float]:
    """A drafter that knows the answer: each round it drafts exactly the next predictable tokens (at most ``k``, all
    accepted, never a wrong node), so a round ends only at a token no place predicts. Its tokens per target call
    and its decode speedup over target-only when a call of w tokens costs ``costs[w]`` one-token steps: the bound
    suffix decoding (own_only False) or an n-gram drafter of the request's own text (True) can reach here."""
    calls = cost = tokens = 0.0
    for row in flags:
        i = 1  # token 0 comes with the prefill; decoding starts at token 1, as the decode-only figures count
        while i < len(row):
            j = 0  # drafts: the predictable tokens ahead, and the call's own token after them
            while j < k and i + j + 1 < len(row) and (row[i + j][1] if own_only else any(row[i + j])):
                j += 1
            calls, cost, tokens, i = calls + 1, cost + costs[min(j + 1, max(costs))], tokens + j + 1, i + j + 1
    return {"tokens_per_call": tokens / calls, "decode_speedup": tokens / cost}


def first_difference(tex: Executor, prompt: list[int], want: list[int], got: list[int]) -> dict[str, Any] | None:
    """Where ``got`` leaves target-only's ``want``, and the target's logits there, recomputed by one prefill of the
    prompt and the agreed tokens (a third call shape): the two tokens' logits, their gap relative to the largest
    logit, and the rank of ``got``. A gap of a few bfloat16 ulps with ``got`` second is a near-tie, which a
    half-precision verification may order the other way (docs/gpu.md#exactness); a wide gap or a low rank is a bug."""
    at = next((j for j, (a, b) in enumerate(zip(want, got, strict=False)) if a != b), None)
    if at is None:
        return None if len(want) == len(got) else {"at": min(len(want), len(got)), "length_only": True}
    cache = tex.new_cache(1)
    logits = np.asarray(tex.forward(cache, [prompt + want[:at]], all_logits=False).logits[0, -1], dtype=np.float32)  # [vocab]
    w, g = float(logits[want[at]]), float(logits[got[at]])
    return {"at": at, "want": want[at], "got": got[at], "want_logit": w, "got_logit": g,
            "relative_gap": (w - g) / float(np.abs(logits).max()), "got_rank": int((logits > g).sum()) + 1}


def step_costs(tex, widths: range = range(1, 10), context: int = 100, repeats: int = 7) -> dict[int, float]:
    """A call of w tokens over a one-token step on this target (median of interleaved repeats, ``context`` tokens
    cached): what a verification costs here."""
    times: dict[int, list[float]] = {w: [] for w in widths}
    cache = tex.new_cache(1)
    prompt = [(5 + i) % tex.vocab_size for i in range(context)]
    tex.forward(cache, [prompt], all_logits=False)
    for r in range(repeats):
        for w in widths if r % 2 == 0 else reversed(widths):
            t = time.perf_counter()
            tex.forward(cache, [[(10 + j) % tex.vocab_size for j in range(w)]], all_logits=True)
            times[w].append(time.perf_counter() - t)
            cache.rollback(0, context)
    one = statistics.median(times[1])
    return {w: statistics.median(v) / one for w, v in times.items()}


def speed(args) -> None:
    tok = Tokenizer(args.target)
    names = ["none", "ngram", "suffix-local", "suffix", "suffix auto"] + (["draft"] if args.draft else []) + \
        (["cross-draft"] if args.cross_draft else []) + (["eagle"] if args.eagle_target else [])
    if args.methods:  # any of make_methods' names (target-only is always measured: every speedup is against it)
        names = ["none"] + [n for n in args.methods.split(",") if n != "none"]
    peers = ["llama-target-only", "llama-lookup"] if args.llama_lookup else []
    sampled = args.temperature > 0  # each request drawn with --seed: every method's output a sample, none compared with target-only's
    cfg = GenerationConfig(max_output_len=args.tokens, sampling=SamplingConfig(temperature=args.temperature, random_seed=args.seed))
    report = {}
    # one target session for every method and round (on a GPU, each call shape's CUDA graph is captured once);
    # each round starts the drafters afresh (fresh_drafter_state: the suffix cache and auto's costs start empty)
    tex = open_target(args)
    engines: dict[str, object] = make_methods(args, names, tex=tex)
    warm = tok.encode("def warm_up(x):\n")
    for engine in engines.values():  # each method's first call shapes: ONNX Runtime's planning (and graph capture) untimed
        one(engine, warm, cfg)
    for workload in args.workload.split(","):
        if workload == "agentic":
            texts = agentic_prompts(args.requests, seed=args.seed)
            prompts = [tok.encode(t) for t in texts]
        elif workload.endswith(".jsonl"):  # {"prompt": ...} lines of a file (examples/train_lora.py --prompts-file writes one)
            texts = [value["prompt"] for _, value in json_lines(workload)]
            prompts = [tok.encode(t) for t in texts]
        else:
            prompts, _ = workloads(Path(args.target), args.demo_prompts, args.prompt_tokens)
            texts = [tok.decode(p) for p in prompts]
        every = names + peers
        ratios: dict[str, list[float]] = {n: [] for n in every[1:]}  # with prefill, over target-only's
        decode_ratios: dict[str, list[float]] = {n: [] for n in every[1:]}
        tps: dict[str, list[float]] = {n: [] for n in every}
        dtps: dict[str, list[float]] = {n: [] for n in every}
        stats: dict[str, list[tuple[int, int, int]]] = {n: [] for n in every}
        same = {n: True for n in names[1:]}
        differences: dict[str, dict[int, dict]] = {n: {} for n in names[1:]}  # method -> request -> first_difference()
        differing = {n: [0] * args.rounds for n in names[1:]}  # method -> requests whose output differs, per round
        for r in range(args.rounds):
            for n in names:
                fresh_drafter_state(engines[n])
            if peers:  # llama.cpp's dynamic n-gram cache starts empty each round too
                engines.update(llama_runners(args, tok, Path(tempfile.mkdtemp()) / "lookup.bin"))
            secs = {n: 0.0 for n in every}
            first = {n: 0.0 for n in every}  # prefill (+ the first token): ours the time to first token, llama.cpp's its prompt eval
            toks = {n: 0 for n in every}
            want: list[list[int]] = []
            for i, ids in enumerate(prompts):
                if i % 10 == 9:
                    print(f"  [{workload}] round {r + 1}: request {i + 1}/{len(prompts)}", flush=True)
                order = every[:] if (i + r) % 2 == 0 else every[::-1]  # alternate the order: no method always runs first
                outs = {}
                for n in order:
                    if n in peers:
                        out, dt, st = engines[n].run(ids, args.tokens)
                        outs[n], secs[n], first[n], toks[n] = out, secs[n] + dt, first[n] + dt - st["decode_s"], toks[n] + args.tokens
                        stats[n].append((st.get("drafted", 0), st.get("accepted", 0), 0))
                        continue
                    out, dt, ttft, m = one(engines[n], ids, cfg)
                    outs[n] = out
                    secs[n] += dt
                    first[n] += ttft
                    toks[n] += len(out)
                    stats[n].append((m.drafted, m.accepted, m.rounds))
                want.append(outs["none"])
                for n in [] if sampled else names[1:]:
                    same[n] &= outs[n] == outs["none"]
                    if outs[n] != outs["none"]:
                        differing[n][r] += 1
                        if i not in differences[n]:
                            differences[n][i] = {**first_difference(tex, ids, outs["none"], outs[n]), "round": r + 1}
            for n in every:
                tps[n].append(toks[n] / secs[n])
                dtps[n].append((toks[n] - len(prompts)) / (secs[n] - first[n]))  # the tokens after the first
            for n in every[1:]:
                base = "llama-target-only" if n == "llama-lookup" else "none"
                ratios[n].append(tps[n][-1] / tps[base][-1])
                decode_ratios[n].append(dtps[n][-1] / dtps[base][-1])
            if r == 0 and args.oracle:
                flags = predictable(prompts, want, tail=SuffixConfig().cached_prompt_tokens)
                o = oracle(flags)
                print(f"[{workload}] oracle: of the target's output tokens, {o['global']:.0%} are predictable from earlier responses, "
                      f"{o['own']:.0%} from the request's own text, {o['either']:.0%} from either (predictable())", flush=True)
                costs = step_costs(tex)
                o["step_costs"] = costs
                for k in (4, args.suffix_k):
                    o[f"perfect_k{k}"] = best, own = perfect_drafter(flags, costs, k, False), perfect_drafter(flags, costs, k, True)
                    print(f"[{workload}] a perfect drafter of at most {k} tokens (perfect_drafter(); a call of {k + 1} tokens costs "
                          f"{costs[min(k + 1, max(costs))]:.2f} one-token steps here): {best['tokens_per_call']:.2f} tokens per call, "
                          f"decode speedup x{best['decode_speedup']:.2f}; from the request's own text only (n-gram's bound): "
                          f"{own['tokens_per_call']:.2f}, x{own['decode_speedup']:.2f}", flush=True)
                report.setdefault("oracle", {})[workload] = o
            print(f"[{workload}] round {r + 1}/{args.rounds}: " + ", ".join(
                f"{n} {tps[n][-1]:.2f} / {dtps[n][-1]:.2f} tok/s" + (f" (x{ratios[n][-1]:.2f} / x{decode_ratios[n][-1]:.2f})" if n != "none" else "")
                for n in every) + "  [with prefill / decode only]", flush=True)
        print(f"\n{workload}: {len(prompts)} requests in sequence, {args.tokens} tokens each, {args.rounds} rounds, {where(args)} "
              f"(median [min-max] over rounds; speed over target-only, llama-lookup's over llama.cpp's target-only)")
        rows = {}
        for n in every:
            drafted, accepted, rounds = (sum(x[j] for x in stats[n]) for j in range(3))
            rows[n] = {"tok_s": spread(tps[n]), "decode_tok_s": spread(dtps[n]), "speedup": spread(ratios[n]) if n in ratios else None,
                       "decode_speedup": spread(decode_ratios[n]) if n in ratios else None,
                       "acceptance": accepted / drafted if drafted else None,
                       "tokens_per_call": (rounds + accepted) / rounds if rounds else None, "exact": None if sampled else same.get(n, True),
                       "differences": differences.get(n) or None, "differing_per_round": differing.get(n)}
            print(f"  {n:<17} with prefill {spread_str(tps[n], '.2f')} tok/s" + (f" x{spread_str(ratios[n], '.2f')}" if n in ratios else "")
                  + f" | decode only {spread_str(dtps[n], '.2f')} tok/s" + (f" x{spread_str(decode_ratios[n], '.2f')}" if n in ratios else "")
                  + (f" | accepted {accepted / drafted:.0%} of {drafted}" if drafted else "")
                  + (f" | tokens/call {rows[n]['tokens_per_call']:.2f}" if rounds else "")
                  + ("" if same.get(n, True) else f"   OUTPUT DIFFERS on {differing[n]} requests per round"))
            for i, d in (differences.get(n) or {}).items():  # a near-tie is half precision's; a clear gap is a bug
                print(f"    request {i}: differs from token {d['at']} (first seen in round {d['round']})" + ("" if d.get("length_only") else
                      f": target-only {d['want']} (logit {d['want_logit']:.5g}), {n} {d['got']} (logit {d['got_logit']:.5g}, "
                      f"rank {d['got_rank']}); gap {d['relative_gap']:.2e} of the largest logit, in a prefill of the agreed tokens"))
        for ref in [m for m in ("ngram", "ngram auto") if m in ratios]:  # the goal's ratio: suffix's speedup over n-gram's
            for n in [m for m in ratios if m.startswith("suffix")]:
                print(f"  {n} speedup / {ref} speedup: with prefill {statistics.median(ratios[n]) / statistics.median(ratios[ref]):.2f}, "
                      f"decode only {statistics.median(decode_ratios[n]) / statistics.median(decode_ratios[ref]):.2f}")
        if "suffix" in tps and peers:
            print(f"  suffix / llama-lookup tokens/s (per-round ratios, median [min-max]): with prefill "
                  f"{spread_str([a / b for a, b in zip(tps['suffix'], tps['llama-lookup'], strict=False)], '.2f')}, decode only "
                  f"{spread_str([a / b for a, b in zip(dtps['suffix'], dtps['llama-lookup'], strict=False)], '.2f')}")
        report[workload] = rows
        if args.json:  # after each workload: a run cut short (a device call's time limit) keeps what it measured
            Path(args.json).write_text(json.dumps({**report, "host": host.host_record(bandwidth=False)}, indent=1))
            chart(args, f"speed over target-only (llama-lookup: over llama.cpp's), {args.tokens} tokens a request, {where(args)}",
                  {w: [spread_bar(n, r["speedup"]) for n, r in rs.items() if r.get("speedup")] for w, rs in report.items() if w != "oracle"})


def chart(args, title: str, panels: dict[str, list[Bar]]) -> None:
    """The chart of the run beside its --json (bench/plots.py)."""
    if path := write_bars(beside(args.json), title, panels):
        print(f"wrote {path}", flush=True)


def tokens_per_call(stats: list[tuple[int, int, int]]) -> float:
    """(rounds + accepted) / rounds over (drafted, accepted, rounds) records: tokens per target call after the prefill."""
    rounds, accepted = sum(x[2] for x in stats), sum(x[1] for x in stats)
    return (rounds + accepted) / rounds if rounds else 0.0


def spread_str(v: list[float], fmt: str = ".1f") -> str:
    s = spread(v)
    return f"{s['median']:{fmt}} [{s['min']:{fmt}}-{s['max']:{fmt}}]"


# -- draft_len=auto per concurrency -----------------------------------------------------------
def auto_cells(args) -> list[tuple[str, int, int]]:
    """(method, streams, requests) cells: auto for every method at every stream count; at 1 stream also each
    fixed k of ``--fixed_ks`` (auto's other goal: the best fixed k within the spread there)."""
    streams = [int(s) for s in args.streams.split(",")]
    names = ["none", "ngram auto", "suffix auto"] + (["draft auto"] if args.draft else []) + \
        (["cross-draft auto"] if args.cross_draft else []) + (["eagle-none", "eagle auto"] if args.eagle_target else [])
    if args.methods:
        chosen = args.methods.split(",")
        # eagle-none (the EAGLE target decoding alone) is what EAGLE's ratios are over: it comes with eagle
        names = [n for n in names if n == "none" or n.split()[0] in chosen or (n == "eagle-none" and "eagle" in chosen)]
    fixed = [f"{n.split()[0]} {k}" for n in names if n.endswith(" auto") for k in args.fixed_ks.split(",") if k] if 1 in streams else []
    nocap = [f"{n}-nocap" for n in names if n.endswith(" auto") and n.split()[0] in args.nocap.split(",")]
    cells = []
    for s in streams:
        requests = max(args.requests_per_stream * s, args.min_requests)  # at least --min_requests: 1 stream is noisy
        cells += [(n, s, requests) for n in names + (fixed if s == 1 else nocap)]
    return cells


def fresh_drafter_state(engine: Engine) -> None:
    """A repeat starts from nothing: draft_len=auto's costs and acceptance, suffix decoding's global cache. The
    sessions stay (a server's are loaded once; each call shape's first run is ONNX Runtime's one-time planning)."""
    fresh = AutoDraftLen(engine.auto.max_draft_len, len(engine.auto.verify) - 1, engine.auto.even_rows)
    fresh.one_call, fresh.trees, fresh.refining = engine.auto.one_call, engine.auto.trees, engine.auto.refining  # the Engine's, from its proposers
    engine.auto = engine.round.policy.cost = fresh
    for proposer in engine.proposers.values():
        if isinstance(proposer, SuffixProposer) and proposer.cache is not None:
            proposer.cache = ResponseCache(proposer.config.max_cached_tokens, proposer.config.max_cached_responses)


def auto(args) -> None:
    """Target-only vs draft_len=auto per concurrency: closed-loop streams of agentic requests, every method of a
    stream count run one after the other (order alternating), the whole sweep repeated ``--rounds`` times after a
    warm-up pass, each repeat with fresh drafter state (fresh_drafter_state) on the same sessions."""
    from bench_engine import drive

    tok = Tokenizer(args.target)
    prompts = [tok.encode(t) for t in agentic_prompts(16, seed=args.seed)]
    cfg = GenerationConfig(max_output_len=args.tokens)
    cells = auto_cells(args)
    names = list(dict.fromkeys(n for n, _, _ in cells))
    base = load_engine(args.target, num_threads=args.threads, device=args.device, method="none", draft_len=0)
    engines = make_methods(args, [n for n in names if n != "none" and not n.startswith("eagle")], base.target)
    engines["none"] = base
    if args.eagle_target:
        eagle_base = load_engine(args.eagle_target, num_threads=args.threads, device=args.device, method="none", draft_len=0)
        engines["eagle-none"] = eagle_base
        engines.update(make_methods(args, [n for n in names if n.startswith("eagle ")], base.target, eagle_base.target))
    res: dict[tuple[str, int], list[float]] = {}
    drafted: dict[tuple[str, int], list[tuple[float, float]]] = {}
    for r in range(-1, args.rounds):  # round -1: a warm-up (every call shape planned once by ONNX Runtime), not counted
        for eng in engines.values():
            fresh_drafter_state(eng)
        by_streams: dict[int, list[tuple[str, int]]] = {}
        for n, s, q in cells:
            by_streams.setdefault(s, []).append((n, s if r < 0 else q))
        for i, (s, group) in enumerate(by_streams.items()):
            for n, q in (group if (i + r) % 2 == 0 else group[::-1]):  # alternate the order: no method always runs first
                eng = engines[n]
                before = (eng.stats.drafted, eng.stats.accepted, eng.stats.rounds)
                tps, _ = drive(eng, prompts, cfg, s, max(q // s, 1), 0.0)
                if r < 0:
                    continue
                res.setdefault((n, s), []).append(tps)
                d, a, rr = (x - y for x, y in zip((eng.stats.drafted, eng.stats.accepted, eng.stats.rounds), before, strict=True))
                drafted.setdefault((n, s), []).append((d / rr, a / rr) if rr else (0.0, 0.0))
            if r >= 0:
                print(f"round {r + 1}/{args.rounds}, {s} streams: " + ", ".join(f"{n} {res[(n, s)][-1]:.1f}" for n, _ in group), flush=True)
        print(f"round {r + 1} done" if r >= 0 else "warm-up done", flush=True)
    streams = list(dict.fromkeys(s for _, s, _ in cells))
    print(f"\ndraft_len=auto vs target-only, agentic requests, {args.tokens} tokens each, {where(args)} "
          f"(output tokens/s: median [min-max] of {args.rounds} rounds; ratios: median [min-max] of per-round ratios; "
          f"drafts and accepted drafts per row-round: medians)")
    report = {}
    for s in streams:
        ref = res[("none", s)]
        line = f"  {s:>2} streams ({max(args.requests_per_stream * s, args.min_requests)} requests): target-only {spread_str(ref)} tok/s"
        for n in [n for n, s2, _ in cells if s2 == s and n != "none"]:
            base_n = "eagle-none" if n.startswith("eagle ") else "none"
            ratio = [a / b for a, b in zip(res[(n, s)], res[(base_n, s)], strict=False)]
            report[f"{n}@{s}"] = {"tok_s": spread(res[(n, s)]), "ratio": spread(ratio), "vs": base_n,
                                  "drafts_accepted_per_row_round": drafted[(n, s)]}
            d = drafted[(n, s)]
            k = f"  drafts/row-round {statistics.median(x[0] for x in d):.2f}, accepted {statistics.median(x[1] for x in d):.2f}"
            line += f"\n      {n:<16} x{spread_str(ratio, '.2f')}{k}" + (" vs eagle target-only" if base_n != "none" else "")
        report[f"none@{s}"] = {"tok_s": spread(ref)}
        print(line)
    if args.json:
        Path(args.json).write_text(json.dumps({**report, "host": host.host_record(bandwidth=False)}, indent=1))
        chart(args, f"draft_len=auto over target-only per concurrency, {args.tokens} tokens a request, {where(args)}",
              {f"{s} streams": [spread_bar(k.split("@")[0], v["ratio"]) for k, v in report.items() if k.endswith(f"@{s}") and "ratio" in v]
               for s in streams})


# -- the draft's own cost -----------------------------------------------------------------------
def micro(args) -> None:
    """Suffix drafting at a 2k-token context (and a global cache of 200k tokens) vs one target step there."""
    from specdec.runtime.request import Request

    tok = Tokenizer(args.target)
    text = "".join(agentic_prompts(200, seed=1))
    ids = tok.encode(text)[:2000]
    rng = np.random.default_rng(0)
    proposer = SuffixProposer(SuffixConfig(max_draft_len=8), trees=True)
    for _ in range(1000):  # 200k tokens of earlier responses
        start = int(rng.integers(0, len(ids) - 200))
        proposer.cache.add(ids[start : start + 200])
    req = Request("r", ids, GenerationConfig(), "suffix", 8, rng)
    t = time.perf_counter()
    proposer.add([req])
    add_s = time.perf_counter() - t
    times = []
    for _ in range(200):
        t = time.perf_counter()
        proposer.propose([req], [8])
        times.append(time.perf_counter() - t)
    engine = load_engine(args.target, num_threads=args.threads)
    ex = engine.target
    cache = ex.new_cache(1)
    ex.forward(cache, [ids[:1000]], all_logits=False)
    ex.forward(cache, [ids[1000:2000]], all_logits=False)
    steps = []
    for _ in range(5):
        t = time.perf_counter()
        ex.forward(cache, [ids[:9]], all_logits=True)
        steps.append(time.perf_counter() - t)
        cache.rollback(0, 2000)
    d, s = statistics.median(times), statistics.median(steps)
    print(f"suffix: index a 2,000-token prompt {add_s * 1e3:.2f} ms once; propose at 2,000 tokens (+ a 200k-token global cache) "
          f"{d * 1e6:.0f} us (median of 200)")
    print(f"target: one verification step (9 tokens) at 2,000 tokens of context {s * 1e3:.1f} ms (median of 5); "
          f"drafting costs {d / s:.2%} of it")


# -- the agentic workload through specdec-serve ------------------------------------------------
def serve(args) -> None:
    """The agentic requests in sequence through ``specdec-serve``, as an agent's client sends them: one server per
    round (its suffix cache holds only the warm-up's response), every method chosen per request with the ``speculative`` field and run
    on each request in turn (order alternating), greedy with ``ignore_eos``. Client-side seconds per method, the
    server's tokens per call, and whether each method's tokens equal target-only's."""
    import subprocess
    import threading
    import urllib.request

    from bench_serving import start_server

    methods = ["none"] + [m for m in (args.methods or "ngram,suffix").split(",") if m != "none"]
    texts = agentic_prompts(args.requests, seed=args.seed)
    tps: dict[str, list[float]] = {m: [] for m in methods}
    calls: dict[str, list[float]] = {m: [] for m in methods}
    same = {m: True for m in methods}
    for r in range(args.rounds):
        server = argparse.Namespace(target=args.target, draft=None, draft_len=0, ngram_config=f"[{args.ngram_k},3,[0]]",
                                    suffix_config=json.dumps({"max_draft_len": args.suffix_k}), num_threads=args.threads)
        proc, url = start_server(server)
        threading.Thread(target=proc.stderr.read, daemon=True).start()  # drained, so a chatty server never blocks on it
        try:
            secs, toks, rounds, accepted = ({m: 0.0 for m in methods} for _ in range(4))
            def complete(prompt: str, method: str, url: str = url) -> dict:
                body = {"prompt": prompt, "max_tokens": args.tokens, "temperature": 0, "ignore_eos": True, "speculative": {"method": method}}
                req = urllib.request.Request(f"{url}/v1/completions", json.dumps(body).encode(), {"Content-Type": "application/json"})
                with urllib.request.urlopen(req, timeout=600) as resp:
                    return json.load(resp)

            for m in methods:  # uncounted: each call shape's first run is ONNX Runtime's one-time planning
                complete("def warm_up(x):\n", m)
            for i, text in enumerate(texts):
                outs = {}
                for m in methods if (i + r) % 2 == 0 else methods[::-1]:
                    t = time.perf_counter()
                    reply = complete(text, m)
                    secs[m] += time.perf_counter() - t
                    outs[m] = reply["choices"][0]["token_ids"]
                    toks[m] += len(outs[m])
                    spec = reply.get("speculative") or {}
                    rounds[m] += spec.get("rounds", len(outs[m]))
                    accepted[m] += spec.get("accepted", 0)
                for m in methods:
                    same[m] &= outs[m] == outs["none"]
        finally:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
        for m in methods:
            tps[m].append(toks[m] / secs[m])
            calls[m].append((rounds[m] + accepted[m]) / rounds[m] if rounds[m] else 1.0)
        print(f"round {r + 1}/{args.rounds}: " + ", ".join(f"{m} {tps[m][-1]:.1f} tok/s" for m in methods), flush=True)
    print(f"\nagentic through specdec-serve: {args.requests} requests in sequence, {args.tokens} tokens each, {args.rounds} rounds "
          f"(a fresh server each), {args.threads} threads; client-side tok/s, median [min-max] over rounds")
    base = tps["none"]
    report = {}
    for m in methods:
        ratio = [a / b for a, b in zip(tps[m], base, strict=False)]
        report[m] = {"tok_s": spread(tps[m]), "speedup": spread(ratio), "tokens_per_call": statistics.median(calls[m]), "exact": same[m]}
        print(f"  {m:<8} {spread_str(tps[m])} tok/s" + (f"  x{spread_str(ratio, '.2f')}" if m != "none" else "") +
              f"  tokens/call {statistics.median(calls[m]):.2f}  output identical to target-only: {'yes' if same[m] else 'NO'}")
    if args.json:
        Path(args.json).write_text(json.dumps({"serve": report, "host": host.host_record(bandwidth=False)}, indent=1) + "\n")
        chart(args, f"through specdec-serve: client tok/s over target-only, {args.tokens} tokens a request",
              {"agentic": [spread_bar(m, r["speedup"]) for m, r in report.items() if m != "none"]})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("cmd", choices=["speed", "auto", "micro", "serve"])
    ap.add_argument("--target", required=True, help="target engine (built with --tree_attention for suffix trees)")
    ap.add_argument("--draft", help="draft engine sharing the target's tokenizer")
    ap.add_argument("--cross_draft", help="draft engine with another tokenizer")
    ap.add_argument("--eagle_target", help="an eagle target engine of the same model (its own EAGLE module)")
    ap.add_argument("--workload", default="agentic,demo")
    ap.add_argument("--methods", help="speed: methods to run (target-only always runs): ngram, suffix, draft, cross-draft, eagle, each "
                    "optionally followed by ' auto' or ' K' (a fixed k); suffix variants: suffix-local (no global cache), -chain "
                    "(its best path, not the tree), -p0.3 (min_token_prob), -f2 (max_spec_factor), -d12 (max_tree_depth), e.g. "
                    "'suffix-chain-p0.3 auto'. auto: a subset of ngram,suffix,draft,cross-draft,eagle")
    ap.add_argument("--requests", type=int, default=50, help="agentic requests in sequence")
    ap.add_argument("--demo_prompts", type=int, default=4, help="demo prompts of each kind (ordinary, copy-heavy)")
    ap.add_argument("--prompt_tokens", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=48, help="output tokens per request")
    ap.add_argument("--k", type=int, default=4, help="draft-target draft length")
    ap.add_argument("--ngram_k", type=int, default=8)
    ap.add_argument("--suffix_k", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2, help="ours and llama.cpp's alike")
    ap.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"],
                    help="speed, auto: where the target, draft and EAGLE module run (cuda: engines built with --lowering ort_cuda)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--streams", default="1,2,4,8,16")
    ap.add_argument("--requests_per_stream", type=int, default=2)
    ap.add_argument("--min_requests", type=int, default=6, help="auto: at least this many requests per stream count")
    ap.add_argument("--fixed_ks", default="2,4,8", help="auto: fixed draft lengths also run at 1 stream (empty: none)")
    ap.add_argument("--nocap", default="", help="auto: methods also run without the batch's width cap at 2+ streams (e.g. ngram,suffix)")
    ap.add_argument("--llama_lookup",
                    help="llama.cpp's llama-lookup binary (a peer with its n-gram cache; llama-completion beside it is its target-only)")
    ap.add_argument("--gguf", help="the target as GGUF for llama-lookup, at the same bits as --target")
    ap.add_argument("--oracle", action="store_true",
                    help="print the share of output tokens suffix decoding could draft at best, and the speedup a perfect drafter would reach under "
                         "this target's measured call costs (round 1)")
    ap.add_argument("--temperature", type=float, default=0.0,
                    help="speed: sample every request at this temperature (seeded by --seed) instead of greedy: the outputs are then "
                         "samples, not compared with target-only's; llama.cpp's runs stay greedy, so not with --llama_lookup")
    ap.add_argument("--json", help="write the figures here")
    args = ap.parse_args()
    if args.llama_lookup and not args.gguf:
        raise SystemExit("--llama_lookup needs --gguf (the same target in GGUF, at the same bits).")
    if args.temperature < 0 or (args.temperature > 0 and args.llama_lookup):
        raise SystemExit("--temperature must be >= 0, and > 0 only without --llama_lookup (llama.cpp's runs here are greedy).")
    {"speed": speed, "auto": auto, "micro": micro, "serve": serve}[args.cmd](args)


if __name__ == "__main__":
    main()
