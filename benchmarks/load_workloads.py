"""Closed-loop workloads at 1 to 64 concurrent streams: prefix caching and ``auto`` against target-only.

    python benchmarks/bench_load.py workloads --target T --draft D --workload agentic --concurrency 1,4,16,32,64 \\
        --servers cache,nocache --methods target-only,auto --repeats 2 --output_json out.json

Workloads (prompts from the Python standard library's source, as token ids; greedy, EOS ignored, so every
request makes exactly ``--max_tokens`` tokens):

    agentic   one conversation per stream: a system prompt with tool definitions shared by every stream, a task,
              then ``--turns`` turns, each turn's prompt = the previous prompt + its answer + a tool result
              (another function's source)
    chat      one shared system prompt, then a different question per request, ``--requests`` per stream
    code      ordinary code completion (a function's first lines), ``--requests`` per stream

A stream sends its next request when the previous one ended. guidellm 0.8.1 (the rate sweep of
bench_load.py) cannot build a turn's prompt from the previous answer, so this client does it; it reads each
response's token ids too, which is how "outputs identical to the cold server's in every run" is checked: every
run's tokens against the run of the first configuration (a server without the cache, target-only) in the same
repeat. Servers: ``cache`` and ``nocache`` are specdec-serve with and without prefix caching (both started,
one run at a time), ``llama.cpp`` is llama-server (``--llama_server``, ``--llama_model``) with ``cache_prompt``
on. Each repeat samples its own texts (the caches start cold for every run), runs every concurrency and every
(server, method) in an order that rotates from repeat to repeat, and records the machine's load average.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import re
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from prompts import _functions  # noqa: E402

SPECS = {"target-only": {"method": "none"}, "auto": {"method": "draft", "num_draft_tokens": "auto"}}
FIGURES = ("ttft_p50_ms", "ttft_p90_ms", "tpot_p50_ms", "throughput")


# -- the workloads ------------------------------------------------------------------------------------
@dataclass
class Stream:
    prompts: list[list[int]]  # chat / code: each request's prompt; agentic: the first turn's
    tools: list[list[int]] = field(default_factory=list)  # agentic: the tool result after each turn's answer


def make_streams(workload: str, tok, n: int, seed: int, args) -> list[Stream]:
    """``n`` streams of ``workload``; ``seed`` picks the texts (a new seed: caches that start cold)."""
    pool = _functions(400)
    rnd = random.Random(seed)
    text = lambda: rnd.choice(pool)  # noqa: E731
    ids = lambda s, k: tok.encode(s, add_special_tokens=False)[:k]  # noqa: E731
    if workload == "code":
        return [Stream([ids(text(), args.prompt_tokens) for _ in range(args.requests)]) for _ in range(n)]
    system = ids("You are a coding agent. Tools:\n" + "\n".join(text() for _ in range(4)), args.system_tokens)
    if workload == "chat":
        return [Stream([system + ids("\nUser: explain\n" + text(), args.prompt_tokens) for _ in range(args.requests)]) for _ in range(n)]
    return [Stream([system + ids("\nTask: fix\n" + text(), args.prompt_tokens)], [ids("\nTool result:\n" + text(), args.tool_tokens)
                                                                               for _ in range(args.turns - 1)]) for _ in range(n)]


# -- one request, streamed ----------------------------------------------------------------------------
@dataclass
class Record:
    stream: int
    turn: int
    prompt_tokens: int
    sent: float
    first: float = math.nan
    end: float = math.nan
    tokens: list[int] = field(default_factory=list)
    cached: int = -1  # usage.prompt_tokens_details.cached_tokens (specdec only)
    error: str = ""


def body(kind: str, prompt: list[int], max_tokens: int, spec: dict) -> tuple[str, dict]:
    if kind == "llama.cpp":  # llama-server's own endpoint: token ids in, token ids out, its prompt cache on
        return "/completion", {"prompt": prompt, "n_predict": max_tokens, "temperature": 0, "top_k": 1, "ignore_eos": True,
                               "stream": True, "cache_prompt": True, "return_tokens": True}
    return "/v1/completions", {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True, "stream": True,
                               "speculative": spec, "stream_options": {"include_usage": True}}


async def request(client, url: str, kind: str, rec: Record, prompt: list[int], max_tokens: int, spec: dict) -> None:
    import httpx

    path, payload = body(kind, prompt, max_tokens, spec)
    rec.sent = time.perf_counter()
    try:
        await _stream(client, url + path, payload, kind, rec)
    except httpx.HTTPError as err:  # counted as failed (no tokens: its outputs differ from the reference), not fatal
        rec.error = f"{type(err).__name__}: {err}"
        print(f"request failed ({url}{path}): {rec.error}", file=sys.stderr, flush=True)
    rec.end = time.perf_counter()


async def _stream(client, url: str, payload: dict, kind: str, rec: Record) -> None:
    async with client.stream("POST", url, json=payload, timeout=3600) as r:
        if r.status_code != 200:
            rec.error = f"HTTP {r.status_code}: {(await r.aread())[:300]!r}"
            return
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            new = chunk.get("tokens", []) if kind == "llama.cpp" else [t for c in chunk.get("choices", []) for t in c.get("token_ids", [])]
            if new and math.isnan(rec.first):
                rec.first = time.perf_counter()
            rec.tokens += new
            if chunk.get("usage"):
                rec.cached = chunk["usage"].get("prompt_tokens_details", {}).get("cached_tokens", -1)


async def run_streams(url: str, kind: str, streams: list[Stream], max_tokens: int, spec: dict) -> list[Record]:
    import httpx

    records: list[Record] = []
    # a connection per request: with keep-alive, a request sent as the server closes an idle connection fails
    # (httpx ReadError; seen once in 256 requests at 64 streams)
    limits = httpx.Limits(max_connections=len(streams) + 4, max_keepalive_connections=0)
    async with httpx.AsyncClient(limits=limits, timeout=3600) as client:

        async def one(i: int, s: Stream) -> None:
            agentic = bool(s.tools) or len(s.prompts) == 1
            prompt = s.prompts[0]
            for turn in range(len(s.tools) + 1 if agentic else len(s.prompts)):
                if not agentic:
                    prompt = s.prompts[turn]
                rec = Record(i, turn, len(prompt), 0.0)
                await request(client, url, kind, rec, prompt, max_tokens, spec)
                records.append(rec)
                if agentic and turn < len(s.tools):
                    prompt = prompt + rec.tokens + s.tools[turn]

        await asyncio.gather(*(one(i, s) for i, s in enumerate(streams)))
    return records


def summarize(records: list[Record], wall: float) -> dict:
    failed = sum(bool(r.error) for r in records)
    records = [r for r in records if not r.error and not math.isnan(r.first)]
    ttft = [(r.first - r.sent) * 1e3 for r in records] or [math.nan]
    tpot = [(r.end - r.first) * 1e3 / (len(r.tokens) - 1) for r in records if len(r.tokens) > 1]
    out_tokens = sum(len(r.tokens) for r in records)
    prompt_tokens = sum(r.prompt_tokens for r in records)
    cached = sum(max(r.cached, 0) for r in records)
    return {"requests": len(records), "failed": failed, "output_tokens": out_tokens, "wall_s": wall, "throughput": out_tokens / wall,
            "ttft_p50_ms": float(np.percentile(ttft, 50)), "ttft_p90_ms": float(np.percentile(ttft, 90)),
            "tpot_p50_ms": float(np.percentile(tpot, 50)) if tpot else math.nan,
            "prompt_tokens": prompt_tokens, "cached_tokens": cached, "hit_rate": cached / prompt_tokens if prompt_tokens else 0.0}


# -- servers ------------------------------------------------------------------------------------------
def start_specdec(args, cache: bool) -> tuple[subprocess.Popen, str]:
    cmd = [sys.executable, "-m", "specdec.cli.serve", "--engine_dir", args.target, "--port", "0", "--log_level", "warning",
           "--enable-prefix-caching" if cache else "--no-enable-prefix-caching"]
    if args.draft:
        cmd += ["--draft_engine_dir", args.draft, "--draft_target_model_config", "[4,[0],[0],False]"]
    if args.num_threads:
        cmd += ["--num_threads", str(args.num_threads)]
    return _wait(subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"}),
                 r"specdec-serve: model .* on (http://\S+)")


def start_llama(args, slots: int) -> tuple[subprocess.Popen, str]:
    port = 18000 + os.getpid() % 1000
    cmd = [args.llama_server, "-m", args.llama_model, "-np", str(slots), "-c", str(slots * args.llama_ctx), "-t", str(args.num_threads or 2),
           "-tb", str(args.num_threads or 2), "--host", "127.0.0.1", "--port", str(port), "--cont-batching", "--no-webui"]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    return _wait(proc, r"listening on (http://\S+)")  # older llama.cpp: "server is listening on URL"; newer: "llama_server: listening on URL"


def _wait(proc: subprocess.Popen, pattern: str) -> tuple[subprocess.Popen, str]:
    deadline = time.time() + 600
    while time.time() < deadline:
        line = proc.stderr.readline()
        if not line and proc.poll() is not None:
            raise SystemExit(f"{proc.args[0]} exited during startup")
        m = re.search(pattern, line)
        if m:
            print(line.strip(), flush=True)
            threading_drain(proc)
            return proc, m.group(1).rstrip("/")
        print(line.rstrip(), file=sys.stderr, flush=True)
    proc.terminate()
    raise SystemExit(f"{proc.args[0]} did not start in 600 s")


def threading_drain(proc: subprocess.Popen) -> None:
    """Keep reading the server's stderr (so that its pipe never fills and blocks it), passed on to ours."""
    import threading

    def drain() -> None:
        for line in proc.stderr:
            print(f"[{proc.args[0].rsplit('/', 1)[-1]} {proc.pid}] {line.rstrip()}", file=sys.stderr, flush=True)

    threading.Thread(target=drain, daemon=True).start()


COUNTERS = ("spec_decode_decision_seconds_total", "request_compute_seconds_total", "spec_decode_num_drafts_total",
            "spec_decode_num_draft_tokens_total")


def decision_counters(url: str) -> tuple[float, ...]:
    """specdec-serve's COUNTERS (/metrics), summed over labels: auto's deciding and the requests' compute seconds, the
    rounds with drafts and the draft tokens."""
    text = urllib.request.urlopen(f"{url}/metrics", timeout=30).read().decode()
    got = dict.fromkeys(COUNTERS, 0.0)
    for line in text.splitlines():
        m = re.match(r"specdec:(\w+)(?:\{[^}]*\})? (\S+)$", line)
        if m and m.group(1) in got:
            got[m.group(1)] += float(m.group(2))
    return tuple(got[c] for c in COUNTERS)


# -- the sweep ----------------------------------------------------------------------------------------
def configs(args) -> list[tuple[str, str, str, dict]]:
    """(label, server, kind, the request's speculative field); the first is the reference for identical outputs."""
    out = [(f"{server}/{method}", server, "specdec", SPECS[method]) for method in args.methods for server in args.servers]
    return out + ([("llama.cpp", "llama.cpp", "llama.cpp", {})] if args.llama_server else [])


def sweep(args, urls: dict[str, str], tok, work: Path) -> list[dict]:
    rows = []
    cfgs = configs(args)
    for _label, server, kind, spec in cfgs:  # warm-up, not recorded: first calls of each shape, auto's cost lines
        asyncio.run(run_streams(urls[server], kind, make_streams("code", tok, 2, 10_000, args), 4, spec))
    for repeat in range(args.repeats):
        for n in args.concurrency:
            streams = make_streams(args.workload, tok, n, seed=1000 * repeat + n, args=args)
            shift = repeat % len(cfgs)
            for label, server, kind, spec in cfgs[shift:] + cfgs[:shift]:
                if kind == "specdec":  # every run starts cold: no rows left by another configuration's run of the same texts
                    urllib.request.urlopen(urllib.request.Request(f"{urls[server]}/reset_prefix_cache", method="POST"), timeout=60).read()
                before = decision_counters(urls[server]) if kind == "specdec" else (0.0,) * len(COUNTERS)
                load0, t0 = os.getloadavg()[0], time.perf_counter()
                records = asyncio.run(run_streams(urls[server], kind, streams, args.max_tokens, spec))
                wall = time.perf_counter() - t0
                after = decision_counters(urls[server]) if kind == "specdec" else (0.0,) * len(COUNTERS)
                decide, compute, drafts, draft_tokens = (a - b for a, b in zip(after, before, strict=True))
                row = {"config": label, "concurrency": n, "repeat": repeat, **summarize(records, wall),
                       "loadavg": (load0 + os.getloadavg()[0]) / 2, "decision_share": decide / compute if compute > 0 else math.nan,
                       "drafted_tokens": draft_tokens, "drafting_rounds": drafts,
                       "outputs": {f"{r.stream}.{r.turn}": r.tokens for r in records}}
                rows.append(row)
                with open(work / "runs.jsonl", "a") as f:
                    f.write(json.dumps(row) + "\n")
                print(f"repeat {repeat} streams {n:>2} {label:<20}: {row['requests']} requests in {wall:.0f}s, {row['throughput']:.2f} tok/s, "
                      f"TTFT p50 {row['ttft_p50_ms']:.0f} p90 {row['ttft_p90_ms']:.0f} ms, TPOT p50 {row['tpot_p50_ms']:.0f} ms, "
                      f"hit rate {row['hit_rate']:.2f}, drafted {row['drafted_tokens']:.0f} tokens in {row['drafting_rounds']:.0f} rounds, deciding "
                      f"{100 * row['decision_share']:.2f}% of compute, load {row['loadavg']:.1f}", flush=True)
    return rows


def spread(xs: list[float]) -> dict:
    return {"median": float(np.median(xs)), "min": float(np.min(xs)), "max": float(np.max(xs))}


def aggregate(rows: list[dict], reference: str) -> dict:
    """Per (concurrency, config): median [min-max] over the repeats; paired ratios; outputs against the reference."""
    out = {"figures": [], "ratios": [], "identical": []}
    conc = sorted({r["concurrency"] for r in rows})
    labels = list(dict.fromkeys(r["config"] for r in rows))
    get = {(r["concurrency"], r["config"], r["repeat"]): r for r in rows}
    repeats = sorted({r["repeat"] for r in rows})
    for n in conc:
        for label in labels:
            runs = [get[(n, label, i)] for i in repeats if (n, label, i) in get]
            if runs:
                out["figures"].append({"concurrency": n, "config": label, "repeats": len(runs), "loadavg": spread([r["loadavg"] for r in runs]),
                                       "decision_share": spread([r.get("decision_share", math.nan) for r in runs]),
                                       "hit_rate": spread([r["hit_rate"] for r in runs]), **{f: spread([r[f] for r in runs]) for f in FIGURES}})
            for i in repeats:
                ref, run = get.get((n, reference, i)), get.get((n, label, i))
                if ref is not None and run is not None and label != reference and not label.startswith("llama"):
                    out["identical"].append({"concurrency": n, "config": label, "repeat": i, "identical": run["outputs"] == ref["outputs"]})
        pairs = [(f"{m}: cache / nocache", f"cache/{m}", f"nocache/{m}") for m in ("target-only", "auto")]
        pairs += [(f"{s}: auto / target-only", f"{s}/auto", f"{s}/target-only") for s in ("cache", "nocache")]
        pairs += [("llama.cpp / cache/target-only", "llama.cpp", "cache/target-only")]
        for name, a, b in pairs:
            both = [i for i in repeats if (n, a, i) in get and (n, b, i) in get]
            if both:
                out["ratios"].append({"concurrency": n, "pair": name,
                                      **{f: spread([get[(n, a, i)][f] / get[(n, b, i)][f] for i in both]) for f in FIGURES}})
    return out


def fmt(x: dict, d: int = 0) -> str:
    return f"{x['median']:.{d}f} [{x['min']:.{d}f}-{x['max']:.{d}f}]"


def report(agg: dict) -> str:
    lines = ["| streams | config | tok/s | TTFT p50 ms | TTFT p90 ms | TPOT p50 ms | prefix hit rate | deciding, % of compute | load avg |",
             "|---|---|---|---|---|---|---|---|---|"]
    for f in agg["figures"]:
        share = f["decision_share"]["max"] * 100
        lines.append(f"| {f['concurrency']} | {f['config']} | {fmt(f['throughput'], 2)} | {fmt(f['ttft_p50_ms'])} | {fmt(f['ttft_p90_ms'])} | "
                     f"{fmt(f['tpot_p50_ms'])} | {f['hit_rate']['median']:.2f} | {'' if math.isnan(share) else f'{share:.2f}'} | "
                     f"{f['loadavg']['median']:.1f} |")
    lines += ["", "| streams | pair | throughput | TTFT p50 | TTFT p90 | TPOT p50 |", "|---|---|---|---|---|---|"]
    for r in agg["ratios"]:
        lines.append(f"| {r['concurrency']} | {r['pair']} | {fmt(r['throughput'], 2)} | {fmt(r['ttft_p50_ms'], 2)} | {fmt(r['ttft_p90_ms'], 2)} | "
                     f"{fmt(r['tpot_p50_ms'], 2)} |")
    same = [x for x in agg["identical"]]
    lines.append(f"\noutputs identical to the reference run: {sum(x['identical'] for x in same)} of {len(same)} runs"
                 + "".join(f"; NOT {x['config']} at {x['concurrency']} streams, repeat {x['repeat']}" for x in same if not x["identical"]))
    return "\n".join(lines) + "\n(median [min-max] over the repeats; ratios paired within a repeat)"


def goals(agg: dict, workload: str) -> list[str]:
    ratios = {(r["concurrency"], r["pair"]): r for r in agg["ratios"]}
    conc = sorted({r["concurrency"] for r in agg["ratios"]})
    lines = []
    for n in conc:
        r = ratios.get((n, "target-only: cache / nocache"))
        if r and workload == "agentic":
            lower = 1 / r["ttft_p50_ms"]["median"]
            lines.append(f"{n} streams: TTFT p50 {lower:.2f}x lower with the cache (target-only) -> {'met' if lower >= 3 else 'NOT met'} (goal 3x)")
    top = max(conc, default=None)
    for m in ("target-only", "auto"):
        r = ratios.get((top, f"{m}: cache / nocache"))
        if r:
            lines.append(f"{top} streams, {m}: throughput cache / nocache {fmt(r['throughput'], 2)} -> "
                         f"{'met' if r['throughput']['median'] >= 1 else 'NOT met'}")
    for n in conc:
        for s in ("cache", "nocache"):
            r = ratios.get((n, f"{s}: auto / target-only"))
            if r:
                lines.append(f"{n} streams, {s}: auto / target-only throughput {fmt(r['throughput'], 2)} -> "
                             f"{'met' if r['throughput']['min'] >= 0.97 else 'NOT met'} (every repeat >= 0.97)")
    same = agg["identical"]
    lines.append(f"outputs identical to the cold server's (nocache/target-only): {'met' if all(x['identical'] for x in same) else 'NOT met'} "
                 f"({sum(x['identical'] for x in same)} of {len(same)} runs)")
    return lines


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(prog="bench_load.py workloads", description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", required=True)
    ap.add_argument("--draft", help="draft engine (needed for auto)")
    ap.add_argument("--workload", choices=("agentic", "chat", "code"), default="agentic")
    ap.add_argument("--concurrency", default="1,4,16,32,64")
    ap.add_argument("--servers", default="nocache,cache", help="comma-separated: nocache, cache (the first run of a repeat is nocache/target-only)")
    ap.add_argument("--methods", default="target-only,auto")
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--requests", type=int, default=2, help="chat / code: requests per stream")
    ap.add_argument("--system_tokens", type=int, default=160)
    ap.add_argument("--prompt_tokens", type=int, default=48)
    ap.add_argument("--tool_tokens", type=int, default=32)
    ap.add_argument("--max_tokens", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--num_threads", type=int, default=None)
    ap.add_argument("--llama_server", help="llama-server binary: adds llama.cpp (cache_prompt on) on the same workload")
    ap.add_argument("--llama_model", help="the GGUF llama-server loads (the target at the same bits)")
    ap.add_argument("--llama_ctx", type=int, default=768, help="llama-server's context per slot")
    ap.add_argument("--output_json", type=Path)
    ap.add_argument("--report", type=Path, help="no sweep: the tables and goals of an earlier --output_json or runs.jsonl")
    args = ap.parse_args(argv)
    args.concurrency = [int(x) for x in args.concurrency.split(",")]
    args.servers = args.servers.split(",")
    args.methods = args.methods.split(",")
    reference = f"{args.servers[0]}/{args.methods[0]}"
    if args.report:
        text = args.report.read_text()
        rows = [json.loads(x) for x in text.splitlines() if x.strip()] if args.report.suffix == ".jsonl" else json.loads(text)["runs"]
        agg = aggregate(rows, reference)
        print(report(agg) + "\n" + "\n".join(goals(agg, args.workload)))
        return
    from specdec.formats.tokenizer import Tokenizer

    tok = Tokenizer(args.target)
    work = Path(os.environ.get("TMPDIR", "/tmp")) / f"bench-workloads-{os.getpid()}"
    work.mkdir(parents=True, exist_ok=True)
    procs, urls = [], {}
    started = time.time()
    try:
        for server in args.servers:
            proc, urls[server] = start_specdec(args, cache=server == "cache")
            procs.append(proc)
        if args.llama_server:
            proc, urls["llama.cpp"] = start_llama(args, max(args.concurrency))
            procs.append(proc)
        rows = sweep(args, urls, tok, work)
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(60)
    agg = aggregate(rows, reference)
    print(report(agg))
    print("\n".join(goals(agg, args.workload)))
    print(f"sweep: {(time.time() - started) / 60:.1f} min; runs in {work / 'runs.jsonl'}")
    if args.output_json:
        args.output_json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "runs": rows, "summary": agg}) + "\n")
        chart(agg, args.output_json)


def chart(agg: dict, json_path: Path) -> None:
    """Each configuration's median TTFT, one panel per concurrency, beside the JSON (bench/plots.py)."""
    from specdec.bench.plots import beside, spread_bar, write_bars

    panels: dict[str, list] = {}
    for fig in agg["figures"]:
        panels.setdefault(f"{fig['concurrency']} streams", []).append(spread_bar(fig["config"], fig["ttft_p50_ms"]))
    if path := write_bars(beside(json_path), "median TTFT per configuration (lower is better)", panels, "TTFT p50 (ms)", None):
        print(f"wrote {path}")
