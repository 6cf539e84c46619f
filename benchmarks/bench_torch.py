"""The torch backend on an NVIDIA GPU (issue 37): step costs against the read-bandwidth floor, kernels per step, every
method and auto at each batch size against its bound, beside ONNX Runtime's ort_cuda path and Hugging Face.

    python benchmarks/enlarge.py --preset llama8b --dtype bfloat16 examples/demo-pair/target /tmp/g/target
    python benchmarks/enlarge.py --preset llama1b --dtype bfloat16 examples/demo-pair/draft /tmp/g/draft
    python benchmarks/enlarge.py --heads examples/demo-pair/heads/eagle --base /tmp/g/target /tmp/g/eagle
    python benchmarks/bench_torch.py --target /tmp/g/target --draft /tmp/g/draft --eagle /tmp/g/eagle --work /tmp/g/torch \\
        --int4 --batches 1,4,16,64 --json /tmp/g/torch.json --budget_s 400 [--ort]

(benchmarks/gpu_session.sh BENCH=torch runs it on a GPU host after the cuda tests; docs/gpu.md has the figures.)
A dry run of every code path on a CPU, tiny engines in float32 (no profile, no Hugging Face):

    python benchmarks/bench_torch.py --target examples/demo-pair/target --draft examples/demo-pair/draft \\
        --eagle examples/demo-pair/heads/eagle --work /tmp/dry --int4 --device cpu --dtype float32 --batches 1,2 \\
        --max_new_tokens 8 --repeats 1 --json /tmp/dry/torch.json

Engines (--work, reused when there): with --backend torch, the target (an EAGLE target with --eagle: it serves every
method but Medusa and P-EAGLE), the draft, with --int4 an int4 target (group 128), with --medusa a Medusa target, with
--peagle a P-EAGLE target (its methods against its own target-only); with --ort the
same target and int4 target as ort_cuda engines (needs onnxruntime-gpu). Sections, each skipped once --budget_s is
spent (the JSON says so, and is rewritten after each):

1. bandwidth: the read floor, a reduction over 4 GiB (a decode step reads its weights; a copy's write is not a cost it
   has); each engine's floor = its weight bytes / that.
2. steps: ms per step of 1 and k+1 tokens at each batch size, CUDA graphs on, the torch and ort_cuda engines
   interleaved, --repeats rounds (median, min-max); whether a (k+1)-token call gives the bits of k+1 one-token calls.
3. profile: CUDA kernels per step and their time (torch.profiler), torch and ort_cuda.
4. decode: per batch size, fresh engines, methods interleaved, a warm-up round then --repeats timed rounds: tokens/s,
   speedup over target-only, the bound from measured acceptance and step costs (bench_gpu.py's docstring), whether
   every output is target-only's and batch 1's; ort_cuda target-only beside them. auto methods start from step
   costs measured at load (Engine.measure_step_costs).
5. hf: Hugging Face's static-cache greedy compiled by torch.compile, each batch size warmed (compiled and captured)
   before it is timed.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from bench_gpu import TREE, Budget, _jsonable, _print_batch, _run, _summarize, build, section, verify_vs_steps  # noqa: E402
from gpu_steps import _filled, kernel_profile, read_bandwidth, weight_bytes  # noqa: E402
from prompts import code_prompts, spread  # noqa: E402

LIMITS = dict(max_input_len=128, max_seq_len=256)  # prompts of ~64 tokens and 64 new ones: a short cache at batch 64
TORCH = ("--backend", "torch")
PEAGLE_REFINING = "peagle-refine"  # the engine folder of a P-EAGLE target whose module reads its drafts (plain: "peagle")
DENSE_COMPARED = ("unfused", "shape", "fixed", "cublas")  # --compare: the target's steps under these SPECDEC_TORCH_DENSE choices too


def open_engine(path: Path, kind: str, dense: str | None = None):
    """The engine's executor on ``kind``; dense: a torch engine's SPECDEC_TORCH_DENSE choice (TorchExecutor's ``dense``)."""
    from specdec.formats.engine_format import load_engine_dir
    from specdec.runtime.backends import Placement, open_executor

    if dense is not None:
        from specdec.runtime.backends.torch.executor import TorchExecutor

        return TorchExecutor(load_engine_dir(path), "cuda:0" if kind == "cuda" else kind, dense=dense)
    return open_executor(load_engine_dir(path), Placement(kind, 0))


def plan_builds(args, kmax: int, verify: int) -> dict[str, tuple[str, list[str], tuple[str, ...]]]:
    """name -> (checkpoint, flags, backend flags)."""
    batch = ["--dtype", args.dtype, "--max_batch_size", str(max(args.batch_list)), "--max_input_len", str(LIMITS["max_input_len"]),
             "--max_seq_len", str(LIMITS["max_seq_len"])]
    spec = ["--speculative_decoding_mode", "draft_tokens_external", "--max_draft_len", str(kmax)]
    target = (batch + ["--speculative_decoding_mode", "eagle", "--eagle_dir", args.eagle, "--max_draft_len", str(verify)] if args.eagle
              else batch + spec)
    plan = {"target": (args.target, target, TORCH), "draft": (args.draft, batch, TORCH)}
    if args.int4:
        plan["int4"] = (args.target, batch + spec + ["--qformat", "int4_wo"], TORCH)
    if args.peagle:  # a module trained to read its drafts gets its own folder: a reused engine is the module asked for
        plan[PEAGLE_REFINING if trained_to_refine(args.peagle) else "peagle"] = (
            args.target, batch + ["--speculative_decoding_mode", "peagle", "--peagle_dir", args.peagle, "--max_draft_len", str(verify)], TORCH)
    if args.medusa:
        plan["medusa"] = (args.target, batch + ["--speculative_decoding_mode", "medusa", "--medusa_dir", args.medusa, "--max_draft_len", str(verify)],
                          TORCH)
    if args.ort:
        plan["ort"] = (args.target, batch + spec, ("--lowering", "ort_cuda"))
        if args.int4:
            plan["ort_int4"] = (args.target, batch + spec + ["--qformat", "int4_wo"], ("--lowering", "ort_cuda"))
    return plan


def timed_steps(engines: dict, batches: list[int], widths: list[int], repeats: int, reps: int = 30) -> dict:
    """name -> batch -> width -> ms spread: each (batch, width) timed on every engine in turn, ``repeats`` rounds. An
    engine is timed up to its widest step (1 token for the draft, max_draft_len + 1 for the others): a wider call is a
    prompt's, run without CUDA graphs, not a step (an int4 engine built for k = 4 took 22.8 ms at 9 tokens on an H200)."""
    still = {b: np.zeros(b, bool) for b in batches}
    got: dict = {name: {b: {} for b in batches} for name in engines}
    for b in batches:
        caches = {name: _filled(ex, b, 100) for name, (ex, _) in engines.items()}  # one cache per engine and batch size
        for r in range(repeats):
            for w in widths:
                order = list(engines) if r % 2 == 0 else list(engines)[::-1]
                for name in order:
                    ex = engines[name][0]
                    if w > (1 if name == "draft" else ex.build.max_draft_len + 1):
                        continue
                    tokens = [[5] * w] * b
                    for _ in range(3 if r else 10):  # the first round also captures the shape's CUDA graph
                        ex.forward(caches[name], tokens, all_logits=True, advance=still[b])
                    t = time.perf_counter()
                    for _ in range(reps):
                        ex.forward(caches[name], tokens, all_logits=True, advance=still[b])
                    got[name][b].setdefault(w, []).append((time.perf_counter() - t) / reps * 1e3)
        del caches
        gc.collect()
    return {name: {b: {w: spread(v) for w, v in t.items()} for b, t in per.items()} for name, per in got.items()}


def steps_section(engines: dict, batches: list[int], widths: list[int], read_bw: float, repeats: int) -> dict:
    timed = timed_steps(engines, batches, widths, repeats)
    out: dict = {}
    for name, (_ex, path) in engines.items():
        floor = weight_bytes(path) / read_bw * 1e3
        table = timed[name]
        out[name] = {"weight_gb": weight_bytes(path) / 1e9, "floor_ms": floor, "step_ms": table,
                     "step_over_floor": {b: table[b][1]["median"] / floor for b in batches}}
        print(f"{name:<9} floor {floor:.3f} ms; " + "; ".join(f"b={b}: " + " ".join(f"w{w} {v['median']:.3f}" for w, v in t.items())
                                                           for b, t in table.items()), flush=True)
    for mode in DENSE_COMPARED:  # the same engine on another SPECDEC_TORCH_DENSE over the default, same run, interleaved
        if f"target_{mode}" in timed:
            key = "fixed_over_shape_tiles" if mode == "fixed" else f"{mode}_over_stable"
            out[key] = {b: {w: timed[f"target_{mode}"][b][w]["median"] / timed["target"][b][w]["median"] for w in timed["target"][b]
                            if w in timed[f"target_{mode}"][b]} for b in batches}
            print(f"target_{mode} / target: " + "; ".join(f"b={b}: " + " ".join(f"w{w} {r:.2f}x" for w, r in t.items())
                                                         for b, t in out[key].items()), flush=True)
    for name in ("ort", "ort_int4"):
        if name in timed:
            mine = name.replace("ort", "target") if name == "ort" else "int4"
            out[f"torch_over_{name}"] = {b: {w: timed[name][b][w]["median"] / timed[mine][b][w]["median"] for w in timed[mine][b]
                                            if w in timed[name][b]} for b in batches}
    return out


def profile_section(engines: dict, kmax: int) -> dict:
    out: dict = {}
    for name, (ex, _) in engines.items():
        for w in ([1] if name == "draft" else [1, kmax + 1]):
            try:
                out[f"{name} w={w}"] = kernel_profile(ex, 1, w)
            except Exception as err:  # CUPTI may be missing on a host: say so, keep the other figures
                out[f"{name} w={w}"] = {"error": f"{type(err).__name__}: {err}"}
    for k, v in out.items():
        if v and "kernels_per_step" in v:
            print(f"{k:<16} {v['kernels_per_step']:.0f} kernels/step, {v['kernel_ms_per_step']:.3f} ms of kernels; top {v['top_kernels'][:3]}",
                  flush=True)
    return out


def decode_batch(engines: dict, b: int, prompts: list[list[int]], args, kind: str, steps: dict) -> dict:
    """One batch size: fresh orchestrators (their caches are this batch's), a warm-up round, then timed rounds, interleaved."""
    from gpu_methods import decode_methods

    from specdec.runtime.orchestrator import GenerationConfig, Orchestrator

    ngram = [int(x) for x in args.ngram.split(",")] if args.ngram else None
    methods = decode_methods({k: v for k, v in engines.items() if not k.startswith("ort")}, args.draft_len_list, ngram, TREE, kind=kind, more=True,
                             peagle_refine=args.peagle_refine_list)
    if args.methods:  # the others dropped; every engine's target-only stays (the speedups' and outputs' reference)
        methods = {name: m for name, m in methods.items() if name.endswith("target-only") or args.methods.search(name)}
    if "ort" in engines:
        methods["ort_cuda target-only"] = (Orchestrator(engines["ort"][0]), "ort_cuda target-only")
    for name, (orch, _) in methods.items():
        if "auto" in name:  # auto's costs measured on this engine's cache before its first round
            orch.engine.measure_step_costs(batches=[b])
    cfg = GenerationConfig(max_output_len=args.max_new_tokens)
    runs: dict[str, list[dict]] = {m: [] for m in methods}
    for r in range(args.repeats + 1):  # round 0 warms every method up (CUDA graphs captured) and is not kept
        for name in (list(methods) if r % 2 else list(methods)[::-1]):
            runs[name].append(_run(methods[name][0], prompts, b, cfg))
    kept, refs = {m: v[1:] for m, v in runs.items()}, {m: ref for m, (_, ref) in methods.items()}
    rows = _summarize(kept, refs, _step_table(steps, "target", b), b, args.max_new_tokens)
    for name, (orch, _) in methods.items():  # what auto's decisions read at this batch size, after its rounds
        if "auto" in name and name in rows:
            rows[name]["auto_state"] = {m: orch.engine.auto.describe(m, b) for m in orch.engine.proposers}
            print(f"auto_state b={b} {name}: {json.dumps(rows[name]['auto_state'])}", flush=True)  # in the log too: a JSON can be lost
    if "int4 target-only" in kept:  # the int4 target's methods: speedup over its own target-only, bound from its own steps
        mine = [m for m in kept if refs[m] == "int4 target-only"]
        int4 = _summarize({"target-only": kept["int4 target-only"], **{m: kept[m] for m in mine if m != "int4 target-only"}},
                          {"target-only": "target-only", **{m: "target-only" for m in mine}}, _step_table(steps, "int4", b), b, args.max_new_tokens)
        rows.update({m: int4[m if m != "int4 target-only" else "target-only"] for m in mine})
    del methods
    gc.collect()
    return rows


def prompt_pool(tokenizer_dir: Path, count: int, tokens: int) -> list[list[int]]:
    """``count`` code prompts of one length (a batch of Hugging Face's needs no padding), the same first ones for every count:
    a batch size decodes a prefix of the pool. Fewer functions than asked for are cycled."""
    pool = code_prompts(tokenizer_dir, count, tokens)
    pool = [p[: min(map(len, pool))] for p in pool]
    return [pool[i % len(pool)] for i in range(count)]


def _step_table(steps: dict, engine: str, b: int) -> dict:
    """bench_gpu._summarize's step costs ({"target": {"step_ms": {b: {width: ms}}}}) from this script's steps of ``engine``."""
    return {"target": {"step_ms": {b: {w: v["median"] for w, v in steps.get(engine, {}).get("step_ms", {}).get(b, {}).items()}}}}


def decode_section(engines: dict, batches: list[int], args, kind: str, steps: dict, pool: list[list[int]], budget: Budget,
                   saved=lambda _: None) -> dict:
    """Per batch size; ``saved(out)`` after each (a device call cut short keeps the batch sizes it finished)."""
    out: dict = {}
    for b in batches:
        if budget.left() < 30:
            out[str(b)] = {"skipped": "budget"}
            continue
        out[str(b)] = rows = decode_batch(engines, b, pool[: max(b, args.min_prompts)], args, kind, steps)
        first = out.get(str(batches[0]), {})
        for name, row in rows.items():  # the same engine at batch 1, on the prompts both ran
            ids = first.get(name, {}).get("output_ids") if isinstance(first, dict) else None
            row["identical_to_batch1"] = sum(a == c for a, c in zip(row["output_ids"], ids, strict=False)) if ids else None
        _print_batch(b, rows)
        saved(out)
    return out


def trained_to_refine(peagle: str) -> bool:
    """Whether the P-EAGLE module (checkpoint) in ``peagle`` was trained to read its drafts (specdec-train --peagle_refine)."""
    path = Path(peagle) / "config.json"
    if not path.is_file():
        raise SystemExit(f"error: --peagle {peagle}: no config.json there (give a P-EAGLE module's folder: enlarge.py --heads writes one)")
    return bool(json.loads(path.read_text()).get("specdec_train", {}).get("peagle_refine"))


def peagle_refine_settings(text: str, peagle: str | None) -> tuple[int | str, ...]:
    """--peagle_refine's settings, checked before anything is built: each a number of calls or auto (each once; empty
    entries ignored), a module trained to read its drafts (SystemExit otherwise: a GPU call would find out after its builds)."""
    from specdec.formats.errors import RequestError
    from specdec.runtime.proposers.peagle import refine_value

    entries = [x for x in text.split(",") if x.strip()]
    if not entries:
        return ()
    if not peagle:
        raise SystemExit("error: --peagle_refine refines a P-EAGLE module's chains: give --peagle too")
    try:
        settings = tuple(dict.fromkeys(refine_value(x) for x in entries))
    except RequestError as err:
        raise SystemExit(f"error: {err}") from None
    if not trained_to_refine(peagle):
        raise SystemExit(f"error: --peagle_refine: the module in {peagle} was not trained to read its drafts (specdec-train --peagle_refine); "
                         "enlarge examples/demo-pair/heads/peagle-refine instead")
    return settings


def goals(res: dict, batches: list[int]) -> dict:
    """Issue 37's goals, each with the figure it is judged on (None where that section did not run)."""
    steps, decode, hf = res.get("steps", {}), res.get("decode", {}), res.get("hf", {})
    g: dict[str, Any] = {}
    if "target" in steps and "step_over_floor" in steps.get("target", {}):
        g["bf16 step at batch 1 / floor (<= 1.2)"] = steps["target"]["step_over_floor"].get(batches[0])
    if "int4" in steps:
        g["int4 step at batch 1 / its floor (<= 1.5)"] = steps["int4"]["step_over_floor"].get(batches[0])
    for b in batches:
        rows = decode.get(str(b), {})
        if "target-only" not in rows:
            continue
        base = rows["target-only"]["tokens_per_s"]["median"]
        if "ort_cuda target-only" in rows:
            g[f"target-only / ort_cuda at {b} (>= 1.3)"] = base / rows["ort_cuda target-only"]["tokens_per_s"]["median"]
        peer = hf.get(f"greedy static+compile b={b}", {})
        if "tokens_per_s" in peer:
            g[f"target-only / HF static compiled at {b} (>= {1.0 if b == 1 else 1.2})"] = base / peer["tokens_per_s"]
        for name, row in rows.items():
            auto_len = name.split(",")[0].endswith(" auto")  # draft_len=auto ("P-EAGLE chain k=4, refine auto" is a fixed length)
            if "of_bound" in row and b <= 16 and not auto_len:
                g[f"{name} at {b}: of bound (>= 0.9)"] = row["of_bound"]
            if auto_len:
                g[f"{name} at {b}: / target-only (>= 0.97)"] = row["speedup"]["median"]
            g[f"{name} at {b}: outputs = target-only's"] = f"{row['identical_to_target_only']}/{row['outputs']}"
    return g


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", required=True)
    ap.add_argument("--draft", required=True)
    ap.add_argument("--eagle", help="EAGLE-3 module for the target (enlarge.py --heads): the target is built as an EAGLE target")
    ap.add_argument("--medusa", help="Medusa heads for the target: a Medusa target too")
    ap.add_argument("--peagle", help="P-EAGLE module for the target (enlarge.py --heads): a P-EAGLE target too")
    ap.add_argument("--peagle_refine", default="", help="with --peagle: P-EAGLE's chains again with each of these --peagle_refine settings, "
                    'e.g. "1,auto" (the module must be trained to read its drafts: examples/demo-pair/heads/peagle-refine enlarged)')
    ap.add_argument("--int4", action="store_true", help="an int4 weight-only target too (group 128)")
    ap.add_argument("--ort", action="store_true", help="the ort_cuda engines beside (needs onnxruntime-gpu)")
    ap.add_argument("--work", required=True)
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"], help="cpu: a dry run of the code paths (float32)")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    ap.add_argument("--batches", default="1,4,16,64")
    ap.add_argument("--draft_lens", default="2,4")
    ap.add_argument("--ngram", default="4,3")
    ap.add_argument("--min_prompts", type=int, default=4, help="prompts per batch size at least (a batch size b decodes max(b, this))")
    ap.add_argument("--prompt_tokens", type=int, default=64)
    ap.add_argument("--max_new_tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--methods", default=None, help="decode only the methods whose names match this regular expression (and every "
                    "engine's target-only), e.g. 'EAGLE|draft-target k=4' (default: every method)")
    ap.add_argument("--sections", default="build,bandwidth,steps,profile,decode,hf")
    ap.add_argument("--hf_batches", default=None, help="batch sizes for Hugging Face (default: --batches)")
    ap.add_argument("--compare", default="", help="also time the target's steps under these SPECDEC_TORCH_DENSE choices, interleaved "
                    "with the default's: 'unfused' (split layers' sums in kernels of their own), 'shape' (no 16-row tile for small "
                    "calls), 'fixed' (every layer on the one 16 x 32 GEMM tile: the kernels before per-shape tiles), 'cublas' "
                    "(torch's matmul), e.g. unfused,fixed")
    ap.add_argument("--budget_s", type=float, default=1e9)
    ap.add_argument("--build_jobs", type=int, default=1, help="engines built at once (each a process; an 8B bfloat16 build peaks near 15 GiB)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    args.batch_list = [int(x) for x in args.batches.split(",")]
    try:
        args.methods = re.compile(args.methods) if args.methods else None
    except re.error as err:
        raise SystemExit(f"error: --methods {args.methods!r} is not a regular expression: {err}") from None
    args.draft_len_list = [int(x) for x in args.draft_lens.split(",") if x]
    args.peagle_refine_list = peagle_refine_settings(args.peagle_refine, args.peagle)
    compared = [m for m in args.compare.split(",") if m]
    if any(m not in DENSE_COMPARED for m in compared):
        raise SystemExit(f"error: --compare {args.compare!r}: choose among {', '.join(DENSE_COMPARED)}")
    budget, work, out = Budget(args.budget_s), Path(args.work), Path(args.json) if args.json else None
    sections = set(args.sections.split(","))
    kmax = max(args.draft_len_list + [int(args.ngram.split(",")[0])] if args.ngram else args.draft_len_list)
    verify = max(kmax, len(json.loads(TREE))) if (args.eagle or args.medusa or args.peagle) else kmax
    res: dict[str, Any] = {"args": vars(args), "limits": LIMITS}
    plan = plan_builds(args, kmax, verify)
    built = {name: (work / name / "config.json").is_file() for name in plan}
    if "build" in sections:  # each specdec-build its own process; --build_jobs of them at once (numpy writes one layer at a time)
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(max(1, args.build_jobs)) as pool:
            jobs = {name: pool.submit(build, name, ckpt, work / name, flags, res, budget, backend) for name, (ckpt, flags, backend) in plan.items()}
        built.update({name: job.result() for name, job in jobs.items()})
    save = lambda: out and out.write_text(json.dumps(res, indent=2, default=_jsonable) + "\n")  # noqa: E731
    save()
    if sections == {"build"}:  # only the engines (gpu_session_torch.sh builds them while the GPU tests run)
        return
    if args.ort and args.device == "cuda":
        try:
            from specdec.runtime.backends.onnxruntime.cuda_host import require_cuda_provider

            require_cuda_provider("bench_torch.py --ort")
        except Exception as err:
            res["ort"] = {"skipped": str(err)}
            print(f"-- ort_cuda skipped: {err}", flush=True)
            built = {k: v and not k.startswith("ort") for k, v in built.items()}
    engines = {name: (open_engine(work / name, args.device), work / name) for name in plan if built[name]}
    if PEAGLE_REFINING in engines:  # decoded as any P-EAGLE target
        engines["peagle"] = engines.pop(PEAGLE_REFINING)
    if "target" not in engines or "draft" not in engines:
        raise SystemExit("the target and draft engines are needed: build them first (section build)")
    res["devices"] = {name: ex.device for name, (ex, _) in engines.items()}
    read_bw = read_bandwidth(args.device, 4 << 30 if args.device == "cuda" else 64 << 20)
    res["read_tb_per_s"] = read_bw / 1e12
    print(f"read bandwidth {read_bw / 1e12:.2f} TB/s (a reduction over {'4 GiB' if args.device == 'cuda' else '64 MiB'})", flush=True)
    widths = sorted({1, *[k + 1 for k in args.draft_len_list], kmax + 1, verify + 1})
    step_engines = {k: v for k, v in engines.items() if k not in ("medusa", "peagle")}  # the target's steps, plus heads
    for mode in compared if args.device == "cuda" and "steps" in sections else []:  # the same engine under another choice, steps only
        if os.environ.get("SPECDEC_TORCH_DENSE", "stable") != "stable":
            raise SystemExit(f"error: --compare compares against the default GEMMs: unset SPECDEC_TORCH_DENSE "
                             f"(it is {os.environ['SPECDEC_TORCH_DENSE']!r})")
        step_engines[f"target_{mode}"] = (open_engine(work / "target", args.device, dense=mode), work / "target")
    if "steps" in sections:
        section(res, "steps", budget, 60, lambda: steps_section(step_engines, args.batch_list, widths, read_bw, max(1, args.repeats)), out)
        section(res, "verify_vs_steps", budget, 5, lambda: {n: verify_vs_steps(engines[n][0], kmax) for n in ("target", "int4") if n in engines}, out)
    if "profile" in sections and args.device == "cuda":
        section(res, "profile", budget, 30, lambda: profile_section(step_engines, kmax), out)
    hf_batches = [int(x) for x in (args.hf_batches or args.batches).split(",")]
    pool = prompt_pool(work / "target", max(args.batch_list + hf_batches + [args.min_prompts]), args.prompt_tokens)
    res["prompts"] = {"count": len(pool), "tokens": len(pool[0]), "new_tokens": args.max_new_tokens,
                      "per_batch": {b: max(b, args.min_prompts) for b in args.batch_list}}
    if "decode" in sections:
        def saved(partial: dict) -> None:
            res["decode"] = partial
            save()

        section(res, "decode", budget, 60, lambda: decode_section(engines, args.batch_list, args, args.device, res.get("steps", {}), pool, budget,
                                                                  saved), out)
    if "hf" in sections and args.device == "cuda":
        from gpu_methods import hf_section

        del engines, step_engines
        gc.collect()
        import torch

        torch.cuda.empty_cache()
        # each batch size on the prompts our decode ran at it (the outputs are compared), a batch of b at a time
        section(res, "hf", budget, 120, lambda: hf_section(args.target, args.draft, pool, hf_batches, args.max_new_tokens, res.get("decode", {}),
                                                            count=lambda b: max(b, args.min_prompts)), out)
    res["goals"] = goals(res, args.batch_list)
    for k, v in res["goals"].items():
        print(f"goal  {k}: {v if not isinstance(v, float) else f'{v:.3f}'}", flush=True)
    save()


if __name__ == "__main__":
    main()
