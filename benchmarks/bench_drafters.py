"""Suffix decoding, a draft with another tokenizer and draft_len=auto, against the other drafters (issue 24).

    # the 325M realistic-cost pair (benchmarks/enlarge.py), targets built with --tree_attention
    python benchmarks/bench_drafters.py speed --target T --draft D --cross_draft X --workload agentic,demo --rounds 3
    python benchmarks/bench_drafters.py speed ... --llama_lookup BIN --gguf T.gguf      # llama.cpp's n-gram cache as a peer
    python benchmarks/bench_drafters.py auto --target T --draft D --streams 1,2,4,8,16   # auto vs target-only per concurrency
    python benchmarks/bench_drafters.py micro --target T                                # suffix draft cost vs a target step at 2k

Workloads:

* demo: the demo prompts (benchmarks/prompts.py: ordinary and copy-heavy functions of the held-out stdlib files).
* agentic: ``--requests`` requests in sequence, each a tool call of an agent editing code: one of a few fixed
  templates (a handler, a test, a config entry, a log call) filled with varying names, so the target's answers
  repeat earlier answers in part, as an agent's repeated tool calls and code edits do (agentic_prompts()).

``speed`` runs the requests one at a time, interleaved across methods (request i with every method, then
request i + 1), and repeats that ``--rounds`` times with fresh drafter state (the global suffix cache and
llama.cpp's dynamic n-gram cache start empty each round). It prints each method's speed over target-only
(median [min-max] over rounds), its acceptance, and whether its greedy output equals target-only's.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from prompts import spread, workloads  # noqa: E402

from specdec.runtime import DraftTargetConfig, GenerationConfig, NGramConfig, load_engine  # noqa: E402
from specdec.runtime.engine import Engine, SpeculationConfig  # noqa: E402
from specdec.runtime.proposers.suffix import SuffixConfig, SuffixProposer  # noqa: E402
from specdec.runtime.tokenizer import Tokenizer  # noqa: E402

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
def make_methods(args, names: list[str]) -> dict[str, Engine]:
    """One engine per method, all on one target executor (the same session: no second copy of the weights)."""
    base = load_engine(args.target, num_threads=args.threads)
    tex = base.target
    trees = bool(getattr(tex, "tree_attention", False))
    out: dict[str, Engine] = {}
    for name in names:
        k = args.k if not name.endswith("auto") else "auto"
        kind = name.split()[0]
        if kind == "none":
            out[name] = base
        elif kind == "ngram":
            out[name] = load_engine(args.target, ngram=NGramConfig(args.ngram_k, 3, [0]), target_executor=tex, draft_len=k if k == "auto" else args.ngram_k)
        elif kind in ("suffix", "suffix-local"):
            cfg = SuffixConfig(max_draft_len=args.suffix_k, global_cache=kind == "suffix")
            out[name] = Engine(tex, [SuffixProposer(cfg, trees=trees)], SpeculationConfig("suffix", k if k == "auto" else args.suffix_k))
        elif kind == "draft" and args.draft:
            out[name] = load_engine(args.target, args.draft, DraftTargetConfig(args.k, [0], [0], False), target_executor=tex, draft_len=k)
        elif kind == "cross-draft" and args.cross_draft:
            out[name] = load_engine(args.target, args.cross_draft, DraftTargetConfig(args.k, [0], [0], False), target_executor=tex, draft_len=k)
        elif kind == "eagle" and args.eagle_target:
            out[name] = load_engine(args.eagle_target, num_threads=args.threads, draft_len=k if k == "auto" else None)
    return out


def one(engine: Engine, ids: list[int], cfg: GenerationConfig) -> tuple[list[int], float, object]:
    t = time.perf_counter()
    rid = engine.add_request(ids, cfg)
    out = None
    while engine.has_unfinished():
        for o in engine.step():
            if o.request_id == rid and o.finished:
                out = o
    return out.output_ids, time.perf_counter() - t, out.metrics


def lookup(args, text: str, n: int, cache: Path, gguf: str) -> tuple[int, float, float]:
    """llama.cpp's llama-lookup on one prompt with its dynamic n-gram cache file: (tokens, decode seconds, acceptance)."""
    cmd = [args.llama_lookup, "-m", gguf, "-p", text, "-n", str(n), "--temp", "0", "--spec-draft-n-max", str(args.ngram_k), "-lcd", str(cache),
           "-t", str(args.threads or 2), "-c", "2048"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    log = p.stdout + p.stderr
    m = re.search(r"decoded\s+(\d+)\s+tokens in\s+([\d.]+)\s+seconds", log)
    if p.returncode != 0 or not m:
        raise SystemExit(f"llama-lookup failed ({p.returncode}): {log[-400:]}")
    acc = re.search(r"accept\s*=\s*([\d.]+)%", log)
    return int(m.group(1)), float(m.group(2)), float(acc.group(1)) / 100 if acc else float("nan")


def speed(args) -> None:
    tok = Tokenizer(args.target)
    names = ["none", "ngram", "suffix-local", "suffix"] + (["draft"] if args.draft else []) + (["cross-draft"] if args.cross_draft else []) + \
        (["eagle"] if args.eagle_target else [])
    if args.methods:  # a subset (target-only is always measured: every speedup is against it)
        names = ["none"] + [n for n in names[1:] if n in args.methods.split(",")]
    cfg = GenerationConfig(max_output_len=args.tokens)
    report = {}
    for workload in args.workload.split(","):
        if workload == "agentic":
            texts = agentic_prompts(args.requests, seed=args.seed)
            prompts = [tok.encode(t) for t in texts]
        else:
            prompts, _ = workloads(Path(args.target), args.demo_prompts, args.prompt_tokens)
            texts = [tok.decode(p) for p in prompts]
        ratios: dict[str, list[float]] = {n: [] for n in names[1:]}
        tps: dict[str, list[float]] = {n: [] for n in names}
        stats: dict[str, list[tuple[int, int, int]]] = {n: [] for n in names}
        same = {n: True for n in names[1:]}
        lcpp: list[float] = []
        for r in range(args.rounds):
            engines = make_methods(args, names)  # fresh drafter state each round: the suffix cache starts empty
            secs = {n: 0.0 for n in names}
            toks = {n: 0 for n in names}
            want: list[list[int]] = []
            cache = Path(tempfile.mkdtemp()) / "lookup.bin"
            lc_tokens, lc_secs = 0, 0.0
            for i, ids in enumerate(prompts):
                if i % 10 == 9:
                    print(f"  [{workload}] round {r + 1}: request {i + 1}/{len(prompts)}", flush=True)
                order = names[:] if (i + r) % 2 == 0 else names[::-1]  # alternate the order: no method always runs first
                outs = {}
                for n in order:
                    out, dt, m = one(engines[n], ids, cfg)
                    outs[n] = out
                    secs[n] += dt
                    toks[n] += len(out)
                    stats[n].append((m.drafted, m.accepted, m.rounds))
                want.append(outs["none"])
                for n in names[1:]:
                    same[n] &= outs[n] == outs["none"]
                if args.llama_lookup:
                    t, s, _ = lookup(args, texts[i], args.tokens, cache, args.gguf)
                    lc_tokens, lc_secs = lc_tokens + t, lc_secs + s
            for n in names:
                tps[n].append(toks[n] / secs[n])
            for n in names[1:]:
                ratios[n].append(tps[n][-1] / tps["none"][-1])
            if args.llama_lookup:
                lcpp.append(lc_tokens / lc_secs)
            print(f"[{workload}] round {r + 1}/{args.rounds}: " + ", ".join(
                f"{n} {tps[n][-1]:.1f} tok/s" + (f" (x{ratios[n][-1]:.2f}, {tokens_per_call(stats[n][-len(prompts):]):.2f} tokens/call)" if n != "none" else "")
                for n in names) + (f", llama-lookup {lcpp[-1]:.1f} tok/s" if lcpp else ""), flush=True)
        print(f"\n{workload}: {len(prompts)} requests in sequence, {args.tokens} tokens each, {args.rounds} rounds "
              f"(speed over target-only: median [min-max])")
        rows = {}
        for n in names:
            drafted, accepted, rounds = (sum(x[j] for x in stats[n]) for j in range(3))
            sp = spread(ratios[n]) if n != "none" else None
            rows[n] = {"tok_s": spread(tps[n]), "speedup": sp, "acceptance": accepted / drafted if drafted else None,
                       "tokens_per_call": (rounds + accepted) / rounds if rounds else None, "exact": same.get(n, True)}
            print(f"  {n:<14} {spread_str(tps[n])} tok/s" + (f"   x{spread_str(ratios[n], '.2f')}" if n != "none" else " " * 22)
                  + (f"   accepted {accepted / drafted:.0%} of {drafted}" if drafted else "") + f"   tokens/call {rows[n]['tokens_per_call']:.2f}"
                  + ("" if same.get(n, True) else "   OUTPUT DIFFERS"))
        if lcpp:
            rows["llama-lookup"] = {"tok_s": spread(lcpp)}
            print(f"  {'llama-lookup':<14} {spread_str(lcpp)} tok/s (its own decode timing; n-gram cache kept across the round's requests)")
            if "suffix" in tps:
                print(f"  suffix / llama-lookup = {statistics.median(tps['suffix']) / statistics.median(lcpp):.2f}")
        if "suffix" in ratios and "ngram" in ratios:
            goal = statistics.median(ratios["suffix"]) / statistics.median(ratios["ngram"])
            print(f"  suffix (global) speedup / n-gram speedup = {goal:.2f}")
        report[workload] = rows
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))


def tokens_per_call(stats: list[tuple[int, int, int]]) -> float:
    """(rounds + accepted) / rounds over (drafted, accepted, rounds) records: tokens per target call after the prefill."""
    rounds, accepted = sum(x[2] for x in stats), sum(x[1] for x in stats)
    return (rounds + accepted) / rounds if rounds else 0.0


def spread_str(v: list[float], fmt: str = ".1f") -> str:
    s = spread(v)
    return f"{s['median']:{fmt}} [{s['min']:{fmt}}-{s['max']:{fmt}}]"


# -- draft_len=auto per concurrency -----------------------------------------------------------
def auto(args) -> None:
    from bench_engine import drive

    tok = Tokenizer(args.target)
    prompts = [tok.encode(t) for t in agentic_prompts(16, seed=args.seed)]
    names = ["none", "ngram auto", "suffix auto"] + (["draft auto"] if args.draft else []) + (["cross-draft auto"] if args.cross_draft else [])
    cfg = GenerationConfig(max_output_len=args.tokens)
    res: dict[tuple[str, int], list[float]] = {}
    for r in range(args.rounds):
        engines = make_methods(args, names)
        for streams in [int(s) for s in args.streams.split(",")]:
            for n in names:
                tps, _ = drive(engines[n], prompts, cfg, streams, args.requests_per_stream, 0.0)
                res.setdefault((n, streams), []).append(tps)
        print(f"round {r + 1}/{args.rounds} done", flush=True)
    print(f"\ndraft_len=auto vs target-only, {args.requests_per_stream} agentic requests per stream, {args.tokens} tokens each "
          f"(output tokens/s, median [min-max] of {args.rounds} rounds; ratio = median of per-round ratios)")
    for streams in [int(s) for s in args.streams.split(",")]:
        base = res[("none", streams)]
        line = f"  {streams:>2} streams: target-only {spread_str(base)}"
        for n in names[1:]:
            ratio = [a / b for a, b in zip(res[(n, streams)], base)]
            line += f" | {n} x{spread_str(ratio, '.2f')}"
        print(line)


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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("cmd", choices=["speed", "auto", "micro"])
    ap.add_argument("--target", required=True, help="target engine (built with --tree_attention for suffix trees)")
    ap.add_argument("--draft", help="draft engine sharing the target's tokenizer")
    ap.add_argument("--cross_draft", help="draft engine with another tokenizer")
    ap.add_argument("--eagle_target", help="an eagle target engine of the same model (its own EAGLE module)")
    ap.add_argument("--workload", default="agentic,demo")
    ap.add_argument("--methods", help="a subset of ngram,suffix-local,suffix,draft,cross-draft,eagle (target-only always runs)")
    ap.add_argument("--requests", type=int, default=50, help="agentic requests in sequence")
    ap.add_argument("--demo_prompts", type=int, default=4, help="demo prompts of each kind (ordinary, copy-heavy)")
    ap.add_argument("--prompt_tokens", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=48, help="output tokens per request")
    ap.add_argument("--k", type=int, default=4, help="draft-target draft length")
    ap.add_argument("--ngram_k", type=int, default=8)
    ap.add_argument("--suffix_k", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--streams", default="1,2,4,8,16")
    ap.add_argument("--requests_per_stream", type=int, default=2)
    ap.add_argument("--llama_lookup", help="llama.cpp's llama-lookup binary (a peer with its n-gram cache)")
    ap.add_argument("--gguf", help="the target as GGUF for llama-lookup, at the same bits as --target")
    ap.add_argument("--json", help="write the figures here")
    args = ap.parse_args()
    if args.llama_lookup and not args.gguf:
        raise SystemExit("--llama_lookup needs --gguf (the same target in GGUF, at the same bits).")
    {"speed": speed, "auto": auto, "micro": micro}[args.cmd](args)


if __name__ == "__main__":
    main()
