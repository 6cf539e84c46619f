"""A request-rate sweep of specdec-serve driven by guidellm: target-only against draft-target ``auto``.

guidellm (the vLLM project's load tester; it needs torch and transformers, so it goes in a venv of
its own, torch from the CPU index first: docs/benchmarks.md#serving-under-load prints the
commands) sends the requests: Poisson arrivals at each ``--rates`` value, streaming completions,
``ignore_eos`` so every request makes exactly ``--max_tokens`` tokens. This script starts ``specdec-serve`` (target + draft engine, or ``--url``
for a running one), writes guidellm's dataset, and runs one ``guidellm run`` per (repeat, rate,
method): the method rides in the body (guidellm's backend ``extras``), the arrivals come from the
same seed for both methods of a repeat, and the two methods alternate which goes first from one
repeat to the next, so each pair shares its stretch of machine load. Between runs it reads the
server's Prometheus counters (drafted and accepted tokens) and the server process's CPU time.

Per run, from guidellm's per-request records (its JSON output):

    TTFT        request sent -> first streamed token                        (guidellm: time_to_first_token_ms)
    TPOT        (last token - first token) / (tokens - 1), vLLM's TPOT      (guidellm: inter_token_latency_ms)
    throughput  output tokens / (first request sent -> last response done)

Printed and written (``--output_json``): medians with [min-max] over the repeats, the paired
auto / target-only ratios per repeat, the issue's goals judged, and ``--plot`` (PNG: throughput,
median TTFT and median TPOT against the rate, error bars = the repeats' spread). ``--methods`` adds
fixed draft lengths (``draft-4``) beside ``auto``; ``--report`` redraws an earlier sweep's JSON
(or the runs.jsonl a sweep keeps as it goes) without running anything.

``bench_load.py workloads ...`` runs the closed-loop workloads of load_workloads.py instead: a multi-turn
agentic and a shared-system-prompt chat workload at 1 to 64 streams, with and without prefix caching,
target-only and auto, llama.cpp's server beside them.

    python benchmarks/bench_load.py --target /tmp/load-pair/engine-target --draft /tmp/load-pair/engine-draft \\
        --guidellm /tmp/venv-guidellm/bin/guidellm --rates 0.1,0.3,1 --num_prompts 10,15,20 \\
        --max_tokens 32 --repeats 3 --plot /tmp/load-pair/load.png --output_json /tmp/load-pair/load.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import host  # noqa: E402
from bench_serving import start_server, write_dataset  # noqa: E402  (one server start, one dataset for both load generators)

# label -> the request's `speculative` field
METHODS = {"target-only": {"method": "none"}, "auto": {"method": "draft", "num_draft_tokens": "auto"}}


def method_body(label: str) -> dict:
    """A --methods label -> the request's `speculative` field: target-only, auto, or draft-K (a fixed draft length)."""
    if label in METHODS:
        return METHODS[label]
    if re.fullmatch(r"draft-[1-9]\d*", label):
        return {"method": "draft", "num_draft_tokens": int(label.split("-")[1])}
    raise SystemExit(f"--methods: unknown method {label!r}; expected target-only, auto or draft-K (K a draft length, e.g. draft-4)")
COUNTERS = ("spec_decode_num_drafts_total", "spec_decode_num_draft_tokens_total", "spec_decode_num_accepted_tokens_total")


# -- the server's side of each run -----------------------------------------------------------------
def read_counters(url: str) -> dict[str, float]:
    """The speculation counters from /metrics (summed over labels)."""
    text = urllib.request.urlopen(f"{url}/metrics", timeout=30).read().decode()
    out = dict.fromkeys(COUNTERS, 0.0)
    for line in text.splitlines():
        m = re.match(r"specdec:(\w+)(?:\{[^}]*\})? (\S+)$", line)
        if m and m.group(1) in out:
            out[m.group(1)] += float(m.group(2))
    return out


def cpu_seconds(pid: int | None) -> float:
    """User + system CPU seconds of a process (Linux /proc); nan when unknown."""
    if pid is None:
        return math.nan
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# -- one guidellm run ------------------------------------------------------------------------------
def guidellm_run(guidellm: str, url: str, dataset: Path, method: str, rate: float, count: int, seed: int, out: Path) -> None:
    backend = {
        "kind": "openai_http", "target": url, "request_format": "/v1/completions", "http2": False,
        "timeout": 1800, "extras": {"body": {"temperature": 0, "speculative": method_body(method)}},
    }
    cmd = [
        guidellm, "run", "--backend", json.dumps(backend), "--profile", f"kind=poisson,rate={rate}",
        "--constraint", f"kind=max_requests,count={count}", "--data", f"kind=json_file,path={dataset}",
        "--seed", f"kind=static,value={seed}", "--output", f"kind=json,path={out}", "--disable-console",
    ]
    # One worker process: the default spawns up to 10, each importing torch, on a machine whose
    # cores the server needs. One asyncio worker keeps up with these rates.
    env = {**os.environ, "GUIDELLM__MAX_WORKER_PROCESSES": "1", "GUIDELLM__LOGGING__LOG_FILE": str(out.with_suffix(".log"))}
    for attempt in (1, 2):
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=out.parent)
        if proc.returncode == 0 and out.exists():
            return
        # guidellm 0.8.1 once failed a 2-request run after its requests ("Cannot compile GenerativeMetrics: No
        # measurement start or end times available"): one retry, the same seed, so the run is the same run
        last = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or [""]
        print(f"guidellm failed ({proc.returncode}, attempt {attempt} of 2): {last[0]}", file=sys.stderr, flush=True)
    raise SystemExit(f"guidellm failed twice ({proc.returncode}): {(proc.stderr or proc.stdout)[-2000:]}")


def summarize(report: Path) -> dict:
    """Per-run figures from guidellm's per-request records (its JSON output: benchmarks[0].requests)."""
    try:
        bench = json.loads(report.read_text())["benchmarks"][0]
        requests = bench["requests"]
        ok, failed = requests["successful"], len(requests["errored"]) + len(requests["incomplete"])
        # guidellm 0.8.1 can stop with a request still in flight and leave it out of every list: counted as sent
        sent = max(bench.get("scheduler_state", {}).get("created_requests", 0), len(ok) + failed)
    except (KeyError, IndexError, TypeError, json.JSONDecodeError) as e:
        raise SystemExit(f"{report}: not a guidellm 0.8 JSON report (no benchmarks[0].requests.successful/errored/incomplete: {e!r})") from None
    ttft = [r["time_to_first_token_ms"] for r in ok if r["time_to_first_token_ms"] is not None]
    tpot = [r["inter_token_latency_ms"] for r in ok if r["inter_token_latency_ms"] is not None]
    tokens = sum(r["output_tokens"] or 0 for r in ok)
    start = min(r["request_start_time"] for r in ok) if ok else 0.0
    end = max(r["request_end_time"] for r in ok) if ok else 0.0

    def pct(xs: list[float], q: float) -> float:
        return float(np.percentile(xs, q)) if xs else math.nan

    return {
        "sent": sent, "completed": len(ok), "failed": failed, "output_tokens": tokens, "duration_s": end - start,
        "output_throughput": tokens / (end - start) if end > start else 0.0,
        "ttft_p50_ms": pct(ttft, 50), "ttft_p90_ms": pct(ttft, 90),
        "tpot_p50_ms": pct(tpot, 50), "tpot_p90_ms": pct(tpot, 90),
    }


# -- the sweep -------------------------------------------------------------------------------------
def sweep(args, url: str, server_pid: int | None, dataset: Path, work: Path) -> list[dict]:
    rows = []
    rates, counts = args.rates, args.num_prompts
    for label in args.methods:  # warm-up: each path's first calls (allocations, auto's cost lines), not recorded
        guidellm_run(args.guidellm, url, dataset, label, 4.0, 2, 0, work / f"warmup-{label}.json")
    for repeat in range(args.repeats):
        for rate, count in zip(rates, counts, strict=False):
            order = args.methods if repeat % 2 == 0 else args.methods[::-1]
            for label in order:
                report = work / f"r{repeat}-{rate}-{label}.json"
                before, cpu0, load0 = read_counters(url), cpu_seconds(server_pid), os.getloadavg()[0]
                print(f"repeat {repeat} rate {rate:g} {label:<11}: guidellm sends {count} requests", flush=True)
                guidellm_run(args.guidellm, url, dataset, label, rate, count, args.seed + repeat, report)
                after, cpu1, load1 = read_counters(url), cpu_seconds(server_pid), os.getloadavg()[0]
                d = {k: after[k] - before[k] for k in COUNTERS}
                row = {
                    "method": label, "rate": rate, "repeat": repeat, **summarize(report),
                    "mean_acceptance_length": 1 + d["spec_decode_num_accepted_tokens_total"] / d["spec_decode_num_drafts_total"]
                    if d["spec_decode_num_drafts_total"] else 1.0,
                    "drafted_per_round": d["spec_decode_num_draft_tokens_total"] / d["spec_decode_num_drafts_total"]
                    if d["spec_decode_num_drafts_total"] else 0.0,
                    "server_cpu_s": cpu1 - cpu0, "loadavg": (load0 + load1) / 2,
                }
                row["tokens_per_server_cpu_s"] = row["output_tokens"] / row["server_cpu_s"] if row["server_cpu_s"] > 0 else math.nan
                rows.append(row)
                with open(work / "runs.jsonl", "a") as f:  # kept as it goes: an interrupted sweep still has its runs
                    f.write(json.dumps(row) + "\n")
                print(f"repeat {repeat} rate {rate:g} {label:<11}: {row['completed']}/{row['sent']} done ({row['failed']} failed) in "
                      f"{row['duration_s']:.0f}s, {row['output_throughput']:.2f} tok/s, TTFT p50 {row['ttft_p50_ms']:.0f} ms, "
                      f"TPOT p50 {row['tpot_p50_ms']:.0f} ms, acc.len {row['mean_acceptance_length']:.2f}, "
                      f"k {row['drafted_per_round']:.2f}, load {row['loadavg']:.1f}", flush=True)
    return rows


# -- the report ------------------------------------------------------------------------------------
FIGURES = ("output_throughput", "ttft_p50_ms", "tpot_p50_ms", "tokens_per_server_cpu_s")


def aggregate(rows: list[dict]) -> list[dict]:
    """Per (rate, method): median and [min, max] over the repeats; ratios to target-only paired within a repeat."""
    out = []
    labels = list(dict.fromkeys(r["method"] for r in rows))
    for rate in sorted({r["rate"] for r in rows}):
        by = {m: {r["repeat"]: r for r in rows if r["rate"] == rate and r["method"] == m} for m in labels}
        for m, runs in by.items():
            if not runs:  # an interrupted sweep's runs.jsonl
                continue
            agg = {"rate": rate, "method": m, "repeats": len(runs), "failed": sum(r["failed"] for r in runs.values()),
                   "completed": sum(r["completed"] for r in runs.values()),
                   "sent": sum(r.get("sent", r["completed"] + r["failed"]) for r in runs.values())}
            for f in (*FIGURES, "mean_acceptance_length", "drafted_per_round", "loadavg"):
                xs = [r[f] for r in runs.values()]
                agg[f] = {"median": float(np.median(xs)), "min": float(np.min(xs)), "max": float(np.max(xs))}
            if m != "target-only":
                base = by["target-only"]
                for f in FIGURES:
                    ratios = [runs[i][f] / base[i][f] for i in runs if i in base and base[i][f]]
                    if not ratios:
                        continue
                    agg[f"{f}_ratio"] = {"median": float(np.median(ratios)), "min": float(np.min(ratios)), "max": float(np.max(ratios))}
            out.append(agg)
    return out


def fmt(x: dict, digits: int = 0) -> str:
    return f"{x['median']:.{digits}f} [{x['min']:.{digits}f}-{x['max']:.{digits}f}]"


def table(agg: list[dict]) -> str:
    lines = ["| rate (req/s) | method | done | output tok/s | TTFT p50 ms | TPOT p50 ms | tok per server CPU-s | acc. len | drafts/round "
             "| load avg |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for a in agg:
        lines.append(f"| {a['rate']:g} | {a['method']} | {a['completed']}/{a['sent']} | {fmt(a['output_throughput'], 2)} | {fmt(a['ttft_p50_ms'])} | "
                     f"{fmt(a['tpot_p50_ms'])} | {fmt(a['tokens_per_server_cpu_s'], 2)} | {a['mean_acceptance_length']['median']:.2f} | "
                     f"{a['drafted_per_round']['median']:.2f} | {a['loadavg']['median']:.1f} |")
    lines += ["", "| rate (req/s) | method / target-only: throughput | TTFT p50 | TPOT p50 | tok per server CPU-s |", "|---|---|---|---|---|"]
    for a in agg:
        if f"{FIGURES[0]}_ratio" in a:
            lines.append(f"| {a['rate']:g} | {a['method']}: " + " | ".join(fmt(a[f"{f}_ratio"], 2) for f in FIGURES) + " |")
    return "\n".join(lines) + "\n(median [min-max] over the repeats; ratios paired within a repeat)"


def goals(agg: list[dict], low_rates: int) -> list[str]:
    """The issue's two goals, judged on the medians over the repeats and their spread.

    Throughput: auto's median at or above target-only's lowest repeat (at least target-only's, within its spread).
    TPOT at the lowest `low_rates` rates: auto's median below target-only's (and whether it was lower in every
    repeat, from the paired ratios).
    """
    lines = []
    rates = sorted({a["rate"] for a in agg})
    get = {(a["rate"], a["method"]): a for a in agg}
    rates = [r for r in rates if (r, "auto") in get and (r, "target-only") in get and "output_throughput_ratio" in get[(r, "auto")]]
    for rate in rates:
        auto, base = get[(rate, "auto")], get[(rate, "target-only")]
        met = auto["output_throughput"]["median"] >= base["output_throughput"]["min"]
        lines.append(f"rate {rate:g}: throughput auto {fmt(auto['output_throughput'], 2)} vs target-only "
                     f"{fmt(base['output_throughput'], 2)} tok/s, paired ratio {fmt(auto['output_throughput_ratio'], 2)} -> "
                     f"{'met' if met else 'NOT met'} (auto's median at or above target-only's lowest repeat)")
    for rate in rates[:low_rates]:
        auto, base = get[(rate, "auto")], get[(rate, "target-only")]
        met = auto["tpot_p50_ms"]["median"] < base["tpot_p50_ms"]["median"]
        every = auto["tpot_p50_ms_ratio"]["max"] < 1.0
        lines.append(f"rate {rate:g}: median TPOT auto {fmt(auto['tpot_p50_ms'])} vs target-only {fmt(base['tpot_p50_ms'])} ms, "
                     f"paired ratio {fmt(auto['tpot_p50_ms_ratio'], 2)} -> {'met' if met else 'NOT met'} "
                     f"({'lower in every repeat' if every else 'not lower in every repeat'})")
    return lines


def plot(agg: list[dict], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [("output_throughput", "output tokens/s"), ("ttft_p50_ms", "median TTFT (ms)"), ("tpot_p50_ms", "median TPOT (ms)")]
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    for ax, (f, ylabel) in zip(axes, panels, strict=True):
        for m, style in zip(dict.fromkeys(a["method"] for a in agg), ("o-", "s--", "^:", "d-."), strict=False):
            pts = sorted((a for a in agg if a["method"] == m), key=lambda a: a["rate"])
            x = [a["rate"] for a in pts]
            y = np.array([a[f]["median"] for a in pts])
            err = np.array([[a[f]["median"] - a[f]["min"] for a in pts], [a[f]["max"] - a[f]["median"] for a in pts]])
            ax.errorbar(x, y, yerr=err, fmt=style, capsize=3, label=m)
        ax.set_xscale("log")
        ax.set_xticks(x, [f"{r:g}" for r in x])
        ax.minorticks_off()
        ax.set_xlabel("request rate (req/s, Poisson)")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
    axes[0].legend()
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    tmp = path.with_suffix(".tmp.png")
    fig.savefig(tmp, dpi=110)
    tmp.replace(path)


def parse_list(text: str, kind: type, flag: str) -> list:
    """'0.1,0.3,1' -> [0.1, 0.3, 1.0]: positive numbers, or one line saying what was wrong."""
    try:
        values = [kind(x) for x in text.split(",")]
    except ValueError:
        raise SystemExit(f"{flag} {text!r}: expected comma-separated positive {kind.__name__}s, e.g. {flag} "
                         f"{'0.1,0.3,1' if kind is float else '10,15,20'}") from None
    if not values or any(not (v > 0 and math.isfinite(v)) for v in values):
        raise SystemExit(f"{flag} {text!r}: every value must be a positive finite number")
    return values


def check_args(ap: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Everything a sweep needs, checked before a server starts (a sweep runs for half an hour)."""
    args.rates = parse_list(args.rates, float, "--rates")
    args.methods = [m.strip() for m in args.methods.split(",")]
    for label in args.methods:
        method_body(label)
    if "target-only" not in args.methods or len(set(args.methods)) != len(args.methods) or len(args.methods) < 2:
        ap.error(f"--methods {','.join(args.methods)}: give target-only (what the others are compared with) and at least one other, each once")
    counts = parse_list(args.num_prompts, int, "--num_prompts")
    if len(counts) not in (1, len(args.rates)):
        ap.error(f"--num_prompts gives {len(counts)} counts for {len(args.rates)} rates: give one, or one per rate")
    args.num_prompts = counts * len(args.rates) if len(counts) == 1 else counts
    for flag in ("max_tokens", "repeats", "prompt_tokens"):
        if getattr(args, flag) < 1:
            ap.error(f"--{flag} must be at least 1, got {getattr(args, flag)}")
    if args.report:
        return
    if not (args.url or (args.target and args.draft)):
        ap.error("give --target and --draft (or --url of a server with a draft loaded)")
    for flag in ("target", "draft"):
        if getattr(args, flag) and not (Path(getattr(args, flag)) / "config.json").is_file():
            ap.error(f"--{flag} {getattr(args, flag)}: not an engine directory (no config.json); build one with specdec-build")
    if args.dataset and not args.dataset.is_file():
        ap.error(f"--dataset {args.dataset}: no such file")
    if not shutil.which(args.guidellm):
        ap.error(f"guidellm not found at {args.guidellm!r}: install guidellm==0.8.1 in a venv of its own (torch's CPU build first, "
                 "docs/benchmarks.md#serving-under-load) and pass --guidellm /path/to/venv/bin/guidellm")


def read_runs(path: Path) -> tuple[list[dict], dict]:
    """The runs of an earlier sweep and its arguments: its --output_json, or the runs.jsonl it kept as it went."""
    try:
        if path.suffix == ".jsonl":
            return [json.loads(line) for line in path.read_text().splitlines() if line.strip()], {}
        saved = json.loads(path.read_text())
        return saved["runs"], saved.get("args", {})
    except (OSError, KeyError, TypeError, json.JSONDecodeError) as e:
        raise SystemExit(f"--report {path}: expected a bench_load.py --output_json file or a runs.jsonl ({e!r})") from None


def report(args: argparse.Namespace, rows: list[dict], note: str, sweep_args: dict | None = None) -> None:
    agg = aggregate(rows)
    print(table(agg))
    print("\n".join(goals(agg, args.low_rates)))
    if note:
        print(note)
    plot_path = args.plot or (args.output_json.with_suffix(".png") if args.output_json else None)  # the chart goes beside the JSON
    if plot_path:
        max_tokens = (sweep_args or {}).get("max_tokens", args.max_tokens)
        plot(agg, plot_path, f"specdec-serve under guidellm: target-only vs draft-target auto ({max_tokens} tokens per request, "
                             f"{len({r['repeat'] for r in rows})} repeats, median and min-max)")
    if args.output_json:
        tmp = args.output_json.with_suffix(".tmp")
        swept = sweep_args or {k: str(v) for k, v in vars(args).items()}  # a --report keeps the sweep's own arguments
        tmp.write_text(json.dumps({"args": swept, "host": host.host_record(bandwidth=False), "runs": rows, "summary": agg}, indent=1) + "\n")
        tmp.replace(args.output_json)


def main() -> None:
    if sys.argv[1:2] == ["workloads"]:  # closed-loop streams: prefix caching and auto at 1-64 streams (load_workloads.py)
        from load_workloads import main as workloads

        workloads(sys.argv[2:])
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", help="target engine dir (a server is started with it)")
    ap.add_argument("--draft", help="draft engine dir (needed for auto)")
    ap.add_argument("--num_threads", type=int, default=None, help="the server's --num_threads")
    ap.add_argument("--url", help="sweep a running specdec-serve (with a draft loaded) instead of starting one")
    ap.add_argument("--guidellm", default=shutil.which("guidellm") or "guidellm", help="the guidellm executable [default: on PATH]")
    ap.add_argument("--dataset", type=Path, help=".jsonl with a 'prompt' per line [default: written from the stdlib, needs --tokenizer or --target]")
    ap.add_argument("--tokenizer", type=Path, help="for the written dataset: a dir with tokenizer.json [default: --target]")
    ap.add_argument("--prompt_tokens", type=int, default=96)
    ap.add_argument("--rates", default="0.1,0.3,1", help="requests/s, comma-separated")
    ap.add_argument("--num_prompts", default="10,15,20", help="requests per run: one count, or one per rate")
    ap.add_argument("--max_tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--methods", default="target-only,auto", help="comma-separated: target-only, auto, draft-K (a fixed K)")
    ap.add_argument("--low_rates", type=int, default=1, help="how many of the lowest rates the TPOT goal applies to")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--plot", type=Path, help="PNG of throughput, TTFT and TPOT against the rate [default: beside --output_json]")
    ap.add_argument("--output_json", type=Path)
    ap.add_argument("--report", type=Path, help="no sweep: the table, goals and plot of an earlier sweep's --output_json (or runs.jsonl)")
    args = ap.parse_args()
    check_args(ap, args)
    if args.report:
        rows, sweep_args = read_runs(args.report)
        report(args, rows, "", sweep_args)
        return
    work = Path(tempfile.mkdtemp(prefix="bench-load-"))
    prompts = work / "prompts.jsonl"
    if args.dataset:
        shutil.copy(args.dataset, prompts)
    else:
        write_dataset(prompts, args.tokenizer or Path(args.target), max(args.num_prompts), args.prompt_tokens)
    # guidellm reads `output_tokens_count` as the request's max_tokens and then sets ignore_eos
    dataset = work / "guidellm.jsonl"
    with open(dataset, "w") as f:
        for line in prompts.read_text().splitlines():
            if line.strip():
                f.write(json.dumps({"prompt": json.loads(line)["prompt"], "output_tokens_count": args.max_tokens}) + "\n")
    if args.url:
        proc, url = None, args.url.rstrip("/")
    else:
        server_args = argparse.Namespace(target=args.target, draft=args.draft, draft_len=4, ngram_config=None, num_threads=args.num_threads)
        proc, url = start_server(server_args)
    started = time.time()
    try:
        rows = sweep(args, url, proc.pid if proc else None, dataset, work)
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(30)
    report(args, rows, f"sweep: {(time.time() - started) / 60:.1f} min; guidellm reports in {work}")


if __name__ == "__main__":
    main()
