"""Weight-only engines on the realistic-cost pair, against llama.cpp and onnxruntime-genai (issues 13, 26).

    # once: engines, GGUFs and onnxruntime-genai exports under --work (skips what exists)
    python benchmarks/bench_weight_only.py prepare --work /tmp/big --llama_cpp LLAMA_CPP_DIR \\
        --peers_python /work/venv-peers/bin/python
    # the measurement: interleaved rounds at 2 threads, then at 1
    python benchmarks/bench_weight_only.py run --work /tmp/big --llama_cpp LLAMA_CPP_DIR \\
        --peers_python /work/venv-peers/bin/python --threads 2,1 --rounds 3 --output_json wo.json

Batch 1, greedy, the same token ids and the same number of new tokens (EOS
ignored) for every method. Prompts: benchmarks/prompts.py, half ordinary (the
start of a function) and half copy-heavy (a function, then a request to repeat
it: n-gram drafting's case), reported apart and together.

Methods, per precision (fp32, int8, int4, and q4gemm: int4 engines built with
--cpu_kernels specdec, specdec's own int4 op, compared with the peers' 4-bit
engines; gguf: q4gemm engines built from llama.cpp's Q4_0 files themselves, so
both compute with the same weights; llama.cpp's f32, Q8_0, Q4_0; the onnxruntime-genai builder's fp32 and
int4), target-only at every precision (--bits) and the speculative modes at
--spec_bits (default int8, int4):

* specdec: target-only, draft-target k=4 and k=auto (a draft engine of the
  same precision), draft-target k=4 with the float32 draft, n-gram (k=8,
  matching up to 3 tokens; and k=auto), Medusa chain k=3 and k=auto with its
  heads in float32 and quantized (``medusa qheads``; engine-medusa[-qheads]-BITS),
  EAGLE-3 chain k=3 and k=auto (when
  engine-eagle[-BITS] exists: benchmarks/README.md says how it is built), the
  same with the module quantized as the target (``eagle qmodule``, from
  engine-eagle-qmodule-BITS, built with --quantize_draft_heads), and P-EAGLE
  chain k=4 and k=auto with its module quantized (engine-peagle-qmodule-BITS);
* llama.cpp, --llama_tools cli (the default; llama.cpp's own timers):
  `llama-completion` target-only, `llama-lookup` (its n-gram cache, 8
  drafts), `llama-speculative-simple` with the draft GGUF of the same type
  (`--spec-type draft-simple`, 4 drafts) and with `--spec-type ngram-simple`
  and `ngram-map-k` (a 3-token key, 8 drafts);
  --llama_tools server: `llama-server`, one slot: target-only, its
  draft-model speculation (`--spec-type draft-simple`, 4 drafts), its n-gram
  drafters (`ngram-simple` and `ngram-map-k`, a 3-token key and 8-token
  drafts);
* onnxruntime-genai: target-only, its draft-model speculation (4 drafts),
  its n-gram decoding (ngram_size 3, 8 drafts).

Each method is loaded once per thread count (load time reported apart), warmed
up, then every round runs prompt by prompt, every method in turn on each
prompt (the order rotated each round), so the methods compared share each
stretch of machine load. Per prompt, the wall time of prefill + decode is
timed (for llama-server, of the HTTP request; for llama.cpp's tools, by their
own timers: prompt eval + decode), and the CPU time of the process that did
the work (specdec: this one; llama-server; the onnxruntime-genai worker; not
for llama.cpp's tools, one process per prompt, whose CPU time would count the
model load): with one thread, tokens per CPU second is the work each method
needs, whatever the other jobs on the machine do. Decode-only tokens/s leaves
the prefill out: specdec's (tokens - 1) / (seconds - time to first token),
llama.cpp's tokens / its decode seconds. Reported per method: tokens/s
median and min-max over rounds, and the ratio to specdec fp32 target-only in
the same round (median, min-max): on a shared machine the ratio is the figure
to read. Exactness: whether each method's output equals its own target-only
output at the same precision (specdec's speculation must; llama.cpp and
onnxruntime-genai may differ where their verification kernels round
differently), and the token agreement with specdec fp32 and, for specdec's
rows, with llama.cpp's target-only of the same GGUF type (and how many outputs
are identical to it).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import host  # noqa: E402
from prompts import spread, workloads  # noqa: E402

from specdec.bench import peers  # noqa: E402
from specdec.bench.plots import Bar, beside, spread_bar, write_bars  # noqa: E402

BITS = ("fp32", "int8", "int4", "q4gemm", "gguf")
# q4gemm: the int4 engines built with --cpu_kernels specdec (specdec's own int4 op, plugins/cpu_kernels.py); the
# peers have no such variant, so it is compared with their 4-bit engines. gguf: q4gemm engines built from llama.cpp's
# Q4_0 files themselves (specdec-build --checkpoint_dir FILE.gguf: the same weights as llama.cpp's, bit for bit)
PEER_BITS = {"q4gemm": "int4", "gguf": "int4"}
LLAMA_TYPE = {"fp32": "f32", "int8": "q8_0", "int4": "q4_0", "q4gemm": "q4_0", "gguf": "q4_0"}
ORTGENAI_PRECISION = {"fp32": "fp32", "int4": "int4"}  # its builder's int8 is not a weight-only CPU path
BASE = "specdec fp32 target-only"
WORKLOADS = ("ordinary", "copy-heavy", "all")


class Runner(Protocol):
    load_s: float

    def run(self, ids: list[int], n: int) -> tuple[list[int], float, dict[str, Any]]: ...

    def cpu_s(self) -> float: ...

    def close(self) -> None: ...


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process so far (Linux /proc; clock-tick resolution)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class Method:
    name: str
    family: str  # specdec | llama.cpp | ortgenai
    bits: str  # fp32 | int8 | int4
    mode: str  # one of MODES
    open: Callable[[], Runner]
    runner: Runner | None = None
    rounds: list[dict[str, Any]] = field(default_factory=list)


# --------------------------------------------------------------------------- layout


@dataclass(frozen=True)
class Layout:
    """Where `prepare` puts everything and `run` finds it."""

    work: Path

    def ckpt(self, role: str) -> Path:
        return self.work / role

    def engine(self, role: str, bits: str) -> Path:
        return self.work / (f"engine-{role}" if bits == "fp32" else f"engine-{role}-{bits}")

    def tokenizer_dir(self) -> Path:
        """A target engine whose tokenizer files encode the prompts: the fp32 one, or any that was prepared."""
        for bits in BITS:
            if (self.engine("target", bits) / "config.json").is_file():
                return self.engine("target", bits)
        raise FileNotFoundError(f"no target engine under {self.work}: run `prepare` first")

    def gguf(self, role: str, bits: str) -> Path:
        return self.work / "gguf" / f"{role}-{LLAMA_TYPE[bits]}.gguf"

    def ortgenai(self, role: str, bits: str) -> Path:
        return self.work / "ortgenai" / f"{role}-{ORTGENAI_PRECISION[bits]}"


def llama_bin(llama_cpp: Path, tool: str) -> Path:
    return llama_cpp / "build" / "bin" / tool


# --------------------------------------------------------------------------- prepare


def prepare_commands(lay: Layout, llama_cpp: Path | None, peers_python: str | None, target_preset: str = "target325m",
                     bits_list: tuple[str, ...] = BITS, gguf_source: str = "f32") -> list[tuple[Path, list[str], dict[str, str]]]:
    """(output it makes, command, extra env) for everything the run needs, in order. ``target_preset``: enlarge.py's
    (target1b5 for the pair bigger than any CPU cache, stored in bfloat16); ``gguf_source``: the type the converter
    writes and llama-quantize reads (bf16 for a bfloat16 checkpoint: exact, half the disk of f32)."""
    py = sys.executable
    cmds: list[tuple[Path, list[str], dict[str, str]]] = []
    demo = HERE.parent / "examples" / "demo-pair"
    for role, preset in (("target", target_preset), ("draft", "draft")):
        dtype = ["--dtype", "bfloat16"] if preset == "target1b5" else []  # 3 GB, not 6: within a shared 24 GiB machine
        cmds.append((lay.ckpt(role), [py, str(HERE / "enlarge.py"), "--preset", preset, *dtype, str(demo / role), str(lay.ckpt(role)), "--quiet"],
                     {}))
    build = [str(Path(py).with_name("specdec-build")), "--dtype", "float32", "--max_batch_size", "1", "--max_input_len", "512", "--max_seq_len",
             "1024"]
    role_flags = {"target": ["--max_draft_len", "8", "--speculative_decoding_mode", "draft_tokens_external"], "draft": []}  # targets verify drafts
    for bits in [b for b in bits_list if b != "gguf"]:  # gguf: from the GGUF files, below
        wo = [] if bits == "fp32" else ["--use_weight_only", "--weight_only_precision", PEER_BITS.get(bits, bits)]
        wo += ["--cpu_kernels", "specdec"] if bits == "q4gemm" else []
        for role in ("target", "draft"):
            cmds.append((lay.engine(role, bits), [*build, "--checkpoint_dir", str(lay.ckpt(role)), "--output_dir", str(lay.engine(role, bits)), *wo,
                                                 *role_flags[role]], {}))
    # Medusa, EAGLE-3 and P-EAGLE at int4: the demo pair's trained heads, enlarged to the target's widths, in int4 targets:
    # Medusa's and EAGLE-3's heads in float32 (the default) and int4 as the target (--quantize_draft_heads), P-EAGLE's int4
    for kind in HEAD_KINDS:
        heads = lay.work / f"heads-{kind}"
        cmds.append((heads, [py, str(HERE / "enlarge.py"), "--heads", str(demo / "heads" / kind), "--base", str(lay.ckpt("target")), str(heads),
                             "--quiet"], {}))
        for bits in [b for b in ("int4", "q4gemm") if b in bits_list]:
            for role in ((kind, f"{kind}-{QUANTIZED[kind]}") if kind != "peagle" else (f"{kind}-qmodule",)):
                out = lay.engine(role, bits)
                cmds.append((out, [*build, "--checkpoint_dir", str(lay.ckpt("target")), "--output_dir", str(out), "--use_weight_only",
                                   "--weight_only_precision", "int4", "--max_draft_len", "8", "--speculative_decoding_mode", kind,
                                   f"--{kind}_dir", str(heads), *(["--quantize_draft_heads"] if role != kind else []),
                                   *(["--cpu_kernels", "specdec"] if bits == "q4gemm" else [])], {}))
    if llama_cpp is not None:
        converter = [peers_python or py, str(llama_cpp / "convert_hf_to_gguf.py")]
        env = {"PYTHONPATH": str(llama_cpp / "gguf-py")}
        for role in ("target", "draft"):
            f32 = lay.work / "gguf" / f"{role}-{gguf_source}.gguf" if role == "target" else lay.gguf(role, "fp32")
            cmds.append((f32, [*converter, str(lay.ckpt(role)), "--outtype", gguf_source if role == "target" else "f32", "--outfile", str(f32)], env))
            for bits in [b for b in ("int8", "int4") if b in bits_list or (b == "int4" and {"q4gemm", "gguf"} & set(bits_list))]:
                cmds.append((lay.gguf(role, bits),
                             [str(llama_bin(llama_cpp, "llama-quantize")), str(f32), str(lay.gguf(role, bits)), LLAMA_TYPE[bits].upper(), "2"], {}))
            if "gguf" in bits_list:  # specdec's engine from llama.cpp's own Q4_0 file
                cmds.append((lay.engine(role, "gguf"), [*build, "--checkpoint_dir", str(lay.gguf(role, "int4")), "--output_dir",
                                                        str(lay.engine(role, "gguf")), "--cpu_kernels", "specdec", *role_flags[role]], {}))
    if peers_python is not None:
        for role in ("target", "draft"):
            for bits in ORTGENAI_PRECISION:
                out = lay.ortgenai(role, bits)
                cmds.append((out, [peers_python, "-m", "onnxruntime_genai.models.builder", "-i", str(lay.ckpt(role)), "-o", str(out),
                                   "-p", ORTGENAI_PRECISION[bits], "-e", "cpu", "-c", str(lay.work / "ortgenai" / "cache")],
                             {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}))
    return cmds


def prepare(args: argparse.Namespace) -> int:
    lay = Layout(Path(args.work))
    (lay.work / "gguf").mkdir(parents=True, exist_ok=True)
    (lay.work / "logs").mkdir(parents=True, exist_ok=True)
    for out, cmd, env in prepare_commands(lay, args.llama_cpp, args.peers_python, args.target_preset, tuple(args.prepare_bits.split(",")),
                                          args.gguf_source):
        shown = " ".join(f"{k}={v}" for k, v in env.items()) + (" " if env else "") + " ".join(cmd)
        if out.exists():
            print(f"have {out}")
            continue
        print(f"$ {shown}", flush=True)
        log = lay.work / "logs" / f"prepare-{out.name}.log"
        with open(log, "w") as f:
            rc = subprocess.call(cmd, stdout=f, stderr=subprocess.STDOUT, env={**os.environ, **env})
        if rc != 0:
            print(f"error: exit {rc}; see {log}", file=sys.stderr)
            return 1
    return 0


# --------------------------------------------------------------------------- runners


class SpecdecRunner:
    """One specdec Orchestrator over executors shared with the other specdec methods."""

    def __init__(self, orch: Any, load_s: float) -> None:
        self.orch, self.load_s = orch, load_s

    def run(self, ids: list[int], n: int) -> tuple[list[int], float, dict[str, Any]]:
        from specdec.runtime import GenerationConfig

        t0, c0 = time.perf_counter(), time.process_time()
        outs, m = self.orch.generate([ids], GenerationConfig(max_output_len=n, end_ids=()))
        dt, cpu = time.perf_counter() - t0, time.process_time() - c0
        out = list(outs[0].output_ids)
        # decode-only CPU: its wall seconds x the generation's CPU / wall (as llama_cli.py scales llama.cpp's timers)
        decode = {"decode_s": dt - m.ttft_s[0], "decode_tokens": len(out) - 1, "decode_cpu_s": (dt - m.ttft_s[0]) * cpu / dt} if m.ttft_s else {}
        return out, dt, {"drafted": m.drafted, "accepted": m.accepted, "draft_s": m.round_draft_s, "target_s": m.round_target_s,
                         "rounds": m.rounds, **decode}  # the rounds' own times: not the prefill, nor the proposers' prompt passes

    def cpu_s(self) -> float:
        return time.process_time()  # this process: specdec runs in it

    def close(self) -> None:
        self.orch = None


class SpecdecEngines:
    """Target and draft executors per precision, each loaded once (its load time kept)."""

    def __init__(self, lay: Layout, threads: int) -> None:
        self.lay, self.threads = lay, threads
        self.executors: dict[tuple[str, str], Any] = {}
        self.load_s: dict[str, float] = {}

    def executor(self, role: str, bits: str, target_bits: str | None = None) -> Any:
        """role target | draft | eagle (the EAGLE target's executor and module, as a pair); a draft of ``bits``
        placed beside the target of ``target_bits`` (default the same)."""
        from specdec.runtime import DraftTargetConfig, load_orchestrator
        from specdec.runtime.loading import load_engine

        tb = target_bits or bits
        key = (role, bits)
        if key not in self.executors:
            t0 = time.perf_counter()
            target = self.lay.engine("target", tb)
            if role == "target":
                ex = load_orchestrator(target, num_threads=self.threads).target
            elif role.split("-")[0] in HEAD_KINDS:  # a Medusa / EAGLE-3 / P-EAGLE target and its module's executor (Medusa: none)
                path = self.lay.engine(role, bits)
                if not path.is_dir():
                    raise FileNotFoundError(f"{path} is not built")
                engine = load_engine(path, num_threads=self.threads)
                ex = (engine.target, getattr(engine.proposers[role.split("-")[0]], "module", None))
            else:  # the draft's placement (one thread) is load_orchestrator's, as specdec-run does it
                ex = load_orchestrator(target, self.lay.engine("draft", bits), DraftTargetConfig(4, [0], [0], False),
                                       num_threads=self.threads, target_executor=self.executor("target", tb)).proposer.executor
            self.load_s[f"{role} {bits}"] = time.perf_counter() - t0
            self.executors[key] = ex
        return self.executors[key]

    def runner(self, bits: str, mode: str) -> SpecdecRunner:
        from specdec.runtime import Orchestrator
        from specdec.runtime.proposers.draft_model import DraftModelProposer
        from specdec.runtime.proposers.eagle import EagleProposer
        from specdec.runtime.proposers.medusa import MedusaProposer
        from specdec.runtime.proposers.ngram import NGramProposer
        from specdec.runtime.proposers.peagle import PEagleProposer

        k = mode.split()[-1].removeprefix("k=")
        draft_len = k if k == "auto" else int(k) if k.isdigit() else 8
        if mode.split()[0] in HEAD_KINDS:
            role = head_role(mode)
            target, module = self.executor(role, bits)
            proposer = MedusaProposer(target) if module is None else (EagleProposer if mode.startswith("eagle") else PEagleProposer)(target, module)
            return SpecdecRunner(Orchestrator(target, proposer, draft_len=draft_len), self.load_s.get(f"{role} {bits}", 0.0))
        target = self.executor("target", bits)
        draft_bits = "fp32" if mode.startswith("draft fp32") else bits
        if mode == "target-only":
            orch = Orchestrator(target)
        elif mode.startswith("draft"):
            orch = Orchestrator(target, DraftModelProposer(self.executor("draft", draft_bits, bits)), draft_len=draft_len)
        else:
            orch = Orchestrator(target, NGramProposer(8, 3), draft_len=draft_len)
        loads = [self.load_s.get(f"target {bits}", 0.0)] + ([self.load_s.get(f"draft {draft_bits}", 0.0)] if mode.startswith("draft") else [])
        return SpecdecRunner(orch, sum(loads))


class PeerRunner:
    """A peers.LlamaServer or peers.OrtGenaiWorker with the stats renamed to drafted/accepted."""

    def __init__(self, handle: Any, drafted_key: str, accepted_key: str) -> None:
        self.handle, self.load_s = handle, handle.load_s
        self.keys = (drafted_key, accepted_key)

    def run(self, ids: list[int], n: int) -> tuple[list[int], float, dict[str, Any]]:
        out, dt, stats = self.handle.run(ids, n)
        return out, dt, {"drafted": stats.get(self.keys[0], 0), "accepted": stats.get(self.keys[1], 0), **stats}

    def cpu_s(self) -> float:
        return process_cpu_s(self.handle.proc.pid)  # the server or worker process

    def close(self) -> None:
        self.handle.close()


# --------------------------------------------------------------------------- the methods


MODES = ("target-only", "draft k=4", "draft auto", "draft fp32 k=4", "ngram", "ngram auto", "medusa k=3", "medusa auto", "medusa qheads k=3",
         "medusa qheads auto", "eagle k=3", "eagle auto", "eagle qmodule k=3", "eagle qmodule auto", "peagle qmodule k=4", "peagle qmodule auto")
HEAD_KINDS = ("medusa", "eagle", "peagle")  # the modes that draft with the target's own heads
QUANTIZED = {"medusa": "qheads", "eagle": "qmodule", "peagle": "qmodule"}  # a mode's word for heads built with --quantize_draft_heads


def head_role(mode: str) -> str:
    """The engine a Medusa / EAGLE-3 / P-EAGLE mode runs: its heads in float32 (medusa, eagle) or built with
    --quantize_draft_heads (medusa-qheads, eagle-qmodule, peagle-qmodule)."""
    kind, variant = mode.split()[:2]
    return f"{kind}-{variant}" if variant == QUANTIZED[kind] else kind


def specdec_methods(lay: Layout, engines: SpecdecEngines, bits_list: list[str], spec_bits: list[str]) -> list[Method]:
    out = []
    for bits in bits_list:
        for mode in MODES if bits in spec_bits else MODES[:1]:
            if mode.split()[0] in HEAD_KINDS and not lay.engine(head_role(mode), bits).is_dir():
                continue
            if mode.startswith("draft fp32") and bits == "fp32":
                continue
            out.append(Method(f"specdec {bits} {mode}", "specdec", bits, mode, lambda b=bits, m=mode: engines.runner(b, m)))
    return out


# llama.cpp's n-gram drafters, sized like specdec's n-gram (3-token key, 8 drafts); their defaults
# (12-token keys, 48 drafts) never matched on these prompts
LLAMA_NGRAM = {
    "simple": {"spec_type": "ngram-simple", "spec_args": ["--spec-ngram-simple-size-n", "3", "--spec-ngram-simple-size-m", "8"]},
    "map-k": {"spec_type": "ngram-map-k", "spec_args": ["--spec-ngram-map-k-size-n", "3", "--spec-ngram-map-k-size-m", "8"]},
}


def llama_methods(lay: Layout, server: Path, threads: int, bits_list: list[str], spec_bits: list[str], ngrams: list[str],
                  log_dir: Path) -> list[Method]:
    out = []
    for bits in [b for b in bits_list if b not in PEER_BITS]:
        model = str(lay.gguf("target", bits))
        variants: dict[str, dict[str, Any]] = {"target-only": {}}
        if bits in spec_bits:
            variants["draft k=4"] = {"draft": str(lay.gguf("draft", bits)), "num_draft_tokens": 4}
            variants.update({f"ngram {g}": LLAMA_NGRAM[g] for g in ngrams})
        for mode, kw in variants.items():
            log = str(log_dir / f"llama-{LLAMA_TYPE[bits]}-{mode.replace(' ', '').replace('=', '')}-t{threads}.log")

            def open_(kw: dict = kw, log: str = log, model: str = model) -> Runner:
                return PeerRunner(peers.LlamaServer(str(server), model, threads, log_path=log, **kw), "draft_n", "draft_n_accepted")

            out.append(Method(f"llama.cpp {LLAMA_TYPE[bits]} {mode}", "llama.cpp", bits, mode, open_))
    return out


def llama_cli_methods(lay: Layout, llama_cpp: Path, threads: int, bits_list: list[str], spec_bits: list[str], log_dir: Path) -> list[Method]:
    """llama.cpp's tools (benchmarks/llama_cli.py): target-only by llama-completion, speculation by llama-lookup
    and llama-speculative-simple."""
    from llama_cli import LlamaCliRunner

    from specdec.formats.tokenizer import Tokenizer

    tok = Tokenizer(lay.tokenizer_dir())
    out = []
    for bits in [b for b in bits_list if b not in PEER_BITS]:
        model = lay.gguf("target", bits)
        variants: dict[str, tuple[str, list[str]]] = {"target-only": ("llama-completion", [])}
        if bits in spec_bits:
            variants["lookup"] = ("llama-lookup", ["--spec-draft-n-max", "8"])
            variants["draft k=4"] = ("llama-speculative-simple", ["-md", str(lay.gguf("draft", bits)), "--spec-type", "draft-simple",
                                                                   "--spec-draft-n-max", "4", "--spec-draft-n-min", "0", "-td", "1"])
            for kind in ("ngram-simple", "ngram-map-k"):  # a 3-token key and 8-token drafts, as specdec's n-gram
                flag = kind.replace("ngram-", "--spec-ngram-")
                variants[kind] = ("llama-speculative-simple", ["--spec-type", kind, f"{flag}-size-n", "3", f"{flag}-size-m", "8",
                                                                "--spec-draft-n-max", "8"])
        for mode, (tool, extra) in variants.items():
            log = log_dir / f"llama-{LLAMA_TYPE[bits]}-{mode.replace(' ', '').replace('=', '')}-t{threads}.log"

            def open_(tool: str = tool, extra: list = extra, model: Path = model, log: Path = log) -> Runner:
                return LlamaCliRunner(llama_bin(llama_cpp, tool), model, threads, extra, tok.decode,
                                      lambda text: tok.encode(text, add_special_tokens=False), log)

            out.append(Method(f"llama.cpp {LLAMA_TYPE[bits]} {mode}", "llama.cpp", bits, mode, open_))
    return out


def ortgenai_methods(lay: Layout, threads: int, bits_list: list[str], spec_bits: list[str]) -> list[Method]:
    out = []
    for bits in [b for b in bits_list if b in ORTGENAI_PRECISION]:
        target = str(lay.ortgenai("target", bits))
        variants: dict[str, dict[str, Any]] = {"target-only": {}}
        if bits in spec_bits:
            variants["draft k=4"] = {"draft_dir": str(lay.ortgenai("draft", bits)), "num_draft_tokens": 4}
            variants["ngram"] = {"ngram": 3, "num_draft_tokens": 8}
        for mode, kw in variants.items():

            def open_(kw: dict = kw, target: str = target) -> Runner:
                return PeerRunner(peers.OrtGenaiWorker(target, num_threads=threads, **kw), "draft_tokens_evaluated", "draft_tokens_accepted")

            out.append(Method(f"ortgenai {ORTGENAI_PRECISION[bits]} {mode}", "ortgenai", bits, mode, open_))
    return out


# --------------------------------------------------------------------------- measuring


def rotated(methods: list[Method], round_index: int, rounds: int) -> list[Method]:
    """Each round starts elsewhere in the list, so no method always runs right after the same one."""
    shift = (round_index * len(methods)) // max(rounds, 1)
    return methods[shift:] + methods[:shift]


def run_round(methods: list[Method], prompts: list[list[int]], n_new: int, round_index: int, rounds: int) -> None:
    """Prompt by prompt, every method in turn: the methods compared share each stretch of machine load."""
    live = [m for m in rotated(methods, round_index, rounds) if m.runner is not None]
    rec = {m.name: {"output_ids": [], "seconds": [], "cpu_s": [], "decode_s": [], "decode_cpu_s": [], "decode_tokens": [],
                    "drafted": 0.0, "accepted": 0.0,
                    "draft_s": 0.0, "target_s": 0.0, "rounds": 0} for m in live}
    for ids in prompts:
        for m in live:
            r = rec[m.name]
            cpu0 = m.runner.cpu_s()
            out, dt, stats = m.runner.run(ids, n_new)
            r["cpu_s"].append(m.runner.cpu_s() - cpu0)
            r["output_ids"].append(out)
            r["seconds"].append(dt)
            r["decode_s"].append(stats.get("decode_s"))
            r["decode_cpu_s"].append(stats.get("decode_cpu_s"))
            r["decode_tokens"].append(stats.get("decode_tokens"))
            for key in ("draft_s", "target_s", "rounds"):
                r[key] += stats.get(key) or 0
            r["drafted"] += float(stats.get("drafted") or 0)
            r["accepted"] += float(stats.get("accepted") or 0)
    for m in live:
        m.rounds.append(rec[m.name])
        tokens = sum(map(len, rec[m.name]["output_ids"]))
        print(f"    round {round_index + 1} {m.name:<34} {tokens / sum(rec[m.name]['seconds']):7.1f} tokens/s "
              f"{tokens / max(sum(rec[m.name]['cpu_s']), 1e-9):7.1f} tokens/CPU-s", flush=True)


def open_all(methods: list[Method], warm_prompt: list[int]) -> dict[str, str]:
    """Load and warm every method; a method that cannot load is dropped with its reason."""
    skipped = {}
    for m in methods:
        try:
            m.runner = m.open()
            m.runner.run(warm_prompt, 8)  # first-call allocations and page faults happen here, not in round 1
        except (NotImplementedError, RuntimeError, ValueError, FileNotFoundError, OSError) as err:
            skipped[m.name] = str(err).splitlines()[0]
            print(f"  skipped {m.name}: {skipped[m.name]}", flush=True)
            if m.runner is not None:
                m.runner.close()
            m.runner = None
        else:
            print(f"  loaded {m.name:<34} {m.runner.load_s:6.2f} s", flush=True)
    return skipped


def close_all(methods: list[Method]) -> None:
    for m in methods:
        if m.runner is not None:
            m.runner.close()
            m.runner = None


# --------------------------------------------------------------------------- figures


def tokens_per_s(rnd: dict[str, Any], idx: list[int]) -> float:
    return sum(len(rnd["output_ids"][i]) for i in idx) / sum(rnd["seconds"][i] for i in idx)


def decode_tokens_per_s(rnd: dict[str, Any], idx: list[int]) -> float | None:
    """Tokens/s leaving the prefill out, where the method reports it."""
    if any(rnd["decode_s"][i] is None for i in idx):
        return None
    return sum(rnd["decode_tokens"][i] for i in idx) / sum(rnd["decode_s"][i] for i in idx)


def decode_tokens_per_cpu_s(rnd: dict[str, Any], idx: list[int]) -> float | None:
    """Decode-only tokens per CPU second, where the method reports its decode's CPU time."""
    cpu = rnd.get("decode_cpu_s") or [None] * len(rnd["seconds"])
    if any(cpu[i] is None for i in idx):
        return None
    return sum(rnd["decode_tokens"][i] for i in idx) / max(sum(cpu[i] for i in idx), 1e-9)


def tokens_per_cpu_s(rnd: dict[str, Any], idx: list[int]) -> float:
    return sum(len(rnd["output_ids"][i]) for i in idx) / max(sum(rnd["cpu_s"][i] for i in idx), 1e-9)


def agreement(a: list[list[int]], b: list[list[int]]) -> float:
    same = sum(x == y for p, q in zip(a, b, strict=False) for x, y in zip(p, q, strict=False))
    return same / max(1, sum(len(p) for p in a))


def summarize(methods: list[Method], subsets: dict[str, list[int]]) -> dict[str, dict[str, Any]]:
    """Per method: tokens/s and ratio to BASE (same round) per workload, acceptance, exactness."""
    by_name = {m.name: m for m in methods if m.rounds}
    base = by_name.get(BASE)
    out: dict[str, dict[str, Any]] = {}
    for m in by_name.values():
        own_to = by_name.get(f"{m.family} {m.name.split()[1]} target-only")
        row: dict[str, Any] = {"family": m.family, "bits": m.bits, "mode": m.mode, "load_s": m.runner.load_s if m.runner else None}
        for w, idx in subsets.items():
            tps = [tokens_per_s(r, idx) for r in m.rounds]
            tpc = [tokens_per_cpu_s(r, idx) for r in m.rounds]
            row[w] = {"tokens_per_s": spread(tps), "tokens_per_cpu_s": spread(tpc)}
            dec = [decode_tokens_per_s(r, idx) for r in m.rounds]
            if all(d is not None for d in dec):
                row[w]["decode_tokens_per_s"] = spread(dec)
            dec_cpu = [decode_tokens_per_cpu_s(r, idx) for r in m.rounds]
            if all(d is not None for d in dec_cpu):
                row[w]["decode_tokens_per_cpu_s"] = spread(dec_cpu)
            if base is not None and len(base.rounds) == len(m.rounds):
                row[w]["vs_base"] = spread([t / tokens_per_s(b, idx) for t, b in zip(tps, base.rounds, strict=True)])
                row[w]["vs_base_cpu"] = spread([t / tokens_per_cpu_s(b, idx) for t, b in zip(tpc, base.rounds, strict=True)])
        drafted = sum(r["drafted"] for r in m.rounds)
        row["acceptance"] = sum(r["accepted"] for r in m.rounds) / drafted if drafted else None
        rounds, target_s = sum(r.get("rounds", 0) for r in m.rounds), sum(r.get("target_s", 0.0) for r in m.rounds)
        # what drafting costs a round, as a share of the target's verification in it (specdec's own timers: the rounds'
        # time only, not the prompts' prefill nor the proposers' passes over the prompts)
        row["draft_per_round_ms"] = 1e3 * sum(r.get("draft_s", 0.0) for r in m.rounds) / rounds if rounds else None
        row["target_per_round_ms"] = 1e3 * target_s / rounds if rounds else None
        outputs = m.rounds[0]["output_ids"]
        row["stable_across_rounds"] = all(r["output_ids"] == outputs for r in m.rounds)
        row["equals_own_target_only"] = None if own_to is None or own_to is m else all(
            r["output_ids"] == t["output_ids"] for r, t in zip(m.rounds, own_to.rounds, strict=False))
        row["agreement_with_specdec_fp32"] = agreement(outputs, base.rounds[0]["output_ids"]) if base else None
        # llama.cpp's target-only of the same type: the same weights for gguf, the same format rounded by each for int4
        peer = by_name.get(f"llama.cpp {LLAMA_TYPE.get(m.bits, '')} target-only") if m.family == "specdec" else None
        row["agreement_with_llama_cpp"] = agreement(outputs, peer.rounds[0]["output_ids"]) if peer else None
        row["identical_to_llama_cpp"] = (sum(a == b for a, b in zip(outputs, peer.rounds[0]["output_ids"], strict=False)) if peer else None)
        out[m.name] = row
    return out


def goals(summary: dict[str, dict[str, Any]], methods: list[Method], subsets: dict[str, list[int]]) -> list[dict[str, Any]]:
    """The issue's two goals per bit width and workload, as per-round ratios of the two methods compared."""
    by_name = {m.name: m for m in methods if m.rounds}
    rows = []
    for bits in BITS:
        ours_to, theirs_to = f"specdec {bits} target-only", f"llama.cpp {LLAMA_TYPE[bits]} target-only"
        for w, idx in subsets.items():
            def best(family: str, bits: str = bits, w: str = w) -> str | None:
                of = bits if family == "specdec" else PEER_BITS.get(bits, bits)
                names = [n for n, r in summary.items() if r["family"] == family and r["bits"] == of and r["mode"] != "target-only"]
                # by CPU time: at one thread on a shared machine the figure that does not depend on the others' load
                return max(names, key=lambda n: summary[n][w]["tokens_per_cpu_s"]["median"], default=None)

            for goal, a, b, target in (("target-only >= llama.cpp", ours_to, theirs_to, 1.0),
                                       ("fastest speculative >= 1.5x llama.cpp's", best("specdec"), best("llama.cpp"), 1.5)):
                if a in by_name and b in by_name:
                    pairs = list(zip(by_name[a].rounds, by_name[b].rounds, strict=False))
                    ratios = spread([tokens_per_s(x, idx) / tokens_per_s(y, idx) for x, y in pairs])
                    cpu = spread([tokens_per_cpu_s(x, idx) / tokens_per_cpu_s(y, idx) for x, y in pairs])
                    dec = [(decode_tokens_per_s(x, idx), decode_tokens_per_s(y, idx)) for x, y in pairs]
                    decode = spread([d / e for d, e in dec]) if all(d and e for d, e in dec) else None
                    dec_cpu = [(decode_tokens_per_cpu_s(x, idx), decode_tokens_per_cpu_s(y, idx)) for x, y in pairs]
                    decode_cpu = spread([d / e for d, e in dec_cpu]) if all(d and e for d, e in dec_cpu) else None
                    rows.append({"bits": bits, "workload": w, "goal": goal, "ours": a, "theirs": b, "ratio": ratios,
                                 "ratio_cpu": cpu, "ratio_decode": decode, "ratio_decode_cpu": decode_cpu, "target": target,
                                 "met": ratios["median"] >= target,
                                 "met_decode": None if decode is None else decode["median"] >= target,
                                 "met_cpu": cpu["median"] >= target,
                                 "met_decode_cpu": None if decode_cpu is None else decode_cpu["median"] >= target})
    return rows


def fmt(s: dict[str, float] | None, digits: int = 1, suffix: str = "") -> str:
    if s is None or s["median"] != s["median"]:  # missing, or NaN (no CPU time measured)
        return "-"
    return f"{s['median']:.{digits}f}{suffix} [{s['min']:.{digits}f}-{s['max']:.{digits}f}]"


def print_table(summary: dict[str, dict[str, Any]], threads: int) -> None:
    head = (f"{'method':<34}" + "".join(f"{w + ' tok/s':>24}" for w in WORKLOADS) + f"{'decode-only all':>24}" + f"{'all vs specdec fp32 TO':>26}"
            f"{'tok/CPU-s':>11}{'CPU vs fp32 TO':>22}{'accept':>8}{'==own TO':>9}{'agree fp32':>11}{'agree llama':>12}{'load s':>8}")
    print(f"\n--- {threads} thread(s): median [min-max] over rounds ---")
    print(head)
    for name, r in summary.items():
        eq = {None: "-", True: "yes", False: "NO"}[r["equals_own_target_only"]]
        acc = f"{r['acceptance']:.2f}" if r["acceptance"] is not None else "-"
        vs = fmt(r["all"]["vs_base"], 2, "x") if "vs_base" in r["all"] else "-"
        agree = f"{r['agreement_with_specdec_fp32']:.0%}" if r["agreement_with_specdec_fp32"] is not None else "-"
        llama = f"{r['agreement_with_llama_cpp']:.0%}" if r.get("agreement_with_llama_cpp") is not None else "-"
        load = f"{r['load_s']:.1f}" if r["load_s"] is not None else "-"
        vs_cpu = fmt(r["all"]["vs_base_cpu"], 2, "x") if "vs_base_cpu" in r["all"] else "-"
        print(f"{name:<34}" + "".join(f"{fmt(r[w]['tokens_per_s']):>24}" for w in WORKLOADS) + f"{fmt(r['all'].get('decode_tokens_per_s')):>24}"
              + f"{vs:>26}"
              f"{r['all']['tokens_per_cpu_s']['median']:>11.1f}{vs_cpu:>22}{acc:>8}{eq:>9}{agree:>11}{llama:>12}{load:>8}")


def step_bandwidth(summary: dict[str, dict[str, Any]], lay: Layout, threads: int, bandwidth: dict[str, Any]) -> None:
    """Each target-only decode against the memory floor: bytes a step reads x its best decode-only tokens/s, and that
    as a share of the measured read bandwidth (host.read_bandwidth, this thread count's best pass). specdec's bytes:
    host.step_bytes (every weight but the gathered embedding); llama.cpp's: its GGUF's size (the embedding table
    included: an upper bound on what it reads)."""
    bw = bandwidth["by_threads"].get(threads) or bandwidth["by_threads"].get(str(threads))
    for row in summary.values():
        dec = row["all"].get("decode_tokens_per_s")
        if row["mode"] != "target-only" or dec is None or bw is None:
            continue
        path = (lay.engine("target", row["bits"]) if row["family"] == "specdec"
                else lay.gguf("target", row["bits"]) if row["family"] == "llama.cpp" else None)
        if path is None or not path.exists():
            continue
        nbytes = host.step_bytes(path) if path.is_dir() else path.stat().st_size
        row["step_bytes"] = nbytes
        row["decode_gb_s"] = {k: nbytes * v / 1e9 for k, v in dec.items()}
        row["decode_of_read"] = {k: v / bw["best_gb_s"] for k, v in row["decode_gb_s"].items()}
        print(f"  {row['family']} {row['bits']} target-only decode: {nbytes / 1e6:.0f} MB a step, {row['decode_gb_s']['median']:.1f} GB/s "
              f"[{row['decode_gb_s']['min']:.1f}-{row['decode_gb_s']['max']:.1f}], {row['decode_of_read']['median']:.0%} of the "
              f"{bw['best_gb_s']:.1f} GB/s read bandwidth")


def print_goals(rows: list[dict[str, Any]], threads: int) -> None:
    print(f"\n--- goals, {threads} thread(s): ours / theirs, per-round ratio median [min-max], wall time (CPU time) ---")
    for g in rows:
        print(f"{g['bits']:<5} {g['workload']:<11} {g['goal']:<40} {g['ours']:<28} / {g['theirs']:<30} {fmt(g['ratio'], 2, 'x'):>22}"
              f"  {'met' if g['met'] else 'NOT met':<8} decode-only {fmt(g['ratio_decode'], 2, 'x')}"
              f" {'-' if g['met_decode'] is None else 'met' if g['met_decode'] else 'NOT met'} (CPU {fmt(g['ratio_cpu'], 2, 'x')},"
              f" decode-only CPU {fmt(g['ratio_decode_cpu'], 2, 'x')})")


# --------------------------------------------------------------------------- run


def uptime() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def make_prompts(lay: Layout, num_prompts: int, prompt_tokens: int, file_context: bool = False) -> tuple[list[list[int]], dict[str, list[int]]]:
    return workloads(lay.tokenizer_dir(), num_prompts, prompt_tokens, file_context)


def run(args: argparse.Namespace) -> int:
    lay = Layout(Path(args.work))
    if args.peers_python:
        peers.PEERS_PYTHON = args.peers_python
    bits_list = [b for b in args.bits.split(",") if b]
    spec_bits = [b for b in args.spec_bits.split(",") if b]
    families = set(args.families.split(","))
    prompts, subsets = make_prompts(lay, args.num_prompts, args.prompt_tokens, args.file_context)
    log_dir = lay.work / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {"args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items() if k != "fn"},
                              "machine": {"cpus": os.cpu_count(), "platform": platform.platform()}, "host": host.host_record(),
                              "prompt_tokens": [len(p) for p in prompts], "file_context": args.file_context, "subsets": subsets,
                              "load_start": uptime(), "threads": {}}
    print(f"{len(prompts)} prompts ({len(subsets['ordinary'])} ordinary, {len(subsets['copy-heavy'])} copy-heavy; "
          f"{min(map(len, prompts))}-{max(map(len, prompts))} tokens), {args.max_new_tokens} new tokens each, batch 1, greedy; "
          f"load average {report['load_start']}", flush=True)
    for threads in [int(t) for t in str(args.threads).split(",")]:
        engines = SpecdecEngines(lay, threads)
        methods: list[Method] = []
        if "specdec" in families:
            methods += specdec_methods(lay, engines, bits_list, spec_bits)
        if "llama.cpp" in families and args.llama_cpp and args.llama_tools == "server":
            methods += llama_methods(lay, llama_bin(args.llama_cpp, "llama-server"), threads, bits_list, spec_bits,
                                     [g for g in args.llama_ngram.split(",") if g], log_dir)
        elif "llama.cpp" in families and args.llama_cpp:
            methods += llama_cli_methods(lay, args.llama_cpp, threads, bits_list, spec_bits, log_dir)
        if "ortgenai" in families:
            methods += ortgenai_methods(lay, threads, [b for b in args.ortgenai_bits.split(",") if b], spec_bits)
        if args.methods:  # a subset, by name
            methods = [m for m in methods if re.search(args.methods, m.name)]
        print(f"\n== {threads} thread(s): loading {len(methods)} methods (load average {uptime()})", flush=True)
        try:  # llama-server processes outlive an interrupted run unless closed here
            skipped = open_all(methods, prompts[0][:32])
            t_load = {"start": uptime()}
            for r in range(args.rounds):
                print(f"  round {r + 1}/{args.rounds} (load average {uptime()})", flush=True)
                run_round(methods, prompts, args.max_new_tokens, r, args.rounds)
            t_load["end"] = uptime()
        except BaseException:
            close_all(methods)
            raise
        summary = summarize(methods, subsets)
        goal_rows = goals(summary, methods, subsets)
        print_table(summary, threads)
        step_bandwidth(summary, lay, threads, report["host"]["read_bandwidth"])
        print_goals(goal_rows, threads)
        print(f"load average: {t_load['start']} at the first round, {t_load['end']} after the last")
        report["threads"][str(threads)] = {
            "summary": summary, "goals": goal_rows, "skipped": skipped, "load_average": t_load,
            "specdec_load_s": dict(engines.load_s),
            "llama_commands": {m.name: " ".join(getattr(m.runner, "handle", m.runner).command)
                               for m in methods if m.family == "llama.cpp" and m.runner},
            "rounds": {m.name: [{k: v for k, v in r.items() if k != "output_ids" or args.keep_outputs} for r in m.rounds] for m in methods},
        }
        close_all(methods)
        engines.executors.clear()
        if args.output_json:  # after each thread count, so a cut-short run keeps what it measured
            Path(args.output_json).write_text(json.dumps(report, indent=1) + "\n")
    report["load_end"] = uptime()
    print(f"\nload average at the start {report['load_start']}, at the end {report['load_end']}")
    if args.output_json:
        Path(args.output_json).write_text(json.dumps(report, indent=1) + "\n")
        print(f"wrote {args.output_json}")
        panels = {f"{t} thread(s)": [spread_bar(name, r["all"]["tokens_per_s"]) for name, r in rep["summary"].items()]
                  for t, rep in report["threads"].items()}
        chart(args.output_json, f"tokens/s with prefill, all prompts, batch 1, {args.max_new_tokens} new tokens", panels, "tokens/s", None)
    return 0


def chart(json_path: str, title: str, panels: dict, xlabel: str, reference: float | None) -> None:
    if path := write_bars(beside(json_path), title, panels, xlabel, reference):
        print(f"wrote {path}")


def steps(args: argparse.Namespace) -> int:
    """One forward call of each engine at each width, CPU and wall time, the engines and widths interleaved in
    every round: what a verification step costs against a one-token step, per precision (and against extra
    engines given with --engine, e.g. one built by an earlier specdec), and what a draft step costs."""
    import statistics

    from specdec.formats.engine_format import load_engine_dir
    from specdec.runtime.backends.onnxruntime.cpu import OrtExecutor

    lay = Layout(Path(args.work))
    widths = [int(w) for w in args.widths.split(",")]
    named = [(f"target {b}", lay.engine("target", b), widths) for b in args.bits.split(",") if b]
    named += [(f"draft {b}", lay.engine("draft", b), [1]) for b in args.draft_bits.split(",") if b]
    named += [(Path(e).name, Path(e), widths) for e in args.engine]
    execs = []
    for name, path, ws in named:
        ex = OrtExecutor(load_engine_dir(path), num_threads=args.threads)
        cache = ex.new_cache(1)
        ex.forward(cache, [list(range(5, 5 + args.context))], all_logits=False)  # a context to attend over
        execs.append((name, ex, cache, ws))

    def step(ex: Any, cache: Any, width: int) -> None:
        ex.forward(cache, [[7] * width], all_logits=True)
        cache.lengths[0] -= width  # the same cache length every call

    cpu: dict[tuple[str, int], list[float]] = {}
    wall: dict[tuple[str, int], list[float]] = {}
    for r in range(args.rounds + 1):  # round 0 warms every shape up
        print("warm-up round" if r == 0 else f"round {r}/{args.rounds}", flush=True)
        for w in widths:  # engine by engine within each width: the engines compared share each stretch of load
            for name, ex, cache, ws in execs[r % len(execs):] + execs[: r % len(execs)]:
                if w not in ws:
                    continue
                c0, w0 = time.process_time(), time.perf_counter()
                for _ in range(args.calls):
                    step(ex, cache, w)
                if r:
                    cpu.setdefault((name, w), []).append((time.process_time() - c0) / args.calls)
                    wall.setdefault((name, w), []).append((time.perf_counter() - w0) / args.calls)
    print(f"{args.threads} thread(s), context {args.context} tokens, median [min-max] of {args.rounds} rounds x {args.calls} calls; "
          f"load average {uptime()}")
    print(f"{'engine':<28}{'width':>6}{'CPU ms':>22}{'wall ms':>22}{'CPU / width 1':>16}")
    report = {}
    for name, _, _, ws in execs:
        for w in ws:
            c, wl = cpu[(name, w)], wall[(name, w)]
            one = statistics.median(cpu[(name, ws[0])])
            report[f"{name} width {w}"] = {"cpu_ms": spread([x * 1e3 for x in c]), "wall_ms": spread([x * 1e3 for x in wl])}
            print(f"{name:<28}{w:>6}{fmt(spread([x * 1e3 for x in c])):>22}{fmt(spread([x * 1e3 for x in wl])):>22}"
                  f"{statistics.median(c) / one:>15.2f}x")
    if args.output_json:
        Path(args.output_json).write_text(json.dumps({"threads": args.threads, "steps": report}, indent=1) + "\n")
        panels = {name: [Bar(f"{w} tokens", statistics.median(wall[(name, w)]) / statistics.median(wall[(name, ws[0])])) for w in ws]
                  for name, _, _, ws in execs if len(ws) > 1}
        chart(args.output_json, f"wall time of a step over a one-token step, {args.threads} thread(s)", panels, "step cost / one-token step", 1.0)
    return 0


def main(argv: list[str] | None = None) -> int:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # SystemExit: the servers get closed on the way out
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="fn", required=True)
    for name in ("prepare", "run"):
        p = sub.add_parser(name)
        p.add_argument("--work", default="/tmp/big", help="holds target/, draft/, engine-*/, gguf/, ortgenai/")
        p.add_argument("--llama_cpp", type=Path, help="a llama.cpp source tree with build/bin/llama-server (and llama-quantize)")
        p.add_argument("--peers_python", help="a Python with onnxruntime-genai (default: $SPECDEC_PEERS_PYTHON)")
    pr = sub.choices["prepare"]
    pr.add_argument("--target_preset", default="target325m", choices=("target325m", "target1b5"),
                    help="the enlarged target: 325M, or 1.5B (int4 0.9 GB: bigger than any CPU's last-level cache)")
    pr.add_argument("--prepare_bits", default=",".join(BITS), help="the specdec engines (and GGUF types) to make")
    pr.add_argument("--gguf_source", default="f32", choices=("f32", "bf16"),
                    help="the target GGUF llama-quantize reads (bf16: a bfloat16 checkpoint)")
    st = sub.add_parser("steps", help="one forward call per engine and width: verification against one-token steps")
    st.add_argument("--work", default="/tmp/big")
    st.add_argument("--bits", default="fp32,int8,int4", help="target engines measured at every width")
    st.add_argument("--draft_bits", default="fp32,int4", help="draft engines measured at width 1")
    st.add_argument("--engine", action="append", default=[], help="another engine directory measured at every width (repeatable)")
    st.add_argument("--widths", default="1,2,3,5,9")
    st.add_argument("--threads", type=int, default=1)
    st.add_argument("--context", type=int, default=64, help="tokens in the cache before the measured calls")
    st.add_argument("--rounds", type=int, default=5)
    st.add_argument("--calls", type=int, default=5)
    st.add_argument("--output_json")
    r = sub.choices["run"]
    r.add_argument("--threads", default="2,1", help="comma list: each is one full measurement")
    r.add_argument("--rounds", type=int, default=3, help="interleaved rounds (>= 3 for a spread)")
    r.add_argument("--num_prompts", type=int, default=2, help="ordinary prompts, and as many copy-heavy ones")
    r.add_argument("--prompt_tokens", type=int, default=128)
    r.add_argument("--file_context", action="store_true",
                   help="long-context prompts: each also holds its source file before the function, up to --prompt_tokens tokens")
    r.add_argument("--max_new_tokens", type=int, default=64)
    r.add_argument("--bits", default="fp32,int8,int4", help="precisions measured target-only")
    r.add_argument("--spec_bits", default="int8,int4", help="precisions also measured with every speculative mode")
    r.add_argument("--llama_tools", choices=("cli", "server"), default="cli",
                   help="llama.cpp's command-line tools (llama-completion, llama-lookup, llama-speculative-simple) or llama-server")
    r.add_argument("--llama_ngram", default="simple,map-k", help=f"with --llama_tools server: its n-gram drafters ({', '.join(LLAMA_NGRAM)})")
    r.add_argument("--families", default="specdec,llama.cpp,ortgenai")
    r.add_argument("--ortgenai_bits", default="int4", help="onnxruntime-genai precisions (fp32, int4)")
    r.add_argument("--methods", help="only the methods whose name matches this regular expression")
    r.add_argument("--output_json")
    r.add_argument("--keep_outputs", action="store_true", help="put every method's output ids in the JSON")
    args = ap.parse_args(argv)
    return {"prepare": prepare, "run": run, "steps": steps}[args.fn](args)


if __name__ == "__main__":
    sys.exit(main())
