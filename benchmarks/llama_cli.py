"""llama.cpp's own command-line tools as benchmark peers: one process per prompt, timed by llama.cpp itself.

* ``llama-completion``: target-only decoding (its ``llama_perf_context_print`` timers: prompt eval, eval);
* ``llama-lookup``: n-gram cache speculation (prompt lookup over a cache of 1- to 4-grams of the context);
* ``llama-speculative-simple``: a draft model (``-md``), or a draftless type (``--spec-type ngram-simple``).

Each run prefills the prompt and makes exactly ``n`` tokens greedily (``--temp 0 --top-k 1 --ignore-eos``).
The tools take text, so the prompt goes in as the text of its token ids (the benchmark's tokenizer and the
GGUF's agree on these prompts: benchmarks/README.md); the output is the text they print after the prompt.
Figures are llama.cpp's own: with prefill = (prompt eval + decode) seconds, decode only = tokens / decode
seconds. The process's load time is outside both, as specdec's engine load is. CPU time: llama.cpp's timers are
wall clock; each is scaled by the process's CPU seconds over its wall seconds (getrusage of the child), the share of
a core it got on a shared machine (exact at one thread, when the process never waits for a core; an estimate
otherwise, since the load, prefill and decode phases may wait differently).
"""

from __future__ import annotations

import re
import resource
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

_ENCODED = re.compile(r"encoded\s+(\d+) tokens in\s+([\d.]+) seconds")
_DECODED = re.compile(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds")
_PROMPT_EVAL = re.compile(r"prompt eval time =\s+([\d.]+) ms /\s+(\d+) tokens")
_EVAL = re.compile(r"\beval time =\s+([\d.]+) ms /\s+(\d+) runs")
_COUNTS = {key: re.compile(rf"{key}\s+=\s+(\d+)") for key in ("n_drafted", "n_accept")}


def context_size(prompt_tokens: int, new_tokens: int) -> int:
    """llama.cpp's -c for a run: 1024 (what every earlier figure used), or room for a longer prompt and its output."""
    return max(1024, prompt_tokens + new_tokens + 64)


class LlamaCliRunner:
    """One llama.cpp tool, run once per prompt (the model file stays in the page cache between runs)."""

    def __init__(self, binary: Path, model: Path, threads: int, extra: list[str], decode_text: Any, encode_text: Any,
                 log_path: Path | None = None) -> None:
        if not binary.is_file():
            raise FileNotFoundError(f"{binary} is not built (cmake --build build --target {binary.name})")
        self.binary, self.model, self.threads, self.extra = binary, model, threads, extra
        self.decode_text, self.encode_text = decode_text, encode_text  # ids -> text, text -> ids (the benchmark's tokenizer)
        self.log_path = log_path
        self.load_s = 0.0
        self.command: list[str] = []
        self._cpu = 0.0

    def run(self, ids: list[int], n: int) -> tuple[list[int], float, dict[str, Any]]:
        """-> (the output's token ids by the benchmark's tokenizer, seconds with prefill by llama.cpp's timers, stats)."""
        prompt = self.decode_text(ids)
        with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
            # llama.cpp's -f drops one trailing newline of the file (common/arg.cpp): one more keeps the prompt whole (a prompt
            # ending in "\n", as the copy-heavy ones do, lost its last token before this)
            f.write(prompt + "\n")
        try:
            self.command = [str(self.binary), "-m", str(self.model), "-f", f.name, "-n", str(n), "--ignore-eos",
                            "--temp", "0", "--top-k", "1", "-t", str(self.threads), "-tb", str(self.threads), "-c", str(context_size(len(ids), n)),
                            "--no-display-prompt" if self.binary.name == "llama-completion" else "", *self.extra]
            self.command = [a for a in self.command if a]
            t0, r0 = time.perf_counter(), resource.getrusage(resource.RUSAGE_CHILDREN)
            proc = subprocess.run(self.command, capture_output=True, text=True, errors="replace", timeout=600, stdin=subprocess.DEVNULL)
            wall, r1 = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_CHILDREN)
        finally:
            Path(f.name).unlink()
        if self.log_path is not None:
            with open(self.log_path, "a") as log:
                log.write(f"$ {' '.join(self.command)}\n{proc.stderr[-3000:]}\n")
        if proc.returncode != 0:
            raise RuntimeError(f"{self.binary.name} exited {proc.returncode}: {proc.stderr.strip().splitlines()[-1:]}")
        text, stats = self._parse(proc.stdout, proc.stderr, prompt)
        stats["wall_s"] = wall
        stats["process_cpu_s"] = (r1.ru_utime + r1.ru_stime) - (r0.ru_utime + r0.ru_stime)  # load + prefill + decode
        share = min(float(self.threads), stats["process_cpu_s"] / wall) if wall > 0 else 1.0  # cores busy per wall second
        stats["cpu_share"] = share
        self._cpu += stats["with_prefill_s"] * share
        stats["decode_cpu_s"] = stats["decode_s"] * share
        # the first n tokens: a speculative tool may accept drafts past n, and the text ends in the tool's newlines
        return self.encode_text(text)[:n], stats["with_prefill_s"], stats

    def _parse(self, out: str, err: str, prompt: str) -> tuple[str, dict[str, Any]]:
        stats: dict[str, Any] = {}
        if self.binary.name == "llama-completion":
            pe, ev = _PROMPT_EVAL.search(err), _EVAL.search(err)
            if pe is None or ev is None:
                raise RuntimeError(f"{self.binary.name}: no timings in its output")
            prefill_s, decode_s = float(pe.group(1)) / 1e3, float(ev.group(1)) / 1e3
            stats.update(with_prefill_s=prefill_s + decode_s, decode_s=decode_s, decode_tokens=int(ev.group(2)))
            text = out
        else:
            enc, dec = _ENCODED.search(err), _DECODED.search(err)
            if enc is None or dec is None:
                raise RuntimeError(f"{self.binary.name}: no timings in its output")
            stats.update(with_prefill_s=float(enc.group(2)) + float(dec.group(2)), decode_s=float(dec.group(2)), decode_tokens=int(dec.group(1)))
            for key, pattern in _COUNTS.items():
                m = pattern.search(err)
                stats[key] = int(m.group(1)) if m else 0
            stats.update(drafted=stats["n_drafted"], accepted=stats["n_accept"])
            # stdout: "\n\n", the prompt's pieces, the new tokens' pieces, "\n\n"
            body = out[2:] if out.startswith("\n\n") else out
            body = body[:-2] if body.endswith("\n\n") else body
            at = body.find(prompt)  # after a BOS piece, if the model adds one
            if at < 0:
                raise RuntimeError(f"{self.binary.name}: its output does not start with the prompt; cannot tell the new text apart")
            text = body[at + len(prompt):]
        return text, stats

    def cpu_s(self) -> float:
        """CPU seconds of prefill + decode so far: llama.cpp's timers x the process's CPU share (the module's docstring)."""
        return self._cpu

    def close(self) -> None:
        pass
