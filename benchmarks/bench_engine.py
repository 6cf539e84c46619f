"""The request-level engine, measured: batch-1 regression, concurrency, draft_len=auto.

    # batch 1: this tree against an earlier commit (a git worktree), same engines, interleaved
    python benchmarks/bench_engine.py regression --target T --draft D --base_ref eb86230
    # 1, 2, 4, 8 concurrent request streams with staggered arrivals: output tokens/s, mean TTFT
    python benchmarks/bench_engine.py concurrency --target T --draft D --streams 1,2,4,8
    # draft_len=auto against every fixed draft length, ordinary and copy-heavy prompts
    python benchmarks/bench_engine.py auto --target T --draft D --draft_lens 1,2,3,4,6,8

Every figure to read is a ratio or a comparison measured side by side in one
run: methods interleaved, repeated ``--rounds`` times; the median and the
spread (min-max) are printed. Absolute tokens/s swing with the machine.
Prompts: benchmarks/prompts.py (functions of the standard library files the
demo pair never trained on), encoded with the target engine's tokenizer.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

# A worker decodes the same requests with one version of specdec: it reads one JSON command per
# line and answers with one JSON line. It only uses the API both cores share (load_orchestrator,
# generate), so an older commit runs it unchanged.
WORKER = r'''
import json, sys, time
from specdec.runtime import load_orchestrator, GenerationConfig, DraftTargetConfig, NGramConfig
target, draft, threads = sys.argv[1], sys.argv[2], int(sys.argv[3])
base = load_orchestrator(target, num_threads=threads)
orchs = {}
def orch(method, k, n):
    key = (method, k, n)
    if key not in orchs:
        if method == "draft":
            orchs[key] = load_orchestrator(target, draft, DraftTargetConfig(k, [0], [0], False), num_threads=threads, target_executor=base.target)
        elif method == "ngram":
            orchs[key] = load_orchestrator(target, ngram=NGramConfig(k, n, [0]), num_threads=threads, target_executor=base.target)
        else:
            orchs[key] = base
    return orchs[key]
print(json.dumps({"ready": True}), flush=True)
for line in sys.stdin:
    cmd = json.loads(line)
    o = orch(cmd["method"], cmd.get("k", 0), cmd.get("n", 2))
    cfg = GenerationConfig(max_output_len=cmd["tokens"])
    o.generate([cmd["prompts"][0][:8]], GenerationConfig(max_output_len=4))  # warm this configuration
    tokens, seconds, cpu, outs = 0, 0.0, 0.0, []
    for p in cmd["prompts"]:  # batch 1, one request after another
        t, c = time.perf_counter(), time.process_time()
        out, m = o.generate([p], cfg)
        seconds += time.perf_counter() - t
        cpu += time.process_time() - c
        tokens += len(out[0].output_ids)
        outs.append(out[0].output_ids)
    print(json.dumps({"tokens_per_s": tokens / seconds, "tokens_per_cpu_s": tokens / cpu, "outputs": outs}), flush=True)
'''


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.3f} [{min(values):.3f}-{max(values):.3f}]"


def write_json(args, figures: dict[str, dict[str, list[float]]], title: str, xlabel: str) -> None:
    """--json: every round's figure per panel and method, and the chart beside it (bench/plots.py)."""
    if not args.json:
        return
    import host

    from specdec.bench.plots import Bar, beside, write_bars

    Path(args.json).write_text(json.dumps({"args": vars(args), "host": host.host_record(bandwidth=False), "rounds": figures}, indent=1) + "\n")
    panels = {panel: [Bar(m, statistics.median(v), min(v), max(v)) for m, v in rows.items()] for panel, rows in figures.items()}
    if path := write_bars(beside(args.json), title, panels, xlabel):
        print(f"wrote {args.json} and {path}")


def prompts_for(target: Path, n: int, tokens: int, copy_heavy: bool) -> list[list[int]]:
    from prompts import code_prompts

    return code_prompts(target, n, tokens, copy_heavy)


# -- batch-1 regression -------------------------------------------------------------------
def package_of(ref: str) -> Path:
    """A folder whose `specdec` package is the tree at ``ref`` (a git worktree, linked the way pyproject maps it)."""
    root = Path(tempfile.mkdtemp(prefix="specdec-ref-"))
    tree = root / "tree"
    subprocess.run(["git", "-C", str(HERE.parent), "worktree", "add", "--detach", "-q", str(tree), ref], check=True)
    pkg = root / "pkg" / "specdec"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    for sub in sorted(p for p in tree.iterdir() if (p / "__init__.py").is_file()):  # every subpackage (formats/, hardware/ too)
        (pkg / sub.name).symlink_to(sub)
    return root / "pkg"


class Worker:
    def __init__(self, pythonpath: Path | None, target: str, draft: str, threads: int):
        env = dict(os.environ)
        if pythonpath is not None:
            env["PYTHONPATH"] = str(pythonpath)
        self.p = subprocess.Popen([sys.executable, "-c", WORKER, target, draft, str(threads)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  text=True, env=env, cwd="/")
        assert json.loads(self.p.stdout.readline())["ready"]

    def run(self, **cmd) -> dict:
        self.p.stdin.write(json.dumps(cmd) + "\n")
        self.p.stdin.flush()
        return json.loads(self.p.stdout.readline())

    def close(self) -> None:
        self.p.stdin.close()
        self.p.wait()


def regression(args) -> None:
    base_pkg = package_of(args.base_ref)
    try:
        _regression(args, base_pkg)
    finally:  # the worktree is this run's scratch: leave no registered worktree behind
        subprocess.run(["git", "-C", str(HERE.parent), "worktree", "remove", "--force", str(base_pkg.parent / "tree")], check=False)
        shutil.rmtree(base_pkg.parent, ignore_errors=True)


def _regression(args, base_pkg: Path) -> None:
    new = Worker(None, args.target, args.draft, args.threads)
    old = Worker(base_pkg, args.target, args.draft, args.threads)
    try:
        _interleave(args, new, old)
    finally:
        new.close()
        old.close()


def _interleave(args, new: Worker, old: Worker) -> None:
    prompts = prompts_for(Path(args.target), args.prompts, args.prompt_tokens, copy_heavy=False)
    copy = prompts_for(Path(args.target), args.prompts, args.prompt_tokens, copy_heavy=True)
    methods = [("target-only", dict(method="none", prompts=prompts)), (f"draft-target k={args.k}", dict(method="draft", k=args.k, prompts=prompts)),
               (f"ngram k={args.ngram_k} n=3 (copy-heavy)", dict(method="ngram", k=args.ngram_k, n=3, prompts=copy))]
    ratios: dict[str, list[float]] = {name: [] for name, _ in methods}
    cpu_ratios: dict[str, list[float]] = {name: [] for name, _ in methods}
    same: dict[str, bool] = {name: True for name, _ in methods}
    for r in range(args.rounds):
        for name, cmd in methods:
            pair = [(old, "old"), (new, "new")] if r % 2 == 0 else [(new, "new"), (old, "old")]  # ABBA
            res = {tag: w.run(tokens=args.tokens, **cmd) for w, tag in pair}
            ratios[name].append(res["new"]["tokens_per_s"] / res["old"]["tokens_per_s"])
            cpu_ratios[name].append(res["new"]["tokens_per_cpu_s"] / res["old"]["tokens_per_cpu_s"])
            same[name] &= res["new"]["outputs"] == res["old"]["outputs"]
        print(f"round {r + 1}/{args.rounds}: " + ", ".join(f"{n} {v[-1]:.3f}" for n, v in ratios.items()), flush=True)
    print(f"\nnew core / {args.base_ref} at batch 1 (median [min-max] of {args.rounds} interleaved rounds; goal >= 0.97)")
    print("  tokens per wall second, and per CPU second of the process (with --threads 1 the CPU time is the work")
    print("  done, not the waiting for a core a busy machine adds):")
    for name, v in ratios.items():
        print(f"  {name:<36} wall {spread(v)}   CPU {spread(cpu_ratios[name])}   outputs identical: {'yes' if same[name] else 'NO'}")
    write_json(args, {"per wall second": ratios, "per CPU second": cpu_ratios}, f"this tree / {args.base_ref}, batch 1",
               f"tokens/s over {args.base_ref}'s")


# -- concurrency ----------------------------------------------------------------------------
def concurrency(args) -> None:
    from specdec.runtime import DraftTargetConfig, GenerationConfig, NGramConfig, load_engine

    prompts = prompts_for(Path(args.target), args.prompts, args.prompt_tokens, copy_heavy=False)
    engines = {"target-only": load_engine(args.target, num_threads=args.threads)}
    tex = engines["target-only"].target
    if args.draft:
        engines[f"draft-target k={args.k}"] = load_engine(args.target, args.draft, DraftTargetConfig(args.k, [0], [0], False),
                                                          num_threads=args.threads, target_executor=tex)
    engines[f"ngram k={args.ngram_k} n=3"] = load_engine(args.target, ngram=NGramConfig(args.ngram_k, 3, [0]), num_threads=args.threads,
                                                         target_executor=tex)
    if args.auto:  # draft_len=auto beside each fixed k
        if args.draft:
            engines["draft-target auto"] = load_engine(args.target, args.draft, DraftTargetConfig(args.ngram_k, [0], [0], False),
                                                       num_threads=args.threads, target_executor=tex, draft_len="auto")
        engines["ngram auto n=3"] = load_engine(args.target, ngram=NGramConfig(args.ngram_k, 3, [0]), num_threads=args.threads, target_executor=tex,
                                                draft_len="auto")
    streams_list = [int(s) for s in args.streams.split(",")]
    cfg = GenerationConfig(max_output_len=args.tokens)
    results: dict[tuple[str, int], list[tuple[float, float]]] = {}
    for r in range(args.rounds):
        for streams in streams_list:
            for name, engine in engines.items():
                results.setdefault((name, streams), []).append(drive(engine, prompts, cfg, streams, args.requests_per_stream, args.stagger_ms / 1e3))
        print(f"round {r + 1}/{args.rounds} done", flush=True)
    print(f"\n{args.requests_per_stream} requests per stream, {args.tokens} output tokens each, streams start {args.stagger_ms} ms apart "
          f"(median [min-max] of {args.rounds} rounds)")
    print(f"{'method':<22}{'streams':>8}  {'output tokens/s':>26}  {'mean TTFT ms':>26}")
    for (name, streams), v in results.items():
        tps = [a for a, _ in v]
        ttft = [b * 1e3 for _, b in v]
        print(f"{name:<22}{streams:>8}  {spread(tps):>26}  {spread(ttft):>26}")
    write_json(args, {f"{s} streams": {name: [a / b for (a, _), (b, _) in zip(results[(name, s)], results[("target-only", s)], strict=False)]
                                       for name in engines}
                      for s in streams_list}, "output tokens/s over target-only per concurrency", "speed over target-only")


def drive(engine, prompts, cfg, streams: int, per_stream: int, stagger: float) -> tuple[float, float]:
    """Closed-loop clients: stream i starts i * stagger after the first and sends its next
    request when the previous one ends. Returns (total output tokens/s, mean TTFT)."""
    start = time.perf_counter()
    owner: dict[str, int] = {}
    sent = [0] * streams
    ttfts: list[float] = []
    tokens = 0

    def send(i: int) -> None:
        rid = engine.add_request(prompts[(i * per_stream + sent[i]) % len(prompts)], cfg)
        owner[rid] = i
        sent[i] += 1

    started = 0
    while True:
        now = time.perf_counter() - start
        while started < streams and now >= started * stagger:
            send(started)
            started += 1
        if not engine.has_unfinished():
            if started == streams:
                break
            time.sleep(max(started * stagger - now, 0))
            continue
        for o in engine.step():
            if o.finished:
                i = owner.pop(o.request_id)
                tokens += len(o.output_ids)
                ttfts += o.metrics.ttft_s
                if sent[i] < per_stream:
                    send(i)
    return tokens / (time.perf_counter() - start), statistics.mean(ttfts)


# -- draft_len=auto --------------------------------------------------------------------------
def auto(args) -> None:
    from specdec.runtime import DraftTargetConfig, GenerationConfig, NGramConfig, load_orchestrator

    base = load_orchestrator(args.target, num_threads=args.threads)
    tex = base.target
    lens = [int(k) for k in args.draft_lens.split(",")]
    workloads = {"ordinary": prompts_for(Path(args.target), args.prompts, args.prompt_tokens, False),
                 "copy-heavy": prompts_for(Path(args.target), args.prompts, args.prompt_tokens, True)}
    methods: dict[str, dict] = {}
    for kind in (["draft"] if args.draft else []) + ["ngram"]:
        for k in lens + ["auto"]:
            if kind == "draft":
                o = load_orchestrator(args.target, args.draft, DraftTargetConfig(max(lens), [0], [0], False), num_threads=args.threads,
                                      target_executor=tex, draft_len=k)
            else:
                o = load_orchestrator(args.target, ngram=NGramConfig(max(lens), 3, [0]), num_threads=args.threads, target_executor=tex, draft_len=k)
            methods[f"{kind} k={k}"] = {"orch": o, "kind": kind}
    cfg = GenerationConfig(max_output_len=args.tokens)
    figures: dict[str, dict[str, list[float]]] = {}
    for name, prompts in workloads.items():
        speed: dict[str, list[float]] = {m: [] for m in methods}
        figures[name] = speed
        for r in range(args.rounds):
            t_base = timed(base, prompts, cfg)
            for m, spec in methods.items():
                speed[m].append(timed(spec["orch"], prompts, cfg) / t_base)
            print(f"{name}: round {r + 1}/{args.rounds} done", flush=True)
        print(f"\n{name} prompts: speedup over target-only (median [min-max] of {args.rounds} interleaved rounds)")
        for kind in ("draft", "ngram"):
            rows = {m: v for m, v in speed.items() if methods[m]["kind"] == kind}
            if not rows:
                continue
            best = max((m for m in rows if not m.endswith("auto")), key=lambda m: statistics.median(rows[m]))
            for m, v in rows.items():
                mark = "  <- best fixed" if m == best else ""
                print(f"  {m:<16} {spread(v)}{mark}")
            a = statistics.median(rows[f"{kind} k=auto"]) / statistics.median(rows[best])
            print(f"  auto / best fixed = {a:.3f}")
    write_json(args, figures, "draft_len=auto against every fixed draft length, batch 1", "speed over target-only")


def timed(orch, prompts, cfg) -> float:
    """Output tokens/s over the prompts at batch 1."""
    tokens, seconds = 0, 0.0
    for p in prompts:
        t = time.perf_counter()
        out, _ = orch.generate([p], cfg)
        seconds += time.perf_counter() - t
        tokens += len(out[0].output_ids)
    return tokens / seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("regression", "concurrency", "auto"):
        p = sub.add_parser(name)
        p.add_argument("--target", required=True, help="target engine dir (built with --max_draft_len >= the draft lengths used)")
        p.add_argument("--draft", default="", help="draft engine dir")
        p.add_argument("--threads", type=int, default=2)
        p.add_argument("--rounds", type=int, default=5)
        p.add_argument("--prompts", type=int, default=4)
        p.add_argument("--prompt_tokens", type=int, default=64)
        p.add_argument("--tokens", type=int, default=96, help="output tokens per request")
        p.add_argument("--k", type=int, default=3, help="draft-target draft length")
        p.add_argument("--ngram_k", type=int, default=8, help="n-gram draft length")
        p.add_argument("--json", help="write every round's figures here, and their chart beside it (.png)")
    sub.choices["regression"].add_argument("--base_ref", default="eb86230", help="the commit to compare against")
    sub.choices["concurrency"].add_argument("--streams", default="1,2,4,8")
    sub.choices["concurrency"].add_argument("--requests_per_stream", type=int, default=3)
    sub.choices["concurrency"].add_argument("--stagger_ms", type=float, default=20.0)
    sub.choices["concurrency"].add_argument("--auto", action="store_true", help="also draft_len=auto for each method")
    sub.choices["auto"].add_argument("--draft_lens", default="1,2,3,4,6,8")
    args = ap.parse_args()
    {"regression": regression, "concurrency": concurrency, "auto": auto}[args.cmd](args)


if __name__ == "__main__":
    main()
