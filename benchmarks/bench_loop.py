"""The engine loop's own cost per target call, against onnxruntime-genai's C++ loop on the same small pair (issue 41).

    python benchmarks/bench_loop.py --target examples/demo-pair/target --draft examples/demo-pair/draft --work /tmp/loop \\
        --threads 1 --rounds 5 --num_prompts 4 --prompt_tokens 128 --max_new_tokens 128 --output_json loop.json

On the 6.7M-parameter demo pair a step is mostly overhead: what a runtime does around its model calls (scheduling,
proposing, acceptance, logits processing, bookkeeping) is a large share of a round, and a small draft model's steps
and every GPU round pay the same. Both runtimes run their ONNX Runtime sessions with ORT's profiler on, and a
generation's loop cost is its wall time less the time its sessions spent in their runs (the profiler's ``model_run``
events, placed in time), per target call: the same instrument on both sides,
whatever each runtime's graph costs (the profiler's own cost is inside ``model_run``: a few microseconds a node). On a
busy machine both parts stretch with the waiting for a core: the loop's figure is also given scaled by the round's
CPU time over its wall time. Read the loop figures on a quiet machine. Methods: target-only, draft-target k=4 (the float32 draft), n-gram k=8 over a
3-token match (onnxruntime-genai's ``ngram_size`` 4 matches the same 3 tokens). Every method runs every prompt in
every round, the order rotated; figures: median [min-max] over rounds. ``--calls`` adds specdec's Python function
calls per target call (cProfile, one more pass: a count does not depend on the machine's load). ``--timer`` times
specdec's runs with a perf_counter around each ONNX Runtime run instead of the profiler (sessions without it: the
profiler's own cost per node is then out of the runs, and ``--runtimes specdec`` compares two specdec trees alone).

``--warm_python``: specdec's loop once more with each model run skipped after its call shape's first (the outputs
stay): the Python of a round on warm caches, per target call, against the loop's cost beside real runs.

``--end_to_end``: generations timed whole (prefill included; no profiler, no timer), every method (target-only, draft
k=4, n-gram k=8) on specdec's float32 engines as built by default (ONNX Attention, ``--cpu_kernels ort``) and with
``--cpu_kernels specdec`` ("own ops": RotaryCachedAttention over the cache in place, SwiGLU), and on onnxruntime-genai; and three bare loops,
target-only: the barest Python loop over each of specdec's two target engines (one IOBinding run, an argmax and two
ints written per token: no requests, checks or metrics) and over onnxruntime-genai's own export (its GroupQueryAttention
graph, whose attention mask of the total length is bound again each token, as its own loop feeds it). Tokens/s per
round, interleaved prompt by prompt, and per-round ratios: specdec / its bare loop is what specdec's loop costs, one
bare loop / another what a graph costs, and the bare loop over genai's graph / onnxruntime-genai what a Python loop
costs against its C++ one. Each runner runs in a process of its own, as each onnxruntime-genai worker does and as a
user's specdec does: in the benchmark's process the same runner runs slower (``--process_pairs`` runs two runners
again in it, beside their own processes, in the same run; ``--in_process`` runs every specdec runner and bare loop
in it, close to the set-up of the runs before this option, which also shared one target session per engine kind).
``--general_round`` adds target-only on the own-ops engines through the general round
(SpeculativeRound.decode_plain off, as before it): the short round against it, in the same run.

specdec's figures are its own: one target session per method (so the profiles do not mix), the draft on the same
thread count. onnxruntime-genai runs in its own process (benchmarks/README.md says how its venv is made).
"""

from __future__ import annotations

import argparse
import cProfile
import glob
import json
import os
import pstats
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
import host  # noqa: E402
import peers  # noqa: E402
from bench_steps import open_executor  # noqa: E402
from prompts import code_prompts, spread  # noqa: E402

from specdec.builder.build import build_engine  # noqa: E402
from specdec.formats.engine_format import BuildConfig  # noqa: E402
from specdec.runtime import Orchestrator  # noqa: E402
from specdec.runtime.orchestrator import GenerationConfig  # noqa: E402
from specdec.runtime.proposers.draft_model import DraftModelProposer  # noqa: E402
from specdec.runtime.proposers.ngram import NGramProposer  # noqa: E402

METHODS = ("target-only", "draft k=4", "ngram k=8")


def prepare(target: str, draft: str, work: Path, ortgenai: bool = True, cached_attention: bool = False) -> dict[str, Path]:
    """specdec's float32 engines (with ONNX Attention, and with --cpu_kernels specdec's own ops: -ca) and
    onnxruntime-genai's fp32 exports of the pair, made once under ``work``."""
    paths = {"target": work / "target", "draft": work / "draft", "og-target": work / "og-target", "og-draft": work / "og-draft",
             "target-ca": work / "target-ca", "draft-ca": work / "draft-ca"}  # -ca: --cpu_kernels specdec (own ops)

    def quiet(_: str) -> None:
        pass

    if not (paths["target"] / "config.json").is_file():
        build_engine(target, paths["target"], BuildConfig(dtype="float32", max_batch_size=1, max_input_len=1024, max_seq_len=2048, max_draft_len=8,
                                                          speculative_decoding_mode="draft_tokens_external"), force=True, say=quiet)
    if not (paths["draft"] / "config.json").is_file():
        build_engine(draft, paths["draft"], BuildConfig(dtype="float32", max_batch_size=1, max_input_len=1024, max_seq_len=2048),
                     force=True, say=quiet)
    for ckpt, key, spec in ((target, "target-ca", True), (draft, "draft-ca", False)) if cached_attention else ():
        if not (paths[key] / "config.json").is_file():
            limits = dict(max_batch_size=1, max_input_len=1024, max_seq_len=2048, cpu_kernels="specdec")
            mode = dict(max_draft_len=8, speculative_decoding_mode="draft_tokens_external") if spec else {}
            build_engine(ckpt, paths[key], BuildConfig(dtype="float32", **limits, **mode), force=True, say=quiet)
    for ckpt, key in ((target, "og-target"), (draft, "og-draft")) if ortgenai else ():
        if not (paths[key] / "genai_config.json").is_file():
            peers.ortgenai_build(ckpt, str(paths[key]))
    return paths


class RunTimer:
    """--timer: a perf_counter around every ONNX Runtime run of the CPU executors opened after ``install`` (the runs
    their call shapes bind: cpu.direct_run), counted per session: [runs, seconds]. No profiler in the sessions."""

    def __init__(self) -> None:
        self.per_session: dict[int, list] = {}

    def install(self) -> None:
        import specdec.runtime.backends.onnxruntime.cpu as cpu

        if not hasattr(cpu, "direct_run"):
            raise SystemExit("--timer times specdec's cpu.direct_run, which this specdec tree does not have: measure it without --timer")
        original, clock = cpu.direct_run, time.perf_counter

        def timed_direct_run(session: Any, binding: Any) -> Any:
            run, acc = original(session, binding), self.per_session.setdefault(id(session), [0, 0.0])

            def timed() -> None:
                t = clock()
                run()
                acc[1] += clock() - t
                acc[0] += 1
            return timed

        cpu.direct_run = timed_direct_run

    def read(self, session: Any) -> tuple[int, float]:
        runs, seconds = self.per_session.get(id(session), (0, 0.0))
        return runs, seconds


def method_proposer(method: str, draft: Any) -> tuple[Any, int]:
    """(proposer, draft length) of one of METHODS; ``draft``: the draft executor (draft-target only)."""
    return {"target-only": (None, 0), "draft k=4": (DraftModelProposer(draft) if draft else None, 4), "ngram k=8": (NGramProposer(8, 3), 8)}[method]


class Specdec:
    """One specdec method on sessions of its own, profiled (or timed: ``timer``): run(ids, n) -> (output ids, wall s, CPU s,
    start ns, end ns)."""

    def __init__(self, method: str, paths: dict[str, Path], threads: int, tmp: Path, timer: RunTimer | None = None):
        self.timer = timer
        profile = (lambda name: str(tmp / name)) if timer is None else (lambda name: None)
        self.target = open_executor(paths["target"], threads, profile_prefix=profile(f"sd-{method.split()[0]}"))
        self.draft = open_executor(paths["draft"], threads, profile_prefix=profile("sd-draft")) if method.startswith("draft") else None
        self.orch = Orchestrator(self.target, *method_proposer(method, self.draft))
        self.timed: list[list[tuple[int, float]]] = []  # with a timer: per generation, per session (runs, seconds in them)

    def sessions(self) -> list[Any]:
        return [ex.session for ex in (self.target, self.draft) if ex is not None]

    def run(self, ids: list[int], n: int) -> tuple[list[int], float, float, int, int]:
        before = [self.timer.read(s) for s in self.sessions()] if self.timer else []
        t0, w0, c0 = time.time_ns(), time.perf_counter(), time.process_time()
        outs, _ = self.orch.generate([ids], GenerationConfig(max_output_len=n, end_ids=()))
        wall, cpu, t1 = time.perf_counter() - w0, time.process_time() - c0, time.time_ns()
        if self.timer:
            after = [self.timer.read(s) for s in self.sessions()]
            self.timed.append([(b[0] - a[0], b[1] - a[1]) for a, b in zip(before, after, strict=True)])
        return outs[0].output_ids, wall, cpu, t0, t1

    def profiles(self, intervals: list[tuple[int, int]]) -> list[list[tuple[int, float]]]:
        """Per session (target, draft), per generation: (runs, seconds in them). The profiler's events are placed in
        time by its start (the wall clock's nanoseconds, as time.time_ns); with a timer, its own counts."""
        if self.timer:
            return [list(per) for per in zip(*self.timed, strict=True)]
        out = []
        for ex in (self.target, self.draft):
            if ex is not None:
                start = ex.session.get_profiling_start_time_ns()
                events = json.loads(Path(ex.session.end_profiling()).read_text())
                out.append(attribute(events, start, intervals))
        return out


class OrtGenai:
    """One onnxruntime-genai method in its worker process, profiled."""

    def __init__(self, method: str, paths: dict[str, Path], threads: int, tmp: Path):
        self.prefix = str(tmp / f"og-{method.split()[0]}")
        kw: dict[str, Any] = {"draft k=4": dict(draft_dir=str(paths["og-draft"]), num_draft_tokens=4),
                              "ngram k=8": dict(ngram=4, num_draft_tokens=8)}.get(method, {})
        self.worker = peers.OrtGenaiWorker(str(paths["og-target"]), num_threads=threads, profile_prefix=self.prefix, **kw)

    def run(self, ids: list[int], n: int) -> tuple[list[int], float, float, int, int]:
        out, seconds, stats = self.worker.run(ids, n)
        return out, seconds, stats["cpu_s"], int(stats["start_ns"]), int(stats["end_ns"])

    def profiles(self, intervals: list[tuple[int, int]]) -> list[list[tuple[int, float]]]:
        """As Specdec.profiles. The files do not say when each profiler started: each session's first run is placed at
        the start of the first generation (its prefill begins within a millisecond of it)."""
        self.worker.close()  # its sessions end: the profiler writes its files
        out = []
        for pattern in (f"{self.prefix}_2*.json", f"{self.prefix}_draft_2*.json"):
            files = sorted(glob.glob(pattern))
            if files:
                events = json.loads(Path(files[-1]).read_text())
                first = min(e["ts"] for e in events if e.get("name") == "model_run")
                out.append(attribute(events, intervals[0][0] - first * 1000, intervals))
        return out


def attribute(events: list[dict[str, Any]], start_ns: int, intervals: list[tuple[int, int]], slack_ns: int = 2_000_000) -> list[tuple[int, float]]:
    """A session's ``model_run`` events (``ts`` in microseconds after ``start_ns``) per generation interval
    [start, end] (time.time_ns): (runs, seconds in them)."""
    per = [[0, 0.0] for _ in intervals]
    for e in events:
        if e.get("name") != "model_run":
            continue
        t = start_ns + e["ts"] * 1000
        for i, (a, b) in enumerate(intervals):
            if a - slack_ns <= t <= b + slack_ns:
                per[i][0] += 1
                per[i][1] += e["dur"] / 1e6
                break
    return [(n, s) for n, s in per]


def bare_greedy(executor: Any, ids: list[int], n: int) -> list[int]:
    """Target-only greedy decoding of ``n`` tokens as bare as Python gets over ``executor``'s own session and buffers:
    the prompt through forward(), then per token one IOBinding run, an argmax and two ints written (the floor of
    --end_to_end). No checks: the prompt and n fit the engine (the same prompts specdec's runner decodes)."""
    cache = executor.new_cache(1)
    tok = int(executor.forward(cache, [ids], all_logits=False).logits[0, -1].argmax())
    out, pos = [tok], len(ids)
    io = executor._io(cache, 1, 1, 1)  # the one-token call's buffers and binding, as the engine's decode steps use them
    executor._bind_cache(io, cache, 0, 1)
    run, logits, flat_ids, flat_positions = io.run, io.logits, io.flat_ids, io.flat_positions
    for _ in range(n - 1):
        flat_ids[0], flat_positions[0] = tok, pos
        run()
        pos += 1
        tok = int(logits[0, 0].argmax())
        out.append(tok)
    return out


class BareGenaiGraph:
    """The bare loop over onnxruntime-genai's own export of the target (its GroupQueryAttention graph, the K/V buffers
    shared between past and present as its genai_config.json says): what a Python loop reaches on that graph, so that
    --end_to_end tells the graph's share of the gap from the loop's. One session, the runtime's threads."""

    def __init__(self, export: Path, threads: int):
        import onnxruntime as ort

        config = json.loads((export / "genai_config.json").read_text())
        decoder, self.max_len = config["model"]["decoder"], int(config["search"]["max_length"])
        if not config["search"].get("past_present_share_buffer", False):
            raise SystemExit(f"{export}: the bare loop binds past and present K/V to one buffer (past_present_share_buffer)")
        opts = ort.SessionOptions()
        opts.intra_op_num_threads, opts.inter_op_num_threads = threads, 1
        self.session = ort.InferenceSession(str(export / decoder["filename"]), opts, providers=["CPUExecutionProvider"])
        names, shape = decoder["inputs"], (1, decoder["num_key_value_heads"], self.max_len, decoder["head_size"])
        self.kv = [np.zeros(shape, np.float32) for _ in range(2 * decoder["num_hidden_layers"])]  # [1, kv heads, max_len, head]
        values = [ort.OrtValue.ortvalue_from_numpy(a) for a in self.kv]
        self.pairs = [(names[f"past_{kind}_names"] % i, decoder["outputs"][f"present_{kind}_names"] % i, values[2 * i + j])
                      for i in range(decoder["num_hidden_layers"]) for j, kind in enumerate(("key", "value"))]
        self.vocab = self.session.get_outputs()[0].shape[-1]
        self.ones = np.ones((1, self.max_len), np.int64)  # the attention mask: its first total-length columns
        self.ids = np.zeros((1, 1), np.int64)
        self.logits = np.zeros((1, 1, self.vocab), np.float32)  # [1, 1, vocab]
        self.decode = self._binding(self.ids, self.logits)

    def _binding(self, ids: Any, logits: Any) -> Any:
        b = self.session.io_binding()
        for past, present, value in self.pairs:
            b.bind_ortvalue_input(past, value)
            b.bind_ortvalue_output(present, value)
        b.bind_cpu_input("input_ids", ids)
        b.bind_output("logits", "cpu", 0, np.float32, list(logits.shape), logits.ctypes.data)
        return b

    def __call__(self, ids: list[int], n: int) -> list[int]:
        for a in self.kv:
            a[...] = 0
        prompt = np.array([ids], np.int64)
        logits = np.zeros((1, len(ids), self.vocab), np.float32)  # its export returns every prompt row's logits
        prefill = self._binding(prompt, logits)
        prefill.bind_cpu_input("attention_mask", self.ones[:, : len(ids)])
        self.session.run_with_iobinding(prefill)
        tok = int(logits[0, -1].argmax())
        out, total = [tok], len(ids)
        run, decode, ones, flat_ids, last = self.session.run_with_iobinding, self.decode, self.ones, self.ids.reshape(-1), self.logits[0, 0]
        for _ in range(n - 1):
            flat_ids[0] = tok
            total += 1
            decode.bind_cpu_input("attention_mask", ones[:, :total])  # [1, total]: GroupQueryAttention reads the length from it
            run(decode)
            tok = int(last.argmax())
            out.append(tok)
        return out


def runner_from_spec(spec: dict[str, Any]) -> Any:
    """One --end_to_end runner: ids -> (output ids, seconds of the generation). spec["kind"]: "specdec" (a method on an
    Orchestrator over spec["target"] and spec["draft"]; "general": SpeculativeRound.decode_plain off), "bare" (bare_greedy
    over spec["target"]) or "bare_genai" (BareGenaiGraph over spec["export"])."""
    n, threads = spec["n"], spec["threads"]
    if spec["kind"] == "bare_genai":
        graph = BareGenaiGraph(Path(spec["export"]), threads)
        run = lambda ids: graph(ids, n)  # noqa: E731
    else:
        target = open_executor(Path(spec["target"]), threads)
        if spec["kind"] == "bare":
            run = lambda ids: bare_greedy(target, ids, n)  # noqa: E731
        else:
            draft = open_executor(Path(spec["draft"]), threads) if spec["method"].startswith("draft") else None
            orch = Orchestrator(target, *method_proposer(spec["method"], draft))
            if spec.get("general"):
                orch.engine.round.plain_decoding = lambda r: False
            run = lambda ids: orch.generate([ids], GenerationConfig(max_output_len=n, end_ids=()))[0][0].output_ids  # noqa: E731

    def go(ids: list[int]) -> tuple[list[int], float]:
        t = time.perf_counter()
        out = run(ids)
        return out, time.perf_counter() - t
    return go


def serve_runner(spec: dict[str, Any]) -> None:
    """--serve_runner: a runner in a process of its own, as a user's specdec (and each onnxruntime-genai worker) runs:
    a JSON prompt per stdin line, a JSON {"out", "s"} per stdout line; anything else the libraries print goes to stderr."""
    answers = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    go = runner_from_spec(spec)
    for line in sys.stdin:
        out, seconds = go(json.loads(line))
        answers.write(json.dumps({"out": out, "s": seconds}) + "\n")
        answers.flush()


class RunnerProcess:
    """runner_from_spec(spec) in a child process (serve_runner), called as the in-process runner is."""

    def __init__(self, spec: dict[str, Any]):
        import subprocess

        self.proc = subprocess.Popen([sys.executable, __file__, "--serve_runner", json.dumps(spec)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)

    def __call__(self, ids: list[int]) -> tuple[list[int], float]:
        try:
            self.proc.stdin.write(json.dumps(ids) + "\n")
            self.proc.stdin.flush()
            line = self.proc.stdout.readline()
        except OSError:  # BrokenPipeError: it ended before reading the prompt
            line = ""
        if not line:
            raise SystemExit(f"a runner's process ended (exit {self.proc.wait()}): its stderr above says why")
        answer = json.loads(line)
        return answer["out"], answer["s"]

    def close(self) -> None:
        try:
            self.proc.stdin.close()
        except OSError:  # its end of the pipe is gone already
            pass
        try:
            self.proc.wait(timeout=30)
        except Exception:
            self.proc.kill()
            self.proc.wait()


def end_to_end(args: argparse.Namespace, paths: dict[str, Path], prompts: list[list[int]], record: dict[str, Any]) -> None:
    """--end_to_end: each method (target-only, draft k=4, n-gram k=8) on specdec's float32 engines with ONNX Attention
    (``--cpu_kernels ort``) and with specdec's own ops (``--cpu_kernels specdec``), and on onnxruntime-genai; the bare loops
    target-only. Tokens/s per round, prefill included; ratios per round. Every runner in a process of its own, as
    onnxruntime-genai's workers are (``--in_process``: specdec's runners and the bare loops in this one, as before)."""
    n = args.max_new_tokens
    workers: list[Any] = []
    runners: dict[str, Any] = {}
    specs: dict[str, dict[str, Any]] = {}
    common = {"n": n, "threads": args.threads}
    for engines, label in (("", "ort"), ("-ca", "own ops")):
        target, draft = str(paths["target" + engines]), str(paths["draft" + engines])
        for method in METHODS:
            specs[f"specdec {label}: {method}"] = {"kind": "specdec", "target": target, "draft": draft, "method": method, **common}
        if args.general_round and engines:  # the same target-only decoding without SpeculativeRound.decode_plain
            specs[f"specdec {label}: target-only, general round"] = {"kind": "specdec", "target": target, "draft": draft,
                                                                     "method": "target-only", "general": True, **common}
        specs[f"bare loop, {label}"] = {"kind": "bare", "target": target, **common}
    specs["bare loop, genai's graph"] = {"kind": "bare_genai", "export": str(paths["og-target"]), **common}
    record["runners_in_process"] = args.in_process
    try:
        for name, spec in specs.items():
            runner = runner_from_spec(spec) if args.in_process else RunnerProcess(spec)
            if not args.in_process:
                workers.append(runner)
            runners[name] = runner
        if args.process_pairs:  # what the set-up costs: two runners again, in this process
            for name in ("specdec own ops: target-only", "bare loop, genai's graph"):
                runners[f"{name}, in this process"] = runner_from_spec(specs[name])
        for method, kw in {"target-only": {}, "draft k=4": dict(draft_dir=str(paths["og-draft"]), num_draft_tokens=4),
                           "ngram k=8": dict(ngram=4, num_draft_tokens=8)}.items():
            worker = peers.OrtGenaiWorker(str(paths["og-target"]), num_threads=args.threads, **kw)
            workers.append(worker)
            runners[f"onnxruntime-genai: {method}"] = lambda ids, w=worker: w.run(ids, n)[:2]  # its worker's own clock: the pipe left out
        names = list(runners)
        tps: dict[str, list[float]] = {k: [] for k in names}
        outputs: dict[str, list[list[int]]] = {k: [] for k in names}
        for run in runners.values():  # warm-up
            run(prompts[0])
        for r in range(args.rounds):
            spent = {k: [0, 0.0] for k in names}
            for i, ids in enumerate(prompts):
                for k in names[(r + i) % len(names):] + names[: (r + i) % len(names)]:
                    out, seconds = runners[k](ids)
                    spent[k][0] += len(out)
                    spent[k][1] += seconds
                    if r == 0:
                        outputs[k].append(out)
            for k in names:
                tps[k].append(spent[k][0] / spent[k][1])
            print(f"round {r}: " + ", ".join(f"{k} {tps[k][-1]:.0f}" for k in names), flush=True)
    finally:
        for worker in workers:
            try:
                worker.close()
            except Exception as e:  # one that failed must not keep the others open
                print(f"closing a runner: {e}", file=sys.stderr)

    def ratio(a: str, b: str) -> dict[str, float]:
        return spread([x / y for x, y in zip(tps[a], tps[b], strict=True)])

    reference = outputs["specdec ort: target-only"]
    record["results"] = {k: {"tokens_per_s": spread(v), "same_as_specdec_target_only": outputs[k] == reference} for k, v in tps.items()}
    ratios = {}
    for method in ("target-only", "draft k=4", "ngram k=8"):
        for label in ("ort", "own ops"):
            ratios[f"specdec {label} / onnxruntime-genai: {method}"] = ratio(f"specdec {label}: {method}", f"onnxruntime-genai: {method}")
        ratios[f"specdec own ops / ort: {method}"] = ratio(f"specdec own ops: {method}", f"specdec ort: {method}")
    for label in ("ort", "own ops"):
        ratios[f"specdec {label} / its bare loop: target-only"] = ratio(f"specdec {label}: target-only", f"bare loop, {label}")
        ratios[f"bare loop, {label} / bare loop, genai's graph"] = ratio(f"bare loop, {label}", "bare loop, genai's graph")
    ratios["bare loop, genai's graph / onnxruntime-genai: target-only"] = ratio("bare loop, genai's graph", "onnxruntime-genai: target-only")
    if args.process_pairs and not args.in_process:
        for name in ("specdec own ops: target-only", "bare loop, genai's graph"):
            ratios[f"{name}: its own process / this one"] = ratio(name, f"{name}, in this process")
    if args.general_round:
        ours = "specdec own ops: target-only"
        ratios[f"{ours} / its general round"] = ratio(ours, f"{ours}, general round")
    record["ratios"] = ratios
    record["load_average_end"] = list(os.getloadavg())
    print(f"{host.describe(record['host'])}; {args.threads} thread(s); load average {record['host']['load_average'][0]:.2f} -> "
          f"{record['load_average_end'][0]:.2f}")
    for k, v in record["results"].items():
        s = v["tokens_per_s"]
        print(f"{k:<44} {s['median']:8.1f} tok/s [{s['min']:.1f}-{s['max']:.1f}]  same output as target-only: {v['same_as_specdec_target_only']}")
    for k, s in ratios.items():
        print(f"{k:<60} {s['median']:.3f}x [{s['min']:.3f}-{s['max']:.3f}]")


def python_calls(runner: Specdec, prompts: list[list[int]], n: int) -> float:
    """specdec's Python function calls per target call (its rounds and each prompt's prefill) over one pass of the prompts."""
    target_calls = 0
    prof = cProfile.Profile()
    for ids in prompts:
        prof.enable()
        _, m = runner.orch.generate([ids], GenerationConfig(max_output_len=n, end_ids=()))
        prof.disable()
        target_calls += m.rounds + 1
    return pstats.Stats(prof).total_calls / target_calls


def warm_python(paths: dict[str, Path], threads: int, prompts: list[list[int]], n: int, passes: int = 5) -> dict[str, float]:
    """--warm_python: specdec's loop with every ONNX Runtime run after a binding's first one skipped (its outputs stay
    those of that first run): what the Python of a round costs with the interpreter's code and data still in the core's
    caches, microseconds per round (one target call), the best of ``passes`` passes over the prompts, their prefills left
    out. Against the loop's cost beside real runs, the difference is what refilling the caches after each model call
    costs. New sessions (the skipping is bound in as each call shape binds); the drafts meet frozen logits, so n-gram's
    and the draft model's rounds accept differently from the real ones."""
    import specdec.runtime.backends.onnxruntime.cpu as cpu

    real = cpu.direct_run

    def first_run_only(session: Any, binding: Any) -> Any:
        run, ran = real(session, binding), []

        def once() -> None:
            if not ran:
                run()
                ran.append(True)
        return once

    cpu.direct_run = first_run_only
    try:
        out = {}
        with tempfile.TemporaryDirectory(prefix="bench_loop_warm_") as tmp:
            for m in METHODS:
                runner = Specdec(m, paths, threads, Path(tmp), RunTimer())  # a timer: sessions without the profiler
                runner.run(prompts[0], n)
                best = float("inf")
                for _ in range(passes):
                    rounds, seconds = 0, 0.0
                    for ids in prompts:
                        t = time.perf_counter()
                        _, metrics = runner.orch.generate([ids], GenerationConfig(max_output_len=n, end_ids=()))
                        # the prompts' passes (a prefill binds afresh: its run is real) are not the loop's
                        seconds += time.perf_counter() - t - metrics.prompt_target_s - metrics.prompt_draft_s
                        rounds += metrics.rounds
                    best = min(best, seconds / rounds * 1e6)
                out[m] = best
        return out
    finally:
        cpu.direct_run = real


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", required=True, help="the target's HF checkpoint directory")
    ap.add_argument("--draft", required=True, help="the draft's HF checkpoint directory")
    ap.add_argument("--work", required=True, help="engines and exports (made once)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--num_prompts", type=int, default=4)
    ap.add_argument("--prompt_tokens", type=int, default=128)
    ap.add_argument("--max_new_tokens", type=int, default=128)
    ap.add_argument("--runtimes", default="specdec,ortgenai")
    ap.add_argument("--calls", action="store_true", help="also count specdec's Python calls per target call (cProfile)")
    ap.add_argument("--timer", action="store_true", help="specdec's runs timed by a perf_counter around each ONNX Runtime run, its "
                    "sessions without the profiler (onnxruntime-genai keeps its profiler: its loop is C++)")
    ap.add_argument("--end_to_end", action="store_true", help="generations timed whole: every method on both kinds of specdec engine and on "
                    "onnxruntime-genai, and the bare loops (the docstring says what each ratio measures)")
    ap.add_argument("--cached_attention", action="store_true", help="specdec's runs (not --end_to_end's, which has both) on the "
                    "engines built with --cpu_kernels specdec (specdec's own ops) instead of the default ones")
    ap.add_argument("--in_process", action="store_true", help="with --end_to_end: specdec's runners and the bare loops in this "
                    "process (each with its own sessions, beside the others'), not each in its own as onnxruntime-genai's are")
    ap.add_argument("--process_pairs", action="store_true", help="with --end_to_end: also specdec's own-ops target-only and the "
                    "bare loop over genai's graph in this process, beside their own processes (what the set-up costs)")
    ap.add_argument("--serve_runner", default=None, help=argparse.SUPPRESS)  # a runner's child process (serve_runner)
    ap.add_argument("--general_round", action="store_true", help="with --end_to_end: also target-only on the own-ops engines "
                    "through the general round (SpeculativeRound.decode_plain turned off), against the short one")
    ap.add_argument("--warm_python", action="store_true", help="also specdec's loop with the model runs skipped after each call "
                    "shape's first: its Python per target call on warm caches (warm_python's docstring)")
    ap.add_argument("--output_json", default=None)
    if "--serve_runner" in sys.argv:
        serve_runner(json.loads(sys.argv[sys.argv.index("--serve_runner") + 1]))
        return
    args = ap.parse_args()
    if args.process_pairs and args.in_process:
        raise SystemExit("--process_pairs runs two runners in this process beside their own processes: not with --in_process")

    work = Path(args.work)
    if args.end_to_end and "ortgenai" not in args.runtimes.split(","):
        raise SystemExit("--end_to_end runs onnxruntime-genai beside specdec: leave it in --runtimes (benchmarks/README.md: its venv)")
    paths = prepare(args.target, args.draft, work, "ortgenai" in args.runtimes.split(","), args.cached_attention or args.end_to_end)
    prompts = code_prompts(paths["target"], args.num_prompts, args.prompt_tokens)
    n = args.max_new_tokens
    import specdec

    # which specdec ran (PYTHONPATH=<an older tree> measures the loop before a change with this same script)
    record = {"host": host.host_record(bandwidth=False), "args": vars(args), "specdec": str(Path(specdec.__path__[0]).resolve())}
    if args.cached_attention and not args.end_to_end:
        paths = {**paths, "target": paths["target-ca"], "draft": paths["draft-ca"]}
    if args.end_to_end:
        end_to_end(args, paths, prompts, record)
        if args.output_json:
            Path(args.output_json).write_text(json.dumps(record, indent=1) + "\n")
        return
    timer = RunTimer() if args.timer else None
    if timer:
        timer.install()
    with tempfile.TemporaryDirectory(prefix="bench_loop_") as tmp:
        runners = {(rt, m): Specdec(m, paths, args.threads, Path(tmp), timer) if rt == "specdec" else OrtGenai(m, paths, args.threads, Path(tmp))
                   for rt in args.runtimes.split(",") for m in METHODS}
        names = list(runners)
        timed: dict[tuple[str, str], list[tuple[int, float, float]]] = {k: [] for k in names}  # per generation: round, wall, CPU
        intervals: dict[tuple[str, str], list[tuple[int, int]]] = {k: [] for k in names}  # per generation: start, end (ns)
        outputs: dict[tuple[str, str], list[list[int]]] = {k: [] for k in names}
        for k in names:  # warm-up: one generation each (its profile's first)
            *_, a, b = runners[k].run(prompts[0], n)
            intervals[k].append((a, b))
        for r in range(args.rounds):
            for i, ids in enumerate(prompts):
                for k in names[(r + i) % len(names):] + names[: (r + i) % len(names)]:
                    out, wall, cpu, a, b = runners[k].run(ids, n)
                    timed[k].append((r, wall, cpu))
                    intervals[k].append((a, b))
                    if r == 0:
                        outputs[k].append(out)
        results: dict[str, Any] = {}
        profiles = {k: runners[k].profiles(intervals[k]) for k in names}  # the profilers stop: the --calls pass is not in them
        calls = {m: python_calls(runners[("specdec", m)], prompts, n) for m in METHODS} if args.calls and "specdec" in args.runtimes else {}
        warm = warm_python(paths, args.threads, prompts, n) if args.warm_python and "specdec" in args.runtimes else {}
        for k in names:
            sessions = profiles[k]
            per_round: dict[int, list[float]] = {}
            for g, (r, wall, cpu) in enumerate(timed[k], start=1):
                target_runs = sessions[0][g][0]
                model_s = sum(s[g][1] for s in sessions)
                acc = per_round.setdefault(r, [0.0, 0.0, 0.0, 0.0])
                acc[0] += wall - model_s
                acc[1] += target_runs
                acc[2] += wall
                acc[3] += cpu
            tokens = n * len(prompts)
            results[" ".join(k)] = {
                "loop_us_per_target_call": spread([a[0] / a[1] * 1e6 for a in per_round.values()]),
                # the same, scaled by the round's CPU / wall: on a busy machine the wall time of both parts stretches
                "loop_cpu_us_per_target_call": spread([a[0] * (a[3] / a[2]) / a[1] * 1e6 for a in per_round.values()]),
                "target_calls_per_round": spread([a[1] for a in per_round.values()]),
                "tokens_per_s": spread([tokens / a[2] for a in per_round.values()]),
                "tokens_per_cpu_s": spread([tokens / a[3] for a in per_round.values()]),
                **({"python_calls_per_target_call": calls[k[1]]} if k[0] == "specdec" and calls else {}),
                **({"warm_python_us_per_target_call": warm[k[1]]} if k[0] == "specdec" and warm else {}),
                "same_as_target_only": outputs[k] == outputs[(k[0], "target-only")],
            }
    record["load_average_end"] = list(os.getloadavg())
    record["results"] = results
    print(f"{host.describe(record['host'])}; {args.threads} thread(s); "
          f"load average {record['host']['load_average'][0]:.2f} -> {record['load_average_end'][0]:.2f}")
    def fmt(s: dict[str, float], f: str = "{:.1f}") -> str:
        return f"{f.format(s['median'])} [{f.format(s['min'])}-{f.format(s['max'])}]"

    print(f"{'runtime / method':<26}{'loop us / target call':>26}{'(x CPU / wall)':>26}{'target calls':>14}{'tokens/s':>22}"
          f"{'tokens/CPU-s':>22}  py calls  warm us  == TO")
    for name, v in results.items():
        print(f"{name:<26}{fmt(v['loop_us_per_target_call']):>26}{fmt(v['loop_cpu_us_per_target_call']):>26}{v['target_calls_per_round']['median']:>14.0f}{fmt(v['tokens_per_s']):>22}"
              f"{fmt(v['tokens_per_cpu_s']):>22}  {v.get('python_calls_per_target_call', float('nan')):8.1f}"
              f"  {v.get('warm_python_us_per_target_call', float('nan')):7.1f}  {v['same_as_target_only']}")
    if args.output_json:
        Path(args.output_json).write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
