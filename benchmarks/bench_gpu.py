"""specdec on an NVIDIA GPU (ONNX Runtime's CUDA provider): step costs against the HBM floor, decoding against the bound and Hugging Face.

    python benchmarks/enlarge.py --preset target325m examples/demo-pair/target /tmp/big/target
    python benchmarks/enlarge.py --preset draft examples/demo-pair/draft /tmp/big/draft
    python benchmarks/bench_gpu.py --target /tmp/big/target --draft /tmp/big/draft --json gpu.json

Batch 1, greedy. What it measures (docs/gpu.md has the figures):

1. HBM bandwidth: a 1 GiB device-to-device copy (read + write bytes / time).
2. ms per target step at context ~200 for 1 .. k+1 new tokens: the ort_cuda
   engine in bf16 with and without CUDA graphs, with ONNX Runtime's default
   attention kernel (cuDNN SDPA) instead of the executor's, and the float32 ort_cpu
   engine on the same GPU (no graphs: its attention bound is read back to the
   host inside every step), each against its floor = weight bytes / bandwidth.
3. Target-only, draft-target (k = --draft_lens) and n-gram tokens/s, each
   speculative output checked equal to target-only, and the speedup against
   the bound from the measured acceptance and step costs:
   (1 + accepted / rounds) / ((drafted / rounds) * c + t(1 + drafted / rounds) / t(1)),
   c = draft step / target step, t(w) = target step of w tokens; and Leviathan's
   bound (verification as cheap as one step). "== TO": outputs identical to
   target-only's, and the mean length of the identical prefix (half precision:
   a k+1-token verification and a 1-token step round differently, see docs/gpu.md).
   With --fp32 the same for float32 engines.
4. Hugging Face generate on the same GPU (torch, sdpa attention), greedy and
   assisted, in float32 and bfloat16: the peer.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from prompts import code_prompts  # noqa: E402

from specdec.builder.build import build_engine  # noqa: E402
from specdec.bench.sweep import analytic_bound, generate_each  # noqa: E402
from specdec.runtime.backends.onnxruntime.cuda import CudaExecutor  # noqa: E402
from specdec.runtime.backends.onnxruntime.cuda_host import D2D, cudart  # noqa: E402
from specdec.runtime.engine_format import BuildConfig, load_engine_dir  # noqa: E402
from specdec.runtime.orchestrator import Orchestrator  # noqa: E402
from specdec.runtime.proposers.draft_model import DraftModelProposer  # noqa: E402
from specdec.runtime.proposers.ngram import NGramProposer  # noqa: E402


def hbm_bandwidth(device: int = 0, nbytes: int = 1 << 30, reps: int = 20) -> float:
    """Bytes/s of a device-to-device copy, counting the read and the write."""
    import onnxruntime as ort

    a = ort.OrtValue.ortvalue_from_shape_and_type([nbytes], np.uint8, "cuda", device)
    b = ort.OrtValue.ortvalue_from_shape_and_type([nbytes], np.uint8, "cuda", device)
    rt = cudart()
    rt.copy(b.data_ptr(), a.data_ptr(), nbytes, D2D)
    rt.synchronize()
    t = time.perf_counter()
    for _ in range(reps):
        rt.copy(b.data_ptr(), a.data_ptr(), nbytes, D2D)
    rt.synchronize()  # a device-to-device cudaMemcpy may return before the copy is done
    return 2 * nbytes * reps / (time.perf_counter() - t)


def agreement(outputs: list[list[int]], reference: list[list[int]]) -> dict:
    """How far speculative outputs follow target-only: identical outputs, and the mean identical prefix."""
    prefix = [next((i for i, (a, b) in enumerate(zip(o, r)) if a != b), min(len(o), len(r))) for o, r in zip(outputs, reference)]
    return {"identical_outputs": sum(o == r for o, r in zip(outputs, reference)), "outputs": len(reference), "mean_identical_prefix": float(np.mean(prefix))}


def decode(orchs: dict, prompts: list[list[int]], n_new: int, repeats: int) -> dict:
    """Each method over every prompt (batch 1), ``repeats`` interleaved rounds, the fastest kept; agreement with target-only."""
    runs: dict[str, list[dict]] = {name: [] for name in orchs}
    for _ in range(repeats):
        for name, orch in orchs.items():
            runs[name].append(generate_each(orch, prompts, [n_new] * len(prompts), warmup=int(not runs[name])))
    ours = {name: min(r, key=lambda x: x["total_s"]) for name, r in runs.items()}
    for r in ours.values():
        r.update(agreement(r["output_ids"], ours["target-only"]["output_ids"]))
    return ours


def weight_bytes(engine_dir: Path) -> int:
    return sum(p.stat().st_size for p in engine_dir.glob("*.onnx.data"))


def step_ms(ex, width: int, context: int = 200, reps: int = 200) -> float:
    """ms per target call of ``width`` new tokens at ``context`` (the same positions rewritten every call)."""
    cache = ex.new_cache(1)
    ex.forward(cache, [[5] * context], all_logits=False)
    tokens, still = [[5] * width], np.zeros(1, bool)
    for _ in range(20):
        ex.forward(cache, tokens, all_logits=True, advance=still)
    t = time.perf_counter()
    for _ in range(reps):
        ex.forward(cache, tokens, all_logits=True, advance=still)
    return (time.perf_counter() - t) / reps * 1e3


def hf_gpu(target: str, prompts: list[list[int]], n_new: int, dtype: str, draft: str | None = None, k: int = 4) -> dict:
    """Hugging Face generate on cuda:0, greedy (or assisted with ``draft``), exactly n_new tokens per prompt."""
    import torch
    from transformers import AutoModelForCausalLM

    dt = {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype]
    load = lambda p: AutoModelForCausalLM.from_pretrained(p, dtype=dt).to("cuda").eval()  # noqa: E731
    model, kwargs = load(target), dict(do_sample=False, num_beams=1, max_new_tokens=n_new, min_new_tokens=n_new)
    if draft:
        assistant = load(draft)
        gc = assistant.generation_config
        gc.num_assistant_tokens, gc.num_assistant_tokens_schedule, gc.assistant_confidence_threshold = k, "constant", 0.0
        kwargs["assistant_model"] = assistant
    outs, total = [], 0.0
    with torch.inference_mode():
        for i, ids in enumerate([prompts[0]] + prompts):  # the first is a warm-up
            x = torch.tensor([ids], device="cuda")
            torch.cuda.synchronize()
            t = time.perf_counter()
            y = model.generate(input_ids=x, attention_mask=torch.ones_like(x), **kwargs)
            torch.cuda.synchronize()
            if i:
                total += time.perf_counter() - t
                outs.append(y[0, len(ids):].tolist())
    tokens = sum(map(len, outs))
    return {"output_ids": outs, "output_tokens": tokens, "total_s": total, "tokens_per_s": tokens / total}


def interp(steps: dict[int, float], width: float) -> float:
    ws = sorted(steps)
    return float(np.interp(width, ws, [steps[w] for w in ws]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", required=True, help="target HF checkpoint dir (the realistic-cost one: benchmarks/enlarge.py)")
    ap.add_argument("--draft", required=True, help="draft HF checkpoint dir")
    ap.add_argument("--work", default=None, help="where to build engines [default: a temp dir]")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16"])
    ap.add_argument("--draft_lens", default="2,3,4")
    ap.add_argument("--ngram", default="4,3", help="max_draft_len,max_matching_ngram_size")
    ap.add_argument("--num_prompts", type=int, default=8)
    ap.add_argument("--prompt_tokens", type=int, default=64)
    ap.add_argument("--max_new_tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=2, help="rounds over our methods; each keeps its fastest")
    ap.add_argument("--peers", default="hf", help="'hf' or ''")
    ap.add_argument("--fp32", action="store_true", help="also time the float32 ort_cpu engine on the GPU (builds a second target)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    work = Path(args.work or tempfile.mkdtemp(prefix="specdec-gpu-"))
    draft_lens = [int(x) for x in args.draft_lens.split(",") if x]
    ngram = [int(x) for x in args.ngram.split(",")] if args.ngram else None
    kmax = max(draft_lens + ([ngram[0]] if ngram else []))
    limits = dict(max_batch_size=1, max_input_len=512, max_seq_len=1024)
    quiet = lambda _: None  # noqa: E731
    t0 = time.perf_counter()
    build_engine(args.target, work / "target", BuildConfig(dtype=args.dtype, lowering="ort_cuda", max_draft_len=kmax, speculative_decoding_mode="draft_tokens_external", **limits), force=True, say=quiet)
    build_engine(args.draft, work / "draft", BuildConfig(dtype=args.dtype, lowering="ort_cuda", **limits), force=True, say=quiet)
    if args.fp32:
        build_engine(args.target, work / "target_fp32", BuildConfig(dtype="float32", lowering="ort_cpu", max_draft_len=kmax, speculative_decoding_mode="draft_tokens_external", **limits), force=True, say=quiet)
    print(f"engines built in {time.perf_counter() - t0:.0f}s", flush=True)
    res: dict = {"args": vars(args)}

    bw = hbm_bandwidth()
    res["hbm_bytes_per_s"] = bw
    target, draft = CudaExecutor(load_engine_dir(work / "target"), 0), CudaExecutor(load_engine_dir(work / "draft"), 0)
    wb = weight_bytes(work / "target")
    floor = wb / bw * 1e3
    print(f"HBM {bw / 1e12:.2f} TB/s (1 GiB device-to-device copy); target {args.dtype} weights {wb / 1e9:.3f} GB -> floor {floor:.3f} ms/step", flush=True)
    widths = sorted({1, 2, *[k + 1 for k in draft_lens], kmax + 1})
    steps = {w: step_ms(target, w) for w in widths}
    no_graphs = CudaExecutor(load_engine_dir(work / "target"), 0, cuda_graphs=False)
    steps_plain = {w: step_ms(no_graphs, w, reps=100) for w in (1, kmax + 1)}
    del no_graphs
    flash = CudaExecutor(load_engine_dir(work / "target"), 0, provider_options={"sdpa_kernel": "0"})  # ONNX Runtime's default choice (cuDNN SDPA)
    steps_flash = {w: step_ms(flash, w) for w in (1, kmax + 1)}
    del flash
    # half precision: do k+1 tokens in one call give the logits of k+1 one-token calls? (different kernels round differently)
    prompt, toks = list(range(10, 110)), [11, 12, 13, 14, 15][: kmax + 1]
    one = target.new_cache(1)
    target.forward(one, [prompt], all_logits=False)
    wide = target.forward(one, [toks], all_logits=True).logits[0].copy()
    seq = target.new_cache(1)
    target.forward(seq, [prompt], all_logits=False)
    narrow = np.stack([target.forward(seq, [[t]], all_logits=True).logits[0, 0].copy() for t in toks])
    res["verify_vs_steps"] = {"max_abs_diff": float(np.abs(wide - narrow).max()), "argmax_equal": bool((wide.argmax(-1) == narrow.argmax(-1)).all())}
    print(f"{len(toks)} tokens in one call vs one by one: max |logit diff| {res['verify_vs_steps']['max_abs_diff']:.4f}, argmax equal: {res['verify_vs_steps']['argmax_equal']}")
    d1 = step_ms(draft, 1)
    c = d1 / steps[1]
    res.update(weight_bytes=wb, floor_ms=floor, step_ms=steps, step_ms_no_graphs=steps_plain, step_ms_sdpa_default=steps_flash, draft_step_ms=d1, c=c)
    print(f"\n{'target step':<34}" + "".join(f"{f'w={w}':>9}" for w in widths))
    print(f"{'ort_cuda ' + args.dtype + ' + CUDA graphs (ms)':<34}" + "".join(f"{steps[w]:>9.3f}" for w in widths))
    print(f"{'  / floor':<34}" + "".join(f"{steps[w] / floor:>8.2f}x" for w in widths))
    print(f"{'ort_cuda, no graphs (ms)':<34}" + "".join(f"{steps_plain[w]:>9.3f}" if w in steps_plain else f"{'':>9}" for w in widths))
    print(f"{'ort_cuda + graphs, cuDNN SDPA':<34}" + "".join(f"{steps_flash[w]:>9.3f}" if w in steps_flash else f"{'':>9}" for w in widths))
    if args.fp32:
        ex32 = CudaExecutor(load_engine_dir(work / "target_fp32"), 0)
        wb32 = weight_bytes(work / "target_fp32")
        s32 = {w: step_ms(ex32, w, reps=100) for w in (1, kmax + 1)}
        del ex32
        res.update(step_ms_fp32=s32, floor_ms_fp32=wb32 / bw * 1e3)
        print(f"{'ort_cpu float32, no graphs (ms)':<34}" + "".join(f"{s32[w]:>9.3f}" if w in s32 else f"{'':>9}" for w in widths)
              + f"   floor {wb32 / bw * 1e3:.3f} ms")
    print(f"draft step {d1:.3f} ms, c = {c:.3f}", flush=True)

    prompts = code_prompts(work / "target", args.num_prompts, args.prompt_tokens)
    n_new = args.max_new_tokens
    orchs = {"target-only": Orchestrator(target)}
    for k in draft_lens:
        orchs[f"draft-target k={k}"] = Orchestrator(target, DraftModelProposer(draft, use_logits=False), draft_len=k)
    if ngram:
        orchs[f"ngram k={ngram[0]} n={ngram[1]}"] = Orchestrator(target, NGramProposer(ngram[0], ngram[1]), draft_len=ngram[0])
    ours = decode(orchs, prompts, n_new, args.repeats)
    base = ours["target-only"]
    print(f"\n{len(prompts)} prompts of ~{args.prompt_tokens} tokens, {n_new} new tokens each, batch 1, best of {args.repeats}")
    print(f"{'method':<26}{'tokens/s':>10}{'speedup':>9}{'bound':>8}{'of bound':>10}{'Leviathan':>11}{'accept':>8}{'== TO':>7}{'prefix':>8}")
    for name, r in ours.items():
        r["speedup"] = r["output_tokens_per_s"] / base["output_tokens_per_s"]
        line = f"{name:<26}{r['output_tokens_per_s']:>10.1f}{r['speedup']:>8.2f}x"
        if r["rounds"] and r["drafted"]:
            per_round = r["drafted"] / r["rounds"]
            cost = per_round * (c if name.startswith("draft") else 0.0) + interp(steps, 1 + per_round) / steps[1]
            r["bound"] = (1 + r["accepted"] / r["rounds"]) / cost
            r["fraction_of_bound"] = r["speedup"] / r["bound"]
            leviathan = ""
            if name.startswith("draft") and r["per_token_acceptance"] is not None:
                r["leviathan_bound"] = analytic_bound(r["per_token_acceptance"], int(name.split("k=")[1]), c)
                leviathan = f"{r['leviathan_bound']:.2f}"
            line += f"{r['bound']:>8.2f}{r['fraction_of_bound']:>10.2f}{leviathan:>11}{r['acceptance_rate']:>8.3f}"
        else:
            line += f"{'':>8}{'':>10}{'':>11}{'':>8}"
        print(line + f"{r['identical_outputs']:>5}/{r['outputs']}{r['mean_identical_prefix']:>8.1f}", flush=True)
    res["ours"] = {k: {kk: vv for kk, vv in v.items() if kk != "output_ids"} for k, v in ours.items()}

    if args.fp32:  # float32 compute on the GPU: is speculative output exactly target-only's there?
        build_engine(args.draft, work / "draft_fp32", BuildConfig(dtype="float32", lowering="ort_cpu", **limits), force=True, say=quiet)
        t32, d32 = CudaExecutor(load_engine_dir(work / "target_fp32"), 0), CudaExecutor(load_engine_dir(work / "draft_fp32"), 0)
        k = draft_lens[0]
        o32 = {"target-only": Orchestrator(t32), f"draft-target k={k}": Orchestrator(t32, DraftModelProposer(d32, use_logits=False), draft_len=k)}
        if ngram:
            o32[f"ngram k={ngram[0]} n={ngram[1]}"] = Orchestrator(t32, NGramProposer(ngram[0], ngram[1]), draft_len=ngram[0])
        f32 = decode(o32, prompts, n_new, 1)
        print("float32 engines on the GPU (ort_cpu lowering, no graphs):")
        for name, r in f32.items():
            print(f"  {name:<24}{r['output_tokens_per_s']:>10.1f} tokens/s  {r['identical_outputs']}/{r['outputs']} outputs identical to float32 target-only "
                  f"(mean identical prefix {r['mean_identical_prefix']:.1f}); {agreement(r['output_ids'], base['output_ids'])['identical_outputs']} identical to {args.dtype} target-only")
        res["float32"] = {k_: {kk: vv for kk, vv in v.items() if kk != "output_ids"} for k_, v in f32.items()}
        del t32, d32

    if "hf" in args.peers:
        hf = {}
        k = 4 if 4 in draft_lens else draft_lens[-1]
        for dtype in ("float32", "bfloat16"):
            for name, kw in (("greedy", {}), (f"assisted k={k}", dict(draft=args.draft, k=k))):
                r = hf_gpu(args.target, prompts, n_new, dtype, **kw)
                same = float(np.mean([a == b for a, b in zip(r["output_ids"], base["output_ids"])]))
                hf[f"hf {dtype} {name}"] = {**{kk: vv for kk, vv in r.items() if kk != "output_ids"}, "same_as_ours": same}
                print(f"{'hf ' + dtype + ' ' + name:<26}{r['tokens_per_s']:>10.1f}   ({same:.0%} of outputs equal ours)", flush=True)
        res["hf"] = hf
        best_spec = max((v["output_tokens_per_s"], n) for n, v in ours.items() if n != "target-only")
        for peer in (f"hf bfloat16 assisted k={k}", f"hf float32 assisted k={k}", "hf bfloat16 greedy"):
            print(f"ours {best_spec[1]} / {peer}: {best_spec[0] / hf[peer]['tokens_per_s']:.2f}x")
        print(f"ours draft-target k={k} / hf bfloat16 assisted k={k}: {ours[f'draft-target k={k}']['output_tokens_per_s'] / hf[f'hf bfloat16 assisted k={k}']['tokens_per_s']:.2f}x")
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=2, default=float) + "\n")


if __name__ == "__main__":
    main()
