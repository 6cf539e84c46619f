"""specdec on an NVIDIA GPU (ONNX Runtime's CUDA provider): step costs against the HBM floor, every method at
batch 1/4/16 against its bound and against Hugging Face static-cache + torch.compile.

    python benchmarks/enlarge.py --preset llama8b --dtype bfloat16 examples/demo-pair/target /tmp/g/target
    python benchmarks/enlarge.py --preset llama1b --dtype bfloat16 examples/demo-pair/draft /tmp/g/draft
    python benchmarks/enlarge.py --heads examples/demo-pair/heads/eagle --base /tmp/g/target /tmp/g/eagle
    python benchmarks/bench_gpu.py --target /tmp/g/target --draft /tmp/g/draft --eagle /tmp/g/eagle --work /tmp/g/engines \\
        --int4 --json /tmp/g/gpu.json --budget_s 540

(benchmarks/gpu_session.sh runs exactly this on a GPU host in one go; docs/benchmarks.md has the figures.)

Engines are built into --work unless already there (a second run, or a second call on a warm host, resumes):
the target in bfloat16 with the ort_cuda lowering (its masked attention: one call per verification round at
any batch, trees), as an EAGLE target when --eagle is given (it also serves target-only, draft-target and
n-gram); --int4 also an int4 weight-only target; --medusa a Medusa target; the draft with ort_cuda (GQA).
Each build runs as its own specdec-build process: its wall time and peak memory are reported.

Sections, each skipped (and said so in the JSON) once --budget_s is spent; the JSON is rewritten after each:

1. HBM bandwidth (a 1 GiB device-to-device copy) and each engine's floor = weight bytes / bandwidth.
2. ms per step for 1 and k+1 new tokens at batch 1/4/16, context ~200, CUDA graphs on; the draft's step;
   kernels per step and GPU kernel time (CUPTI via torch.profiler) with and without CUDA graphs; whether
   k+1 tokens in one call give the logits of k+1 one-token calls (the greedy exactness condition).
3. Decoding, greedy, exactly --max_new_tokens per prompt, at each batch size: target-only, draft-target
   (each --draft_lens and auto), n-gram, EAGLE tree and chain, Medusa tree: methods interleaved, --repeats
   rounds, tokens/s median (min-max), speedup over target-only at that batch in the same round, the bound
   from the measured acceptance and step costs
       (1 + accepted / rounds) / (t_b(1 + drafted / rounds) / t_b(1) + draft_s_per_step / t_b(1)),
   t_b(w) the target step of w tokens at batch b, draft_s_per_step the drafter's measured time per batch step,
   and whether every output is target-only's (same engine, same batch) and batch 1's.
4. Hugging Face on the same GPU, bfloat16: greedy with a static cache and torch.compile at each batch size,
   assisted generation (k = 4) at batch 1.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from gpu_steps import graph_nodes, hbm_bandwidth, kernel_profile, step_ms, weight_bytes  # noqa: E402
from prompts import code_prompts, spread  # noqa: E402

TREE = "[[0],[1],[2],[0,0],[0,1],[1,0],[0,0,0],[0,0,1]]"  # 8 nodes, as benchmarks/bench_heads.py
LIMITS = dict(max_input_len=256, max_seq_len=512)


class Budget:
    """Wall-clock budget: sections start only while time is left."""

    def __init__(self, seconds: float):
        self.t0, self.seconds = time.perf_counter(), seconds

    def left(self) -> float:
        return self.seconds - (time.perf_counter() - self.t0)


def build(name: str, ckpt: str, out: Path, flags: list[str], res: dict, budget: Budget,
          backend: tuple[str, ...] = ("--lowering", "ort_cuda")) -> bool:
    """specdec-build in a process of its own (its peak memory is its own); skipped if ``out`` holds an engine.
    backend: the flags that say which engine (ort_cuda's lowering, or --backend torch)."""
    rec = res.setdefault("builds", {})
    if (out / "config.json").is_file():
        rec.setdefault(name, {"reused": True})
        return True
    if budget.left() < 60:
        rec[name] = {"skipped": "budget"}
        return False
    cmd = [sys.executable, "-m", "specdec.cli.build", "--model_dir", ckpt, "--output_dir", str(out), *backend, "--force",
           "--max_input_len", str(LIMITS["max_input_len"]), "--max_seq_len", str(LIMITS["max_seq_len"]), *flags]
    t = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out_text = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)  # this child's own rusage: its peak RSS
    proc.returncode = os.waitstatus_to_exitcode(status)
    ok = proc.returncode == 0
    rec[name] = {"seconds": time.perf_counter() - t, "peak_rss_gib": usage.ru_maxrss / 2**20, "flags": flags, "ok": ok,
                 "engine_gb": sum(f.stat().st_size for f in out.rglob("*") if f.is_file()) / 1e9 if ok else None}
    print(f"built {name} in {rec[name]['seconds']:.0f} s, peak RSS {rec[name]['peak_rss_gib']:.1f} GiB" if ok
          else f"build of {name} failed:\n{out_text[-2000:]}", flush=True)
    return ok


def open_cuda(path: Path):
    from specdec.formats.engine_format import load_engine_dir
    from specdec.runtime.backends import Placement, open_executor

    return open_executor(load_engine_dir(path), Placement("cuda", 0))


def section(res: dict, name: str, budget: Budget, need_s: float, run: Callable[[], Any], out: Path | None) -> None:
    if budget.left() < need_s:
        res[name] = {"skipped": f"budget ({budget.left():.0f} s left, needs about {need_s:.0f})"}
        print(f"-- {name}: skipped, budget", flush=True)
    else:
        print(f"-- {name}: starting ({budget.left():.0f} s of budget left)", flush=True)
        t = time.perf_counter()
        try:
            res[name] = run()
        except Exception as err:  # a section that fails on this host is reported, the others still run
            res[name] = {"error": f"{type(err).__name__}: {err}"}
            print(f"-- {name}: {type(err).__name__}: {err}", flush=True)
        print(f"-- {name}: {time.perf_counter() - t:.0f} s", flush=True)
    if out:
        out.write_text(json.dumps(res, indent=2, default=_jsonable) + "\n")


def _jsonable(x: Any) -> Any:
    return x.tolist() if isinstance(x, np.ndarray) else float(x) if isinstance(x, np.floating) else str(x)


def steps_section(engines: dict, batches: list[int], widths: list[int], bw: float) -> dict:
    out: dict = {}
    for name, (ex, path) in engines.items():
        floor = weight_bytes(path) / bw * 1e3
        ws = [1] if name == "draft" else widths
        table = {b: {w: step_ms(ex, b, w, reps=50) for w in ws} for b in batches}
        out[name] = {"weight_gb": weight_bytes(path) / 1e9, "floor_ms": floor, "step_ms": table,
                     "step_over_floor_batch1": table[batches[0]][1] / floor}
        widths = "; ".join(f"b={b}: " + " ".join(f"w{w} {v:.3f}" for w, v in t.items()) for b, t in table.items())
        print(f"{name:<10} floor {floor:.3f} ms; " + widths, flush=True)
    return out


def profile_section(engines: dict, kmax: int) -> dict:
    out: dict = {}
    for name, (ex, path) in engines.items():
        out[f"{name} graph nodes"] = nodes = graph_nodes(path)
        print(f"{name:<10} {nodes['per_layer']} graph nodes per layer ({nodes['layer_ops']}), {nodes['outside_layers']} outside", flush=True)
        runs = [(f"{name} w={w} graphs", ex, w) for w in ([1] if name == "draft" else [1, kmax + 1])]
        runs.append((f"{name} w=1 no graphs", _reopen(path, cuda_graphs=False), 1))
        for key, runner, w in runs:
            try:  # CUPTI may be missing on a host: say so and keep the other figures
                out[key] = kernel_profile(runner, 1, w)
            except Exception as err:
                out[key] = {"error": f"{type(err).__name__}: {err}"}
        del runs
    for k, v in out.items():
        if v and "kernels_per_step" in v:
            print(f"{k:<28} {v['kernels_per_step']:.0f} kernels/step, {v['kernel_ms_per_step']:.3f} ms of kernels", flush=True)
    return out


def _reopen(path: Path, **kw):
    from specdec.formats.engine_format import load_engine_dir
    from specdec.runtime.backends.onnxruntime.cuda import CudaExecutor

    return CudaExecutor(load_engine_dir(path), 0, **kw)


def verify_vs_steps(ex, kmax: int) -> dict:
    """k+1 tokens in one call against k+1 one-token calls, batch 1 at context 100: greedy exactness needs equal argmax."""
    prompt, toks = list(range(10, 110)), [11, 12, 13, 14, 15, 16, 17, 18, 19][: kmax + 1]
    one = ex.new_cache(1)
    ex.forward(one, [prompt], all_logits=False)
    wide = ex.forward(one, [toks], all_logits=True).logits[0].copy()
    seq = ex.new_cache(1)
    ex.forward(seq, [prompt], all_logits=False)
    narrow = np.stack([ex.forward(seq, [[t]], all_logits=True).logits[0, 0].copy() for t in toks])
    return {"max_abs_diff": float(np.abs(wide - narrow).max()), "argmax_equal": bool((wide.argmax(-1) == narrow.argmax(-1)).all())}


def decode_section(methods: dict, prompts: list[list[int]], batches: list[int], n_new: int, repeats: int, steps: dict, budget: Budget) -> dict:
    from specdec.runtime.orchestrator import GenerationConfig

    cfg = GenerationConfig(max_output_len=n_new)
    out: dict = {}
    for b in batches:
        if budget.left() < 30:
            out[str(b)] = {"skipped": "budget"}
            continue
        runs: dict[str, list[dict]] = {m: [] for m in methods}
        for r in range(repeats + 1):  # round 0 warms every method up (CUDA graph capture) and is not kept
            order = list(methods) if r % 2 else list(methods)[::-1]
            for name in order:
                runs[name].append(_run(methods[name][0], prompts, b, cfg))
            print(f"   batch {b}: {'warm-up round' if r == 0 else f'round {r}/{repeats}'} done", flush=True)
        out[str(b)] = _summarize({m: v[1:] for m, v in runs.items()}, {m: ref for m, (_, ref) in methods.items()}, steps, b, n_new)
        first = out.get(str(batches[0]), {})
        for name, row in out[str(b)].items():  # the same engine at batch 1 (half precision: a GEMM's kernel can change with the batch)
            ids = first.get(name, {}).get("output_ids")
            row["identical_to_batch1"] = sum(a == c for a, c in zip(row["output_ids"], ids, strict=False)) if ids else None
        _print_batch(b, out[str(b)])
    return out


def _run(orch, prompts: list[list[int]], b: int, cfg) -> dict:
    t, ids, m = time.perf_counter(), [], {"drafted": 0, "accepted": 0, "rounds": 0, "draft_s": 0.0, "decide_s": 0.0, "other_s": 0.0}
    for lo in range(0, len(prompts), b):
        outs, metrics = orch.generate(prompts[lo : lo + b], cfg)
        ids += [o.output_ids for o in outs]
        for k in m:  # the drafters' time in the rounds: not their passes over the prompts (Metrics.round_draft_s)
            m[k] += metrics.round_draft_s if k == "draft_s" else getattr(metrics, k)
    return {"s": time.perf_counter() - t, "ids": ids, **m}


def _summarize(runs: dict[str, list[dict]], refs: dict[str, str], steps: dict, b: int, n_new: int) -> dict:
    """Per method: tokens/s and speedup over target-only (the bf16 target's: the figure users compare) as median
    (min-max) over rounds, the bound, and its outputs against its own engine's target-only (``refs``)."""
    base = runs["target-only"]
    t = steps.get("target", {}).get("step_ms", {}).get(b) or {}
    out: dict = {}
    for name, rs in runs.items():
        tps = [len(r["ids"]) * n_new / r["s"] for r in rs]
        ref = runs[refs[name]]
        row: dict = {"tokens_per_s": spread(tps), "speedup": spread([r2["s"] and b2["s"] / r2["s"] for r2, b2 in zip(rs, base, strict=False)]),
                     "reference": refs[name], "identical_to_target_only": sum(a == c for a, c in zip(rs[-1]["ids"], ref[-1]["ids"], strict=False)),
                     "outputs": len(ref[-1]["ids"]), "output_ids": rs[-1]["ids"]}
        last = rs[-1]
        if last["rounds"]:  # the host's own work per request and round (Metrics.other_s) and deciding drafts, microseconds
            row["host_us_per_row_round"] = round(last["other_s"] / last["rounds"] * 1e6, 2)
            row["decide_us_per_row_round"] = round(last["decide_s"] / last["rounds"] * 1e6, 2)
        if last["rounds"] and last["drafted"] and t:
            per = last["drafted"] / last["rounds"]
            t1, tv = t[1], float(np.interp(1 + per, sorted(t), [t[w] for w in sorted(t)]))
            steps_run = max(1.0, last["rounds"] / b)
            row["bound"] = (1 + last["accepted"] / last["rounds"]) / (tv / t1 + last["draft_s"] * 1e3 / steps_run / t1)
            row["of_bound"] = row["speedup"]["median"] / row["bound"]
            row["mean_acceptance_length"] = 1 + last["accepted"] / last["rounds"]
        out[name] = row
    return out


def _print_batch(b: int, rows: dict) -> None:
    print(f"\nbatch {b}: {'method':<22}{'tokens/s':>22}{'speedup':>22}{'bound':>7}{'of bound':>9}{'acc len':>8}{'== TO':>7}{'== b1':>7}")
    for name, r in rows.items():
        s, x = r["tokens_per_s"], r["speedup"]
        extra = f"{r['bound']:>7.2f}{r['of_bound']:>9.2f}{r['mean_acceptance_length']:>8.2f}" if "bound" in r else f"{'':>24}"
        print(f"         {name:<22}{s['median']:>10.1f} ({s['min']:.0f}-{s['max']:.0f}){x['median']:>10.2f}x ({x['min']:.2f}-{x['max']:.2f})"
              f"{extra}{r['identical_to_target_only']:>4}/{r['outputs']}"
              f"{'' if r.get('identical_to_batch1') is None else r['identical_to_batch1']:>5}/{r['outputs']}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", required=True, help="target HF checkpoint (benchmarks/enlarge.py --preset llama8b)")
    ap.add_argument("--draft", required=True, help="draft HF checkpoint (--preset llama1b)")
    ap.add_argument("--eagle", help="EAGLE-3 module enlarged to the target (enlarge.py --heads): the target is built as an EAGLE target")
    ap.add_argument("--medusa", help="Medusa heads enlarged to the target: a Medusa target is built too")
    ap.add_argument("--int4", action="store_true", help="also an int4 weight-only target (group 128): its steps and target-only")
    ap.add_argument("--work", required=True, help="engine directory root (reused when a second run finds them)")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"],
                    help="engine dtype (float32: a dry run of this script's code paths, slow and not what GPUs are measured in)")
    ap.add_argument("--batches", default="1,4,16")
    ap.add_argument("--draft_lens", default="2,4")
    ap.add_argument("--ngram", default="4,3", help="max_draft_len,max_matching_ngram_size")
    ap.add_argument("--num_prompts", type=int, default=16)
    ap.add_argument("--prompt_tokens", type=int, default=64)
    ap.add_argument("--max_new_tokens", type=int, default=96)
    ap.add_argument("--repeats", type=int, default=2, help="timed rounds per batch size (after a warm-up round)")
    ap.add_argument("--sections", default="build,steps,profile,decode,hf", help="comma-separated subset to run")
    ap.add_argument("--budget_s", type=float, default=1e9, help="start no section past this many seconds")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    budget, work, out = Budget(args.budget_s), Path(args.work), Path(args.json) if args.json else None
    batches, draft_lens = [int(x) for x in args.batches.split(",")], [int(x) for x in args.draft_lens.split(",") if x]
    ngram = [int(x) for x in args.ngram.split(",")] if args.ngram else None
    kmax = max(draft_lens + ([ngram[0]] if ngram else []))
    verify = max(kmax, len(json.loads(TREE))) if (args.eagle or args.medusa) else kmax
    res: dict[str, Any] = {"args": vars(args), "limits": LIMITS}
    sections = set(args.sections.split(","))
    common = ["--dtype", args.dtype, "--max_batch_size", str(max(batches)), "--max_draft_len", str(verify)]
    plan = {"target": (args.target, common + (["--speculative_decoding_mode", "eagle", "--eagle_dir", args.eagle] if args.eagle
                                              else ["--speculative_decoding_mode", "draft_tokens_external"])),
            "draft": (args.draft, ["--dtype", args.dtype, "--max_batch_size", str(max(batches))])}
    if args.medusa:
        plan["medusa"] = (args.target, common + ["--speculative_decoding_mode", "medusa", "--medusa_dir", args.medusa])
    if args.int4:
        plan["int4"] = (args.target, ["--dtype", args.dtype, "--max_batch_size", str(max(batches)), "--max_draft_len", str(kmax),
                                      "--speculative_decoding_mode", "draft_tokens_external", "--qformat", "int4_wo"])
    built = {name: (work / name).joinpath("config.json").is_file() for name in plan}
    if "build" in sections:
        for name, (ckpt, flags) in plan.items():
            built[name] = build(name, ckpt, work / name, flags, res, budget)
        if out:
            out.write_text(json.dumps(res, indent=2, default=_jsonable) + "\n")
    engines = {name: (open_cuda(work / name), work / name) for name in plan if built[name]}
    if "target" not in engines or "draft" not in engines:
        raise SystemExit("the target and draft engines are needed: build them first (section build)")

    bw = hbm_bandwidth()
    res["hbm_tb_per_s"] = bw / 1e12
    print(f"HBM {bw / 1e12:.2f} TB/s (1 GiB device-to-device copy)", flush=True)
    widths = sorted({1, *[k + 1 for k in draft_lens], kmax + 1, verify + 1})
    step_engines = {k: v for k, v in engines.items() if k != "medusa"}
    if "steps" in sections:
        section(res, "steps", budget, 60, lambda: steps_section(step_engines, batches, widths, bw), out)
        section(res, "verify_vs_steps", budget, 5, lambda: {n: verify_vs_steps(engines[n][0], kmax) for n in ("target", "int4") if n in engines}, out)
    if "profile" in sections:
        section(res, "profile", budget, 30, lambda: profile_section(step_engines, kmax), out)
    prompts = code_prompts(work / "target", args.num_prompts, args.prompt_tokens)
    shortest = min(map(len, prompts))
    prompts = [p[:shortest] for p in prompts]  # one length: a batch of Hugging Face's needs no padding
    res["prompts"] = {"count": len(prompts), "tokens": shortest, "new_tokens": args.max_new_tokens}
    if "decode" in sections:
        from gpu_methods import decode_methods

        methods = decode_methods(engines, draft_lens, ngram, TREE)
        section(res, "decode", budget, 60,
                lambda: decode_section(methods, prompts, batches, args.max_new_tokens, args.repeats, res.get("steps", {}), budget), out)
        if out and isinstance(res.get("decode"), dict):
            from specdec.bench.plots import beside, spread_bar, write_bars

            panels = {f"batch {b}": [spread_bar(m, r["speedup"]) for m, r in rows.items()] for b, rows in res["decode"].items()
                      if "skipped" not in rows}
            if path := write_bars(beside(out), f"speed over target-only at the same batch, {args.max_new_tokens} new tokens, {args.dtype}", panels):
                print(f"wrote {path}", flush=True)
    if "hf" in sections:
        from gpu_methods import hf_section

        section(res, "hf", budget, 120, lambda: hf_section(args.target, args.draft, prompts, batches, args.max_new_tokens, res.get("decode", {})),
                out)


if __name__ == "__main__":
    main()
