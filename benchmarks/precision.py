"""Precision report: dtype / quantization x (engine size, tokens/s, held-out
perplexity, greedy agreement with float32, draft acceptance when the draft is
built the same way, unless the row says otherwise).

    python benchmarks/precision.py --target examples/demo-pair/target --draft examples/demo-pair/draft

Perplexity is teacher-forced on held-out text with the engine itself (one
context-phase call per chunk, logits for every position). Agreement is the
fraction of generated tokens equal to the float32 engine's, position by
position, over greedy continuations of held-out prompts: one early divergence
changes the rest of a continuation, so it swings with a handful of near-ties.
Top-1 agreement is the steadier measure of the same thing: at every held-out
position, teacher-forced (the perplexity run), does the engine's argmax equal
float32's.

int4_awq calibrates on stdlib modules outside the held-out list (prompts.SOURCES,
written to a temporary file), never on the text it is scored on.
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
from prompts import HELDOUT, SOURCES, code_prompts  # noqa: E402

from specdec.builder.build import build_engine  # noqa: E402
from specdec.formats.config_strings import DraftTargetConfig  # noqa: E402
from specdec.formats.engine_format import BuildConfig  # noqa: E402
from specdec.formats.tokenizer import Tokenizer  # noqa: E402
from specdec.runtime import GenerationConfig, load_engine_dir, load_orchestrator  # noqa: E402
from specdec.runtime.backends.onnxruntime.cpu import OrtExecutor  # noqa: E402

INT4 = dict(dtype="float16", quantization="int4_wo", group_size=128)  # embeddings stay in float16, what the checkpoint holds
VARIANTS = {  # name -> build settings; "draft": the draft's, when not the target's
    "float32": dict(dtype="float32"),
    "float16": dict(dtype="float16"),
    "bfloat16": dict(dtype="bfloat16"),
    "fp8 (weights)": dict(dtype="float16", quantization="fp8"),
    "fp8 (weights + dynamic activations)": dict(dtype="float16", quantization="fp8", fp8_activations="dynamic"),
    "int8 (per channel)": dict(dtype="float16", quantization="int8_wo"),
    "int4 (RTN, group 128)": INT4,
    "int4 (RTN, group 32)": {**INT4, "group_size": 32},
    "int4 (RTN, group 128, asymmetric)": {**INT4, "symmetric": False},
    "int4_awq (group 128)": {**INT4, "quantization": "int4_awq"},
    "int4_awq (group 128, asymmetric)": {**INT4, "quantization": "int4_awq", "symmetric": False},
    "float32 target, int4 draft": dict(dtype="float32", draft=INT4),
}


def heldout_text(limit_chars: int) -> str:
    """The demo pair's held-out files (prompts.HELDOUT), else the prompts' fallback stdlib modules."""
    import sysconfig

    stdlib = Path(sysconfig.get_paths()["stdlib"])
    names = HELDOUT.read_text().split() if HELDOUT.is_file() else list(SOURCES)
    text = ""
    for name in names:
        p = stdlib / name
        if p.is_file():
            text += p.read_text(errors="replace") + "\n"
        if len(text) >= limit_chars:
            break
    return text[:limit_chars]


def calibration_file(path: Path) -> Path:
    """Calibration text for int4_awq: the prompts' fallback modules, none of them held out from the demo pair."""
    import sysconfig

    stdlib = Path(sysconfig.get_paths()["stdlib"])
    held_out = set(HELDOUT.read_text().split()) if HELDOUT.is_file() else set()
    path.write_text("".join((stdlib / n).read_text(errors="replace") + "\n" for n in SOURCES if n not in held_out and (stdlib / n).is_file()))
    return path


def teacher_forced(ex: OrtExecutor, ids: list[int], chunk: int) -> tuple[float, np.ndarray]:
    """Perplexity of ``ids`` and the engine's top-1 prediction at every position ([positions] int64)."""
    nll, count, top1 = 0.0, 0, []
    for lo in range(0, len(ids) - 1, chunk):
        piece = ids[lo : lo + chunk + 1]
        if len(piece) < 2:
            break
        cache = ex.new_cache(1)
        logits = ex.forward(cache, [piece[:-1]], all_logits=True).logits[0].astype(np.float64)
        top1.append(logits.argmax(axis=-1))
        logits -= logits.max(axis=-1, keepdims=True)
        logp = logits - np.log(np.exp(logits).sum(axis=-1, keepdims=True))
        nll -= float(logp[np.arange(len(piece) - 1), piece[1:]].sum())
        count += len(piece) - 1
    return float(np.exp(nll / count)), np.concatenate(top1)


def calibration(settings: dict, calib: Path) -> dict:
    return {"calib_dataset": calib} if settings.get("quantization") == "int4_awq" else {}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", required=True)
    ap.add_argument("--draft")
    ap.add_argument("--num_prompts", type=int, default=6)
    ap.add_argument("--max_new_tokens", type=int, default=96)
    ap.add_argument("--heldout_chars", type=int, default=40000)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--json", default=None)
    ap.add_argument("--only", nargs="*", help="run only the rows whose name contains one of these (float32, the reference, always runs)")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="specdec-precision-"))
    limits = dict(max_batch_size=1, max_input_len=512, max_seq_len=1024)
    quiet = lambda _: None  # noqa: E731
    calib = calibration_file(work / "calib.txt")
    rows, ref_outputs = {}, None
    heldout_ids = prompts = None  # the same tokenizer in every variant: encoded once
    for name, variant in VARIANTS.items():
        if args.only and name != "float32" and not any(k in name for k in args.only):
            continue
        print(f"  {name}: building and measuring", flush=True)
        settings = {k: v for k, v in variant.items() if k != "draft"}
        draft_settings = variant.get("draft", settings)
        tdir = work / f"t-{len(rows)}"
        t_build = time.perf_counter()
        build_engine(args.target, tdir, BuildConfig(**limits, max_draft_len=4, speculative_decoding_mode="draft_tokens_external", **settings),
                     say=quiet,
                     **calibration(settings, calib))
        t_build = time.perf_counter() - t_build
        engine = load_engine_dir(tdir)
        if prompts is None:
            heldout_ids = Tokenizer(tdir).encode(heldout_text(args.heldout_chars))
            prompts = code_prompts(tdir, args.num_prompts, 96)
        orch = load_orchestrator(engine, num_threads=args.threads)  # one session for perplexity and decoding
        ppl, top1 = teacher_forced(orch.target, heldout_ids, 256)
        cfg = GenerationConfig(max_output_len=args.max_new_tokens)
        orch.generate([prompts[0]], GenerationConfig(max_output_len=4))
        t = time.perf_counter()
        outs = [orch.generate([p], cfg)[0][0].output_ids for p in prompts]
        tps = sum(map(len, outs)) / (time.perf_counter() - t)
        if ref_outputs is None:
            ref_outputs, ref_top1 = outs, top1
        agree = np.mean([np.mean(np.array(a) == np.array(b)) for a, b in zip(outs, ref_outputs, strict=True)])
        row = {"engine_bytes": (tdir / "model.onnx.data").stat().st_size, "tokens_per_s": tps, "heldout_ppl": ppl,
               "greedy_agreement_vs_float32": float(agree),
               "top1_agreement_vs_float32": float(np.mean(top1 == ref_top1)), "target_build_s": t_build}
        if args.draft:
            ddir = work / f"d-{len(rows)}"
            build_engine(args.draft, ddir, BuildConfig(**limits, **draft_settings), say=quiet, **calibration(draft_settings, calib))
            spec = load_orchestrator(engine, ddir, DraftTargetConfig(4, [0], [0], False), num_threads=args.threads, target_executor=orch.target)
            _, m = spec.generate(prompts, cfg)
            row["draft_acceptance_rate"] = m.acceptance_rate
        rows[name] = row
        print(f"  {name}: {json.dumps({k: round(v, 4) for k, v in row.items()})}", flush=True)
    base = rows["float32"]
    print("\n| engine | weights file | size vs float32 | tokens/s (CPU) | held-out ppl | greedy agreement vs float32 | top-1 agreement vs float32 "
          "(teacher-forced) |"
          + (" draft acceptance |" if args.draft else ""))
    print("|---|---|---|---|---|---|---|" + ("---|" if args.draft else ""))
    for name, r in rows.items():
        line = (f"| {name} | {r['engine_bytes'] / 2**20:.1f} MiB | {r['engine_bytes'] / base['engine_bytes']:.2f} | {r['tokens_per_s']:.0f} "
                f"| {r['heldout_ppl']:.3f} | {r['greedy_agreement_vs_float32']:.3f} | {r['top1_agreement_vs_float32']:.3f} |")
        print(line + (f" {r['draft_acceptance_rate']:.3f} |" if args.draft else ""))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2) + "\n")
        from specdec.bench.plots import Bar, beside, write_bars

        panels = {"top-1 agreement with float32 (teacher-forced)": [Bar(n, r["top1_agreement_vs_float32"]) for n, r in rows.items()],
                  "held-out perplexity over float32's": [Bar(n, r["heldout_ppl"] / base["heldout_ppl"]) for n, r in rows.items()]}
        if path := write_bars(beside(args.json), "precision against float32, same checkpoint", panels, xlabel="ratio"):
            print(f"wrote {path}")


if __name__ == "__main__":
    main()
