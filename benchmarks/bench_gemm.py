"""The torch backend's GEMM tiles on a GPU: each candidate tile on a model's layer shapes, at the row counts decode,
verification and P-EAGLE's one-call drafting feed it, against the read floor and cuBLAS; and whether each tile keeps a
row's bits whatever the call's row count (what exact speculation needs: kernels/gemm.py).

    python benchmarks/bench_gemm.py --json gemm.json                    # the 8B shapes, bfloat16 and int4 (group 128)
    python benchmarks/bench_gemm.py --preset llama1b --kinds dense      # the draft's shapes

Each (shape, rows, tile) is timed as a CUDA graph of ``--calls`` launches over enough copies of the weight that they
do not fit in L2 (each call reads its weight from memory, as a decode step does), best of ``--repeats`` replays.
GB/s counts the weight's bytes only (the activations are small beside it at these row counts). A tile that does not
fit the GPU's shared memory (gemm._launch would run a smaller one in its place) is listed as such, not timed. Needs torch with CUDA and Triton.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

PRESETS = {  # hidden, intermediate, heads, kv_heads, head_dim, vocab (benchmarks/enlarge.py's presets)
    "llama8b": (4096, 14336, 32, 8, 128, 128256),
    "llama1b": (2048, 8192, 32, 8, 64, 128256),
}


def shapes(preset: str) -> dict[str, tuple[int, int]]:
    """layer -> (N, K): a decoder layer's four linears, the LM head, and an EAGLE-3 target's fc (3 aux layers)."""
    h, i, heads, kv, hd, vocab = PRESETS[preset]
    return {"qkv": ((heads + 2 * kv) * hd, h), "o": (h, heads * hd), "gate_up": (2 * i, h), "down": (h, i),
            "lm_head": (vocab, h), "eagle_fc": (h, 3 * h)}


def candidate_tiles(gemm) -> list:
    T = gemm.Tile
    return [gemm.FIXED,
            T(16, 32, 128, 1, 4, 4), T(16, 32, 256, 1, 4, 3), T(16, 64, 128, 1, 4, 4), T(16, 64, 256, 1, 8, 3), T(16, 16, 256, 1, 4, 4),
            T(16, 32, 128, 2, 4, 4), T(16, 32, 128, 4, 4, 4), T(16, 64, 128, 4, 4, 4), T(16, 64, 128, 8, 4, 4), T(16, 32, 256, 4, 4, 3),
            T(32, 32, 128, 1, 4, 4), T(32, 64, 128, 1, 4, 4), T(32, 64, 128, 4, 4, 4),
            T(64, 64, 64, 1, 4, 4), T(64, 64, 128, 1, 4, 3), T(64, 64, 128, 4, 4, 3), T(64, 128, 64, 1, 8, 3), T(64, 128, 64, 4, 8, 3),
            T(64, 64, 128, 2, 4, 3), T(64, 32, 128, 1, 4, 3), T(64, 32, 128, 4, 4, 3), T(64, 64, 256, 1, 4, 2), T(64, 64, 128, 8, 4, 3),
            T(128, 64, 64, 1, 4, 3), T(64, 64, 128, 1, 8, 3)]


def policy_tiles(gemm, N: int, K: int, bits: int) -> list:
    """--tiles policy: the one tile before per-shape tiles, and what gemm.tile_for picks for this shape now."""
    chosen = gemm.tile_for(N, K, bits)
    return [gemm.FIXED] + ([chosen] if chosen != gemm.FIXED else [])


def row_tiles(gemm, N: int, K: int, bits: int) -> list:
    """--tiles rows: gemm.tile_for's tile with other row tiles (BLOCK_M), the reduction (BLOCK_K, split) unchanged. Each is
    checked for the chosen tile's bits: where they match, a call's row tile could follow its row count and stay exact.
    The 16-row tile also with 4 and 5 pipeline stages (q|k|v's fastest tile at 1 row had 4): stages move loads, and
    whether Triton's code for them keeps the sum's order is what the bit check answers."""
    chosen = gemm.tile_for(N, K, bits)
    deeper = [replace(chosen, block_m=16, num_stages=s) for s in (4, 5) if s != chosen.num_stages]
    return [chosen] + [replace(chosen, block_m=m) for m in (16, 32, 64, 128) if m != chosen.block_m] + deeper


def int4_tiles(gemm) -> list:
    T = gemm.Tile
    return [gemm.FIXED, T(16, 32, 128, 1, 4, 4), T(16, 64, 128, 1, 4, 4), T(16, 32, 128, 4, 4, 4), T(16, 64, 128, 4, 4, 4),
            T(32, 64, 128, 1, 4, 4), T(64, 64, 64, 1, 4, 4), T(64, 64, 128, 4, 4, 3), T(64, 64, 128, 1, 4, 3), T(16, 128, 128, 1, 4, 3),
            T(16, 64, 256, 1, 4, 3), T(64, 128, 128, 1, 8, 3), T(16, 32, 128, 2, 4, 4), T(64, 64, 128, 2, 4, 3)]


def graph_time(torch, fn, calls: int, repeats: int) -> float:
    """Seconds per call: ``calls`` calls of fn (fn(i) picks its weight copy) captured once, best of ``repeats`` replays."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for i in range(2):
            fn(i)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(calls):
            fn(i)
    graph.replay()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end) / 1e3 / calls)
    del graph
    return best


def row_exact(torch, run, x, rows: list[int]) -> bool:
    """Each call of M rows gives rows 0..M-1 (and the last M rows) the bits the widest call gives them."""
    whole = run(x)
    M = x.shape[0]
    return all(torch.equal(run(x[:m]), whole[:m]) and torch.equal(run(x[M - m:]), whole[M - m:]) for m in rows)


def layer_calls(torch, gemm, kind: str, N: int, K: int, out_dtype, spill_mb: int, g):
    """(weight bytes, make(tile, x) -> call(i), cuBLAS's call(x) -> call(i) or None): call i reads weight copy i mod copies."""
    if kind == "dense":
        nbytes = N * K * 2
        copies = max(2, -(-spill_mb * 2**20 // nbytes))
        ws = [torch.randn(N, K, device="cuda", dtype=torch.bfloat16, generator=g) * 0.02 for _ in range(copies)]
        return (nbytes, lambda t, x: (lambda i: gemm.linear(x, ws[i % copies], out_dtype, tile=t)),
                lambda x: (lambda i: torch.nn.functional.linear(x, ws[i % copies]).to(out_dtype)))
    group = 128
    nbytes = K // 2 * N + (K // group) * N * 5  # codes, float32 scales, uint8 zeros
    copies = max(2, -(-spill_mb * 2**20 // nbytes))
    qs = [torch.randint(0, 256, (K // 2, N), device="cuda", dtype=torch.uint8, generator=g) for _ in range(copies)]
    sc = torch.rand(K // group, N, device="cuda", generator=g) * 0.01
    zs = torch.randint(0, 16, (K // group, N), device="cuda", dtype=torch.uint8, generator=g)
    return nbytes, lambda t, x: (lambda i: gemm.int_linear(x, qs[i % copies], sc, zs, 4, group, out_dtype, tile=t)), None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="llama8b", choices=sorted(PRESETS))
    ap.add_argument("--kinds", default="dense,int4", help="dense (bfloat16 weights) and/or int4 (group 128)")
    ap.add_argument("--layers", default=None, help="comma list of layers (default: all of shapes())")
    ap.add_argument("--rows", default="1,16,64,80,320", help="row counts M (decode at batch 1/16/64, 16 x 5 verification, P-EAGLE at 16 x 20)")
    ap.add_argument("--tiles", default="candidates", choices=["candidates", "policy", "rows"],
                    help="candidates: every tile of candidate_tiles / int4_tiles; policy: FIXED against gemm.tile_for's tile per shape; "
                    "rows: tile_for's tile with each other BLOCK_M, each checked for the same bits as it (row_tiles)")
    ap.add_argument("--calls", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--l2_spill_mb", type=int, default=256, help="weight copies per shape until they reach this many MB")
    ap.add_argument("--budget_s", type=float, default=1e9, help="stop starting new shapes after this many seconds")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    import torch
    from gpu_steps import read_bandwidth

    from specdec.runtime.backends.torch.kernels import gemm

    t0 = time.time()
    dev = "cuda"
    rows = [int(r) for r in args.rows.split(",")]
    read_bw = read_bandwidth(dev)
    out = {"device": torch.cuda.get_device_name(0), "read_tb_per_s": read_bw / 1e12, "preset": args.preset, "rows": rows, "results": []}
    print(f"{out['device']}: read {read_bw / 1e12:.2f} TB/s", flush=True)
    save = lambda: args.json and Path(args.json).write_text(json.dumps(out, indent=1) + "\n")  # noqa: E731
    g = torch.Generator(device=dev).manual_seed(0)
    layers = shapes(args.preset)
    if args.layers:
        layers = {k: v for k, v in layers.items() if k in args.layers.split(",")}
    for kind in args.kinds.split(","):
        for layer, (N, K) in layers.items():
            bits = 0 if kind == "dense" else 4
            chosen = gemm.tile_for(N, K, bits)
            if args.tiles == "policy":
                tiles = policy_tiles(gemm, N, K, bits)
            elif args.tiles == "rows":
                tiles = row_tiles(gemm, N, K, bits)
            else:
                tiles = candidate_tiles(gemm) if kind == "dense" else int4_tiles(gemm)
            if time.time() - t0 > args.budget_s:
                print(f"-- budget spent: {kind} {layer} and later skipped", flush=True)
                out["skipped_from"] = f"{kind} {layer}"
                save()
                return
            out_dtype = torch.float32 if layer == "lm_head" else torch.bfloat16
            nbytes, make, ref = layer_calls(torch, gemm, kind, N, K, out_dtype, args.l2_spill_mb, g)
            x_all = torch.randn(max(rows), K, device=dev, dtype=torch.bfloat16, generator=g)
            chosen_out = make(chosen, x_all)(0) if args.tiles == "rows" else None
            for tile in tiles:
                rec = {"kind": kind, "layer": layer, "N": N, "K": K, "tile": str(tile), "tile_fields": vars(tile), "ms": {}, "gb_s": {},
                       "chosen": tile == chosen}
                gemm._SMALLER.clear()  # a tile that does not fit falls back inside gemm._launch: said below, not timed as itself
                try:
                    rec["row_exact"] = row_exact(torch, lambda x, t=tile, f=make: f(t, x)(0), x_all, [r for r in rows if r < max(rows)] + [2, 5, 17])
                    if gemm._SMALLER:
                        raise RuntimeError(f"does not fit this GPU's shared memory: runs as {list(gemm._SMALLER.values())[-1]}")
                    if chosen_out is not None:  # --tiles rows: the chosen tile's bits, every row of the widest call
                        rec["same_bits_as_chosen"] = bool(torch.equal(make(tile, x_all)(0), chosen_out))
                    for m in rows:
                        s = graph_time(torch, make(tile, x_all[:m]), args.calls, args.repeats)
                        rec["ms"][m], rec["gb_s"][m] = s * 1e3, nbytes / s / 1e9
                except Exception as err:  # a tile past the GPU's shared memory, say
                    rec["error"] = f"{type(err).__name__}: {str(err).splitlines()[0][:200]}"
                out["results"].append(rec)
                line = rec.get("error") or " ".join(f"M{m} {rec['ms'][m] * 1e3:7.1f}us {rec['gb_s'][m]:5.0f}GB/s" for m in rows)
                same = f" same={rec['same_bits_as_chosen']!s:5}" if "same_bits_as_chosen" in rec else ""
                print(f"{kind:5} {layer:8} {str(tile):26} exact={rec.get('row_exact')!s:5}{same} {line}", flush=True)
            if ref is not None:
                rec = {"kind": "cublas", "layer": layer, "N": N, "K": K, "ms": {}, "gb_s": {}}
                for m in rows:
                    s = graph_time(torch, ref(x_all[:m]), args.calls, args.repeats)
                    rec["ms"][m], rec["gb_s"][m] = s * 1e3, nbytes / s / 1e9
                out["results"].append(rec)
                print(f"cublas {layer:8} {'':26} {'':11} " + " ".join(f"M{m} {rec['ms'][m] * 1e3:7.1f}us {rec['gb_s'][m]:5.0f}GB/s" for m in rows),
                      flush=True)
            del x_all
            make = ref = None  # the weight copies go before the next layer's
            torch.cuda.empty_cache()
            save()
    print(f"== done in {time.time() - t0:.0f} s", flush=True)
    save()


if __name__ == "__main__":
    main()
