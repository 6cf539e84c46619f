"""Load-test specdec-serve with Poisson arrivals (in the spirit of vLLM's benchmark_serving.py).

Starts ``specdec-serve`` (a separate process, so the load generator does not
share its interpreter) with a draft model and n-gram drafting loaded, then for
each speculation method and each request rate sends the dataset's prompts
with exponential gaps between arrivals (rate ``inf``: all at once), streaming,
and measures what a client sees:

    TTFT   request sent -> first streamed token
    TPOT   (last token - first token) / (output tokens - 1), per request
    throughput   output tokens / (last response - first request)

Each method runs on the same server, the same prompts and the same arrival
times; the method is chosen per request with the ``speculative`` extension
field. Requests ask for ``--max_tokens`` tokens with ``ignore_eos`` so every
method generates the same amount.

    python benchmarks/bench_serving.py --write_dataset /tmp/prompts.jsonl --tokenizer examples/demo-pair/target
    python benchmarks/bench_serving.py --target /tmp/serve-demo/target --draft /tmp/serve-demo/draft \\
        --dataset /tmp/prompts.jsonl --rates 2,8,inf --num_prompts 32 --max_tokens 64

``--url`` benchmarks a server that is already running (any OpenAI-compatible
one; the speculative field is then only a hint it may ignore).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent


@dataclass
class Record:
    ok: bool
    ttft: float = 0.0
    e2e: float = 0.0
    tokens: int = 0
    accepted: int = 0
    drafted: int = 0
    rounds: int = 0
    error: str = ""

    @property
    def tpot(self) -> float | None:
        return (self.e2e - self.ttft) / (self.tokens - 1) if self.tokens >= 2 else None


@dataclass
class Run:
    method: str
    rate: float
    records: list[Record] = field(default_factory=list)
    duration: float = 0.0

    def summary(self) -> dict:
        ok = [r for r in self.records if r.ok]
        ttft = [r.ttft for r in ok]
        tpot = [r.tpot for r in ok if r.tpot is not None]
        tokens = sum(r.tokens for r in ok)
        rounds = sum(r.rounds for r in ok)

        def pct(xs, q):
            return float(np.percentile(xs, q)) * 1e3 if xs else float("nan")

        return {
            "method": self.method, "rate": self.rate, "completed": len(ok), "failed": len(self.records) - len(ok),
            "duration_s": self.duration, "request_throughput": len(ok) / self.duration if self.duration else 0.0,
            "output_throughput": tokens / self.duration if self.duration else 0.0,
            **{f"ttft_p{q}_ms": pct(ttft, q) for q in (50, 90, 99)},
            **{f"tpot_p{q}_ms": pct(tpot, q) for q in (50, 90, 99)},
            "mean_acceptance_length": 1 + sum(r.accepted for r in ok) / rounds if rounds else 1.0,
            "acceptance_rate": sum(r.accepted for r in ok) / max(sum(r.drafted for r in ok), 1),
        }


# -- the dataset ------------------------------------------------------------------------------
def write_dataset(path: Path, tokenizer_dir: Path, n: int, tokens: int) -> None:
    """Prompts from the Python standard library's functions (benchmarks/prompts.py), as JSON lines."""
    sys.path.insert(0, str(HERE))
    from prompts import _functions

    from specdec.formats.tokenizer import Tokenizer

    tok = Tokenizer(tokenizer_dir)
    with open(path, "w") as f:
        for fn in _functions(n)[:n]:
            ids = tok.encode(fn, add_special_tokens=False)[:tokens]
            f.write(json.dumps({"prompt": tok.decode(ids)}) + "\n")
    print(f"wrote {n} prompts to {path}")


def read_dataset(path: Path, n: int) -> list[str]:
    """.jsonl with a "prompt" per line, or .txt with one prompt per line; cycled up to n."""
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    prompts = [json.loads(line)["prompt"] for line in lines] if path.suffix == ".jsonl" else lines
    if not prompts:
        raise SystemExit(f"{path} holds no prompts")
    return [prompts[i % len(prompts)] for i in range(n)]


# -- the load -----------------------------------------------------------------------------------
async def one(client, url: str, body: dict) -> Record:
    start = time.perf_counter()
    rec = Record(ok=False)
    try:
        async with client.stream("POST", f"{url}/v1/completions", json=body) as r:
            if r.status_code != 200:
                return Record(ok=False, error=f"{r.status_code}: {(await r.aread())[:200]!r}")
            async for line in r.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    return Record(ok=False, error=chunk["error"]["message"])
                if chunk["choices"]:
                    n = len(chunk["choices"][0].get("token_ids") or []) or (1 if chunk["choices"][0]["text"] else 0)
                    if n and not rec.tokens:
                        rec.ttft = time.perf_counter() - start
                    rec.tokens += n
                if chunk.get("usage"):
                    rec.tokens = chunk["usage"]["completion_tokens"]
                    spec = chunk.get("speculative") or {}
                    rec.accepted, rec.drafted, rec.rounds = spec.get("accepted", 0), spec.get("drafted", 0), spec.get("rounds", 0)
        rec.e2e, rec.ok = time.perf_counter() - start, True
    except Exception as err:  # a failed request is counted, not fatal
        rec.error = f"{type(err).__name__}: {err}"
    return rec


async def run_rate(url: str, prompts: list[str], gaps: list[float], method: str, max_tokens: int, model: str | None) -> Run:
    import httpx

    run = Run(method, math.inf if not gaps or not any(gaps) else len(gaps) / sum(gaps))
    limits = httpx.Limits(max_connections=len(prompts) + 4, max_keepalive_connections=len(prompts) + 4)
    async with httpx.AsyncClient(timeout=httpx.Timeout(600.0), limits=limits) as client:
        tasks = []
        start = time.perf_counter()
        for prompt, gap in zip(prompts, gaps, strict=False):
            await asyncio.sleep(gap)
            body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True, "stream": True,
                    "stream_options": {"include_usage": True}, "speculative": {"method": method}}
            if model:
                body["model"] = model
            tasks.append(asyncio.create_task(one(client, url, body)))
        run.records = list(await asyncio.gather(*tasks))
        run.duration = time.perf_counter() - start
    return run


def arrival_gaps(n: int, rate: float, seed: int) -> list[float]:
    """Exponential gaps (a Poisson process) of mean 1/rate; all zero for rate inf."""
    if math.isinf(rate):
        return [0.0] * n
    gaps = np.random.default_rng(seed).exponential(1.0 / rate, n)
    gaps[0] = 0.0
    return gaps.tolist()


# -- the server ---------------------------------------------------------------------------------
def start_server(args) -> tuple[subprocess.Popen, str]:
    cmd = [sys.executable, "-m", "specdec.cli.serve", "--engine_dir", args.target, "--port", "0", "--log_level", "warning"]
    if args.draft:
        cmd += ["--draft_engine_dir", args.draft, "--draft_target_model_config", f"[{args.draft_len},[0],[0],False]"]
    if args.ngram_config:
        cmd += ["--ngram_config", args.ngram_config]
    if getattr(args, "suffix_config", None):
        cmd += ["--suffix_config", args.suffix_config]
    if args.num_threads:
        cmd += ["--num_threads", str(args.num_threads)]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    deadline = time.time() + 300
    while time.time() < deadline:
        line = proc.stderr.readline()
        if not line and proc.poll() is not None:
            raise SystemExit("specdec-serve exited during startup")
        m = re.search(r"on (http://\S+)", line)
        if "specdec-serve:" in line and m:
            print(line.strip())
            return proc, m.group(1)
    proc.terminate()
    raise SystemExit("specdec-serve did not start in 300 s")


def table(rows: list[dict]) -> str:
    head = (f"{'method':<7}{'rate':>6}{'done':>6}{'req/s':>7}{'tok/s':>8}{'TTFT p50':>10}{'p90':>8}{'p99':>8}"
            f"{'TPOT p50':>10}{'p90':>8}{'p99':>8}{'acc.len':>9}")
    lines = [head, "-" * len(head)]
    for r in rows:
        rate = "inf" if math.isinf(r["rate"]) else f"{r['rate']:.2g}"
        lines.append(
            f"{r['method']:<7}{rate:>6}{r['completed']:>6}{r['request_throughput']:>7.2f}{r['output_throughput']:>8.1f}"
            f"{r['ttft_p50_ms']:>10.0f}{r['ttft_p90_ms']:>8.0f}{r['ttft_p99_ms']:>8.0f}"
            f"{r['tpot_p50_ms']:>10.1f}{r['tpot_p90_ms']:>8.1f}{r['tpot_p99_ms']:>8.1f}{r['mean_acceptance_length']:>9.2f}"
        )
    return "\n".join(lines) + "\n(TTFT and TPOT in ms; acc.len: tokens per target call, 1 + accepted / rounds)"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", help="target engine dir (a server is started)")
    ap.add_argument("--draft", help="draft engine dir")
    ap.add_argument("--draft_len", type=int, default=4)
    ap.add_argument("--ngram_config", default="[8,3,[0]]")
    ap.add_argument("--num_threads", type=int, default=None)
    ap.add_argument("--url", help="benchmark a running server instead of starting one")
    ap.add_argument("--model", default=None)
    ap.add_argument("--dataset", type=Path, help=".jsonl ({'prompt': ...} per line) or .txt (a prompt per line)")
    ap.add_argument("--write_dataset", type=Path, help="write a dataset from the Python stdlib (needs --tokenizer) and exit")
    ap.add_argument("--tokenizer", type=Path, help="for --write_dataset: a dir with tokenizer.json")
    ap.add_argument("--prompt_tokens", type=int, default=96, help="for --write_dataset: tokens per prompt")
    ap.add_argument("--num_prompts", type=int, default=32)
    ap.add_argument("--rates", default="2,8,inf", help="requests/s, comma-separated; inf = all at once")
    ap.add_argument("--methods", default="none,draft,ngram")
    ap.add_argument("--max_tokens", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--output_json", type=Path)
    args = ap.parse_args()
    if args.write_dataset:
        write_dataset(args.write_dataset, args.tokenizer, args.num_prompts, args.prompt_tokens)
        return
    if not args.dataset or not (args.url or args.target):
        ap.error("give --dataset and --target (or --url)")
    prompts = read_dataset(args.dataset, args.num_prompts)
    proc, url = (None, args.url) if args.url else start_server(args)
    rows = []
    try:
        asyncio.run(run_rate(url, prompts[:2], [0.0, 0.0], args.methods.split(",")[0], 8, args.model))  # warm up
        for rate in [float(r) for r in args.rates.split(",")]:
            gaps = arrival_gaps(len(prompts), rate, args.seed)  # the same arrivals for every method
            for method in args.methods.split(","):
                print(f"method {method:<6} rate {rate:>5}: sending {len(prompts)} requests", flush=True)
                run = asyncio.run(run_rate(url, prompts, gaps, method, args.max_tokens, args.model))
                run.rate = rate
                s = run.summary()
                rows.append(s)
                errors = [r.error for r in run.records if not r.ok]
                failed = f", {len(errors)} failed: {errors[0]}" if errors else ""
                print(f"method {method:<6} rate {rate:>5}: {s['completed']} done in {s['duration_s']:.1f}s" + failed, flush=True)
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(30)
    print(table(rows))
    if args.output_json:
        sys.path.insert(0, str(HERE))
        from host import host_record

        record = {"args": {k: str(v) for k, v in vars(args).items()}, "host": host_record(bandwidth=False), "results": rows}
        args.output_json.write_text(json.dumps(record, indent=2) + "\n")
        chart(rows, args.output_json)


def chart(rows: list[dict], json_path: Path) -> None:
    """Each method's output throughput and median TPOT over the first method's (target-only) at the same rate."""
    from specdec.bench.plots import Bar, beside, write_bars

    base = {r["rate"]: r for r in rows if r["method"] == rows[0]["method"]}
    def label(r: dict) -> str:
        return f"{r['method']} @ {r['rate']:g}/s"
    panels = {"output tokens/s over " + rows[0]["method"]:
              [Bar(label(r), r["output_throughput"] / base[r["rate"]]["output_throughput"]) for r in rows],
              "median TPOT over " + rows[0]["method"]: [Bar(label(r), r["tpot_p50_ms"] / base[r["rate"]]["tpot_p50_ms"]) for r in rows]}
    if path := write_bars(beside(json_path), "specdec-serve under Poisson arrivals, one run per method and rate", panels, xlabel="ratio"):
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
