"""One engine call at a time against the machine's memory floor: where a decode step's time goes (issue 41).

    python benchmarks/bench_steps.py --engine /tmp/i41/big/engine-target-q4gemm --engine /tmp/i41/big/engine-target-int4 \\
        --widths 1,5 --threads 1,2 --rounds 7 --output_json steps.json
    python benchmarks/bench_steps.py --engine ENGINE --profile --widths 1,5 --threads 1   # ONNX Runtime's per-op profile

For each engine, thread count and width (tokens per call: 1 is a decode step, k + 1 a verification of k drafts), the
median [min-max] wall and CPU time of one call at a fixed context, every engine and width interleaved within each
round, so the figures compared share each stretch of machine load. Each is set against the floor of the machine it
ran on: the bytes of weights a step reads (``host.step_bytes``: every initializer but the gathered embedding) over
the read bandwidth measured in the same run (``host.read_bandwidth``, the thread count's best pass), printed as the
achieved bandwidth and its share of the measured one. Since a shared machine's bandwidth moves from minute to minute
(19 to 28 GB/s within minutes on one 2-core VM), the bandwidth is also sampled at the start of every round and each
round's step is set against its own round's sample: the last column, the figure to read. ``--kernels`` repeats the measurement with
``SPECDEC_Q4_KERNEL`` set (``avx2``, ``portable``: the slower Q4Gemm kernels of CPUs without AVX-512 VNNI), each in a
subprocess of its own (the kernel is chosen once per process). Each ``--q4_library`` build is also given against
its engine's default build, paired round by round (CPU time).

``--processes N`` runs the measurement (its warm-up and ``--rounds`` rounds) in each of N fresh processes, each
making its sessions in another order, and pools the rounds: on one 2-core VM the same library run twice on one
engine in one process ran 0.96x to 1.07x itself from one process to the next, steadily within each (which memory a
session's buffers get), so a comparison inside one process carries a bias of a few percent that its rounds never
average out; the paired ratios are then also given per process.

``--tree PARENTS`` (a JSON list, -1 for a child of the cache's last token) makes each call of len(PARENTS) tokens verify
that tree, on engines built to (``--tree_attention``, Medusa and EAGLE targets): a tree step's cost on one attention
against another, say (an engine built before specdec's attention op took trees runs ONNX Runtime's ``Attention``).

``--profile`` runs ONNX Runtime's profiler over the timed calls of one width (the prefill and warm-up calls are left
out) and prints the kernel time per op type, its share, the node count and the time per node, and what is left
between the nodes (the executor's own overhead: thread-pool wake-ups, allocation, I/O binding).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import host  # noqa: E402


def spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def open_executor(path: Path, threads: int, profile_prefix: str | None = None, library: Path | None = None, earlier: bool = False) -> Any:
    """The engine's executor; with ``profile_prefix`` or ``library`` its session is made again, profiling on or with
    another build of the Q4Gemm library (an earlier specdec's: the same engine, another kernel, in the same run).
    earlier: an engine an earlier specdec built, of a kernel layout this one refuses, run with ``library`` (that
    specdec's build): opened through a copy of its config that names this layout (its files linked, not copied)."""
    from specdec.formats.engine_format import load_engine_dir
    from specdec.runtime.backends.onnxruntime.cpu import OrtExecutor

    if earlier:
        from specdec.hardware.cpu_kernels import LAYOUT

        relabelled = Path(tempfile.mkdtemp(prefix="earlier_engine_"))
        for f in Path(path).iterdir():
            if f.name != "config.json":
                (relabelled / f.name).symlink_to(f.resolve())
        config = json.loads((Path(path) / "config.json").read_text())
        config["build"]["weight_only"]["kernel_layout"] = LAYOUT  # this library reads it too (its op takes per-column zeros)
        (relabelled / "config.json").write_text(json.dumps(config))
        path = relabelled
    ex = OrtExecutor(load_engine_dir(path), num_threads=threads)
    if profile_prefix is not None or library is not None:  # the executor's session options (ORT profiles from creation on)
        import onnxruntime as ort

        from specdec.runtime.backends.onnxruntime.cpu import session_options

        so = session_options(threads)
        if profile_prefix is not None:
            so.enable_profiling, so.profile_file_prefix = True, profile_prefix
        if ex.build.cpu_kernels == "specdec":
            from specdec.hardware.cpu_kernels import kernel_library

            so.register_custom_ops_library(str(library or kernel_library()))
        session = ort.InferenceSession(str(ex.engine.network_path), so, providers=["CPUExecutionProvider"])
        if hasattr(ex, "use_session"):
            ex.use_session(session)
        else:  # an earlier specdec's executor (bench_loop.py run on an older tree): its call buffers bind again
            ex.session, ex._cache_values = session, None
            ex._ios.clear()
    return ex


def with_context(ex: Any, context: int) -> Any:
    cache = ex.new_cache(1)
    ex.forward(cache, [list(range(5, 5 + context))], all_logits=False)
    return cache


TREE: list[int] | None = None  # --tree: the parents of each call of len(TREE) tokens


def call(ex: Any, cache: Any, width: int) -> None:
    import numpy as np

    parents = [np.array(TREE)] if TREE is not None and width == len(TREE) else None
    ex.forward(cache, [[7] * width], all_logits=True, parents=parents)
    cache.lengths[0] -= width  # every call at the same cache length


def cpu_kernels(engine: Path) -> str:
    """The kernels an engine was built for (its build config's cpu_kernels), read without opening a session."""
    from specdec.formats.engine_format import load_engine_dir

    return load_engine_dir(engine).config.build.cpu_kernels


def measure(engines: list[Path], threads: int, widths: list[int], context: int, rounds: int, calls: int,
            libraries: dict[str, Path] | None = None, earlier: dict[str, tuple[Path, Path]] | None = None,
            reader: host.StreamReader | None = None, open_turn: int = 0) -> dict[str, Any]:
    """{engine: {width: {"wall_ms", "cpu_ms", "cpu_ms_by_round", "wall_ms_by_round"[, "read_gb_s", "of_read", "of_read_cpu" and
    their "_by_round" lists]}}}, engines and widths interleaved in every round (round 0 warms up); each Q4Gemm engine also
    as "ENGINE [LABEL]" with each of ``libraries``; each of ``earlier`` (label: an earlier specdec's engine and its
    library) as "ENGINE [LABEL]". With ``reader``, the read bandwidth is sampled at the start of every round and each
    round's step is set against its own round's sample: "of_read" is the spread over rounds of (the step's bytes / its
    wall time) / that round's bandwidth by wall time, "of_read_cpu" the same by CPU time (per thread). open_turn: the
    sessions and their caches are made in their order turned by that many places (--processes gives each process another
    turn: which memory a session's buffers get can move its steps by a few percent for the whole life of the process)."""
    specs = [(str(p), p, {}) for p in engines]  # (name, engine, open_executor's keywords)
    kernel_engines = [p for p in engines if cpu_kernels(p) == "specdec"]
    specs += [(f"{p} [{label}]", p, {"library": lib}) for label, lib in (libraries or {}).items() for p in kernel_engines]
    specs += [(f"{engine} [{label}]", engine, {"library": lib, "earlier": True}) for label, (engine, lib) in (earlier or {}).items()]
    turned = specs[open_turn % len(specs):] + specs[: open_turn % len(specs)]
    made = {name: open_executor(path, threads, **kw) for name, path, kw in turned}
    caches = {name: with_context(made[name], context) for name, _, _ in turned}  # (their memory: the same turn)
    opened = [(name, made[name]) for name, _, _ in specs]
    wall: dict[tuple[str, int], list[float]] = collections.defaultdict(list)
    cpu: dict[tuple[str, int], list[float]] = collections.defaultdict(list)
    samples: list[tuple[float, float]] = []  # per measured round: (GB/s by wall time, by CPU time)
    for r in range(rounds + 1):
        sample = reader.sample(threads) if reader is not None and r else None
        if sample:
            samples.append(sample)
        for w in widths:
            for name, ex in opened[r % len(opened):] + opened[: r % len(opened)]:
                c0, w0 = time.process_time(), time.perf_counter()
                for _ in range(calls):
                    call(ex, caches[name], w)
                if r:
                    wall[(name, w)].append((time.perf_counter() - w0) / calls * 1e3)
                    cpu[(name, w)].append((time.process_time() - c0) / calls * 1e3)
    out = {name: {w: {"cpu_ms_by_round": cpu[(name, w)], "wall_ms_by_round": wall[(name, w)]} for w in widths}  # by round: for paired ratios
           for name, _ in opened}
    if len(samples) == rounds:
        sizes = {name: host.step_bytes(Path(name.split(" [")[0])) for name, _ in opened}
        for name, per_width in out.items():
            for w, entry in per_width.items():
                entry["read_gb_s_by_round"] = [b for b, _ in samples]
                entry["of_read_by_round"] = [achieved(sizes[name], ms) / b for ms, (b, _) in zip(wall[(name, w)], samples, strict=True)]
                entry["of_read_cpu_by_round"] = [achieved(sizes[name], ms / threads) / c for ms, (_, c) in zip(cpu[(name, w)], samples, strict=True)]
    return with_spreads(out)


SPREADS = {"wall_ms": "wall_ms_by_round", "cpu_ms": "cpu_ms_by_round", "read_gb_s": "read_gb_s_by_round", "of_read": "of_read_by_round",
           "of_read_cpu": "of_read_cpu_by_round"}


def with_spreads(results: dict[str, Any]) -> dict[str, Any]:
    """Each entry's median [min-max] figures from its per-round lists (SPREADS)."""
    for per_width in results.values():
        for entry in per_width.values():
            entry.update({k: spread(entry[by]) for k, by in SPREADS.items() if entry.get(by)})
    return results


def merge_processes(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """measure()'s results of several processes as one: the rounds of all, in process order ("process_by_round": which
    process each round ran in)."""
    merged: dict[str, Any] = {}
    for i, part in enumerate(parts):
        for name, per_width in part.items():
            for w, entry in per_width.items():
                into = merged.setdefault(name, {}).setdefault(w, {})
                for by in (by for by in SPREADS.values() if by in entry):
                    into.setdefault(by, []).extend(entry[by])
                into.setdefault("process_by_round", []).extend([i] * len(entry["cpu_ms_by_round"]))
    return with_spreads(merged)


def paired(results: dict[str, Any], widths: list[int]) -> dict[str, Any]:
    """Per round by CPU time, with the spread over rounds and, with several processes, each process's median: each labelled
    run ("ENGINE [LABEL]") against its engine's own (ENGINE / ENGINE [LABEL]: under 1, the engine's default build is the
    faster), and each later --engine against the first (LATER / FIRST: under 1, the later engine is the faster; two builds
    of one checkpoint, say). An --earlier engine is another directory than any --engine: it has none to pair with."""
    out = {}
    engines = [name for name in results if " [" not in name]

    def pair(over: str, under: str, label: str) -> None:
        for w in widths:
            ratios = [a / b for a, b in zip(results[over][w]["cpu_ms_by_round"], results[under][w]["cpu_ms_by_round"], strict=True)]
            procs = results[under][w].get("process_by_round") or [0] * len(ratios)
            by_process = [statistics.median([r for r, p in zip(ratios, procs, strict=True) if p == i]) for i in sorted(set(procs))]
            out[f"{label}, width {w}"] = {**spread(ratios), "by_process": by_process}

    for name in results:
        base = name.split(" [")[0]
        if name != base and base in results:
            pair(base, name, f"{Path(base).name} / {Path(base).name} [{name.split(' [')[1]}")
    for name in engines[1:]:
        pair(name, engines[0], f"{Path(name).name} / {Path(engines[0]).name}")
    return out


def profile(path: Path, threads: int, width: int, context: int, calls: int) -> dict[str, Any]:
    """ONNX Runtime's profile of ``calls`` timed calls of ``width`` tokens: kernel time per op type and the gap."""
    with tempfile.TemporaryDirectory() as tmp:
        ex = open_executor(path, threads, profile_prefix=str(Path(tmp) / "p"))
        cache = with_context(ex, context)
        for _ in range(3):
            call(ex, cache, width)
        t0 = time.perf_counter()
        for _ in range(calls):
            call(ex, cache, width)
        wall_ms = (time.perf_counter() - t0) / calls * 1e3
        events = json.loads(Path(ex.session.end_profiling()).read_text())
    runs = [e for e in events if e.get("name") == "model_run"][-calls:]
    first = runs[0]["ts"]
    nodes = [e for e in events if e.get("cat") == "Node" and e["name"].endswith("_kernel_time") and e["ts"] >= first]
    by_op: dict[str, float] = collections.defaultdict(float)
    count: collections.Counter = collections.Counter()
    for e in nodes:
        by_op[e["args"]["op_name"]] += e["dur"] / calls / 1e3
        count[e["args"]["op_name"]] += 1
    run_ms = sum(e["dur"] for e in runs) / calls / 1e3
    kernel_ms = sum(by_op.values())
    ops = {op: {"ms": ms, "share": ms / run_ms, "nodes": count[op] // calls, "us_per_node": ms * 1e3 / (count[op] / calls)}
           for op, ms in sorted(by_op.items(), key=lambda kv: -kv[1])}
    return {"width": width, "threads": threads, "wall_ms": wall_ms, "model_run_ms": run_ms, "kernel_ms": kernel_ms,
            "between_nodes_ms": run_ms - kernel_ms, "nodes_per_call": len(nodes) // calls, "ops": ops}


def floors(engines: list[Path], bandwidth: dict[str, Any], labels: list[str] = (),
           earlier: dict[str, tuple[Path, Path]] | None = None) -> dict[str, Any]:
    by = bandwidth["by_threads"]
    named = [(name, p) for p in engines for name in (str(p), *(f"{p} [{label}]" for label in labels))]
    named += [(f"{p} [{label}]", p) for label, (p, _) in (earlier or {}).items()]
    return {name: {"step_bytes": host.step_bytes(p), "floor_ms": {str(n): host.step_bytes(p) / (v["best_gb_s"] * 1e9) * 1e3 for n, v in by.items()}}
            for name, p in named}


def fmt(s: dict[str, float], digits: int = 2) -> str:
    return f"{s['median']:.{digits}f} [{s['min']:.{digits}f}-{s['max']:.{digits}f}]"


def pct(s: dict[str, float]) -> str:
    return f"{s['median']:.0%} [{s['min']:.0%}-{s['max']:.0%}]"


def achieved(step_bytes: int, ms: float) -> float:
    return step_bytes / (ms * 1e-3) / 1e9


def print_steps(results: dict[str, Any], fl: dict[str, Any], bandwidth: dict[str, Any], threads: int, widths: list[int], label: str) -> None:
    """Wall time against the wall-clock read bandwidth, and CPU time (per thread) against the CPU-time one: on a quiet
    machine the two agree; on a shared one the CPU-time pair is the steadier (a descheduled thread stretches neither)."""
    bw = bandwidth["by_threads"].get(threads) or bandwidth["by_threads"].get(str(threads))
    print(f"\n{label}, {threads} thread(s); read bandwidth {bw['best_gb_s']:.1f} GB/s by wall time, {bw['cpu_best_gb_s']:.1f} by CPU time "
          f"(best passes; medians {bw['median_gb_s']:.1f}, {bw['cpu_median_gb_s']:.1f})")
    print(f"{'engine':<36}{'width':>6}{'wall ms':>22}{'CPU ms':>22}{'floor ms':>9}{'GB/s wall':>10}{'of read':>8}{'GB/s CPU':>10}{'of read':>8}"
          f"{'/ width 1':>10}{'CPU / w1':>9}  of the read bandwidth sampled in each round (median [min-max] over rounds)")
    for name, per_width in results.items():
        f = fl[name]
        one, one_cpu = per_width[widths[0]]["wall_ms"]["median"], per_width[widths[0]]["cpu_ms"]["median"]
        for w in widths:
            m, c = per_width[w]["wall_ms"], per_width[w]["cpu_ms"]
            by_wall = achieved(f["step_bytes"], m["min"])  # the least-disturbed call: what the step can do
            by_cpu = achieved(f["step_bytes"], c["min"] / threads)
            print(f"{Path(name.split(' [')[0]).name + (' [' + name.split(' [')[1] if ' [' in name else ''):<36}{w:>6}{fmt(m):>22}{fmt(c):>22}"
                  f"{f['floor_ms'][str(threads)]:>9.2f}{by_wall:>10.1f}{by_wall / bw['best_gb_s']:>8.0%}"
                  f"{by_cpu:>10.1f}{by_cpu / bw['cpu_best_gb_s']:>8.0%}{m['median'] / one:>9.2f}x{c['median'] / one_cpu:>8.2f}x"
                  + (f"  {pct(per_width[w]['of_read'])} by wall, {pct(per_width[w]['of_read_cpu'])} by CPU" if "of_read" in per_width[w] else ""))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engine", action="append", required=True, type=Path, help="an engine directory (repeatable)")
    ap.add_argument("--widths", default="1,5", help="tokens per call; the first is the one the ratios divide by")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--context", type=int, default=64, help="tokens in the cache before the measured calls")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--calls", type=int, default=3)
    ap.add_argument("--kernels", default="", help="also with SPECDEC_Q4_KERNEL=each of these (comma list: avx2, portable)")
    ap.add_argument("--profile", action="store_true", help="ONNX Runtime's per-op profile instead of the timings")
    ap.add_argument("--q4_library", action="append", default=[], metavar="LABEL=PATH",
                    help="also run each Q4Gemm engine with this build of specdec_cpu_kernels.so (e.g. an earlier specdec's), interleaved")
    ap.add_argument("--earlier", action="append", default=[], metavar="LABEL=ENGINE:LIBRARY",
                    help="also an engine an earlier specdec built (a kernel layout this one refuses), with that specdec's "
                         "specdec_cpu_kernels.so, interleaved")
    ap.add_argument("--processes", type=int, default=1,
                    help="run the measurement (warm-up and --rounds rounds) in each of this many fresh processes, each making the "
                         "sessions in another order, and pool the rounds: "
                         "which memory a session gets moves its steps by a few percent for a process's whole life, which "
                         "rounds within one process never average out (the paired ratios are then given per process too)")
    ap.add_argument("--tree", metavar="PARENTS", help="calls of len(PARENTS) tokens verify this tree (a JSON list of parents, "
                    "-1: a child of the cache's last token), on engines built with tree attention")
    ap.add_argument("--output_json")
    ap.add_argument("--_inner", action="store_true", help=argparse.SUPPRESS)  # a --kernels / --processes subprocess: timings only, as JSON
    ap.add_argument("--_open_turn", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    widths = [int(w) for w in args.widths.split(",")]
    threads = [int(t) for t in args.threads.split(",")]
    libraries = {label: Path(path) for label, _, path in (x.partition("=") for x in args.q4_library)}
    earlier = {label: (Path(rest.split(":")[0]), Path(rest.split(":")[1])) for label, _, rest in (x.partition("=") for x in args.earlier)}
    if args.processes < 1 or args.rounds < 1:
        ap.error("--processes and --rounds must be at least 1")
    if args.tree:
        global TREE
        try:
            TREE = [int(p) for p in json.loads(args.tree)]
        except (ValueError, TypeError) as e:
            ap.error(f"--tree must be a JSON list of parent indices, as [-1, 0, 0, 1]: {e}")
        if len(TREE) not in widths:
            ap.error(f"--tree has {len(TREE)} tokens: give that width in --widths too")
    if args._inner:
        with host.StreamReader() as reader:
            print(json.dumps({t: measure(args.engine, t, widths, args.context, args.rounds, args.calls, libraries, earlier, reader,
                                         args._open_turn) for t in threads}))
        return 0
    rec = host.host_record(bandwidth=False)
    rec["read_bandwidth"] = host.read_bandwidth(sorted({1, *threads}))
    print(host.describe(rec) + f"; load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    report: dict[str, Any] = {"host": rec, "args": {k: [str(e) for e in v] if k == "engine" else v for k, v in vars(args).items()}}
    if args.profile:
        report["profiles"] = []
        for path in args.engine:
            for t in threads:
                for w in widths:
                    p = profile(path, t, w, args.context, args.calls * args.rounds)
                    report["profiles"].append({"engine": str(path), **p})
                    print(f"\n{path.name}, {t} thread(s), width {w}: {p['wall_ms']:.2f} ms a call, model_run {p['model_run_ms']:.2f} ms, "
                          f"kernels {p['kernel_ms']:.2f} ms, between nodes {p['between_nodes_ms']:.2f} ms, {p['nodes_per_call']} nodes")
                    for op, v in p["ops"].items():
                        print(f"  {op:<36}{v['ms']:9.3f} ms {v['share']:6.1%} {v['nodes']:5d} nodes {v['us_per_node']:9.1f} us a node")
    else:
        fl = floors(args.engine, rec["read_bandwidth"], list(libraries), earlier)
        report["floors"], report["steps"] = fl, {}
        for kernel in ["", *[k for k in args.kernels.split(",") if k]]:
            label = f"SPECDEC_Q4_KERNEL={kernel}" if kernel else "default kernels"
            if kernel or args.processes > 1:
                parts = [inner_run(args, kernel, turn) for turn in range(args.processes)]
                by_threads = {t: merge_processes([part[t] for part in parts]) for t in threads}
            else:
                with host.StreamReader() as reader:
                    by_threads = {t: measure(args.engine, t, widths, args.context, args.rounds, args.calls, libraries, earlier, reader)
                                  for t in threads}
            report["steps"][kernel or "default"] = by_threads
            for t in threads:
                print_steps(by_threads[t], fl, rec["read_bandwidth"], t, widths, label)
                pairs = paired(by_threads[t], widths)
                report.setdefault("paired", {}).setdefault(kernel or "default", {})[t] = pairs
                for name, r in pairs.items():
                    each = f"; per process {', '.join(f'{x:.3f}' for x in r['by_process'])}" if len(r["by_process"]) > 1 else ""
                    print(f"  {name}: {r['median']:.3f} [{r['min']:.3f}-{r['max']:.3f}] by CPU time, paired per round{each}")
    report["load_average_end"] = list(os.getloadavg())
    if args.output_json:
        Path(args.output_json).write_text(json.dumps(report, indent=1) + "\n")
        print(f"wrote {args.output_json}")
        if report.get("steps"):
            chart(report["steps"], args.output_json)
    return 0


def inner_run(args: argparse.Namespace, kernel: str, turn: int) -> dict[int, Any]:
    """measure() in a fresh process (SPECDEC_Q4_KERNEL=kernel where given: the kernel is chosen once per process), its
    sessions made ``turn`` places into their order: {threads: results}."""
    inner = [sys.executable, __file__, *sum([["--engine", str(e)] for e in args.engine], []), "--widths", args.widths,
             "--threads", args.threads, "--context", str(args.context), "--rounds", str(args.rounds), "--calls", str(args.calls),
             "--_inner", "--_open_turn", str(turn), *(["--tree", args.tree] if args.tree else []),
             *sum([["--q4_library", x] for x in args.q4_library], []), *sum([["--earlier", x] for x in args.earlier], [])]
    env = {**os.environ, "SPECDEC_Q4_KERNEL": kernel} if kernel else None
    out = subprocess.run(inner, capture_output=True, text=True, env=env)
    if out.returncode != 0:  # its own error, not a CalledProcessError's exit status
        raise SystemExit(f"bench_steps: the measuring process{' with SPECDEC_Q4_KERNEL=' + kernel if kernel else ''} failed:\n"
                         + "\n".join(out.stderr.strip().splitlines()[-15:]))
    return {int(t): {e: {int(w): v for w, v in r.items()} for e, r in res.items()} for t, res in json.loads(out.stdout.splitlines()[-1]).items()}


def chart(steps: dict[str, Any], json_path: str) -> None:
    """A step of w tokens over a one-token step (CPU time), per engine, one panel per kernel and thread count."""
    from specdec.bench.plots import Bar, beside, write_bars

    panels = {f"{kernel}, {t} thread(s)": [Bar(f"{Path(name.split(' [')[0]).name}{' [' + name.split(' [')[1] if ' [' in name else ''} w={w}",
                                               v[w]["cpu_ms"]["median"] / v[min(v)]["cpu_ms"]["median"])
                                            for name, v in by_engine.items() for w in v]
              for kernel, by_threads in steps.items() for t, by_engine in by_threads.items()}
    if path := write_bars(beside(json_path), "CPU time of a step over a one-token step", panels, "step / one-token step"):
        print(f"wrote {path}")


if __name__ == "__main__":
    sys.exit(main())
