"""Peer baselines for specdec-bench --compare, specdec-eval and the benchmarks: HF
`transformers.generate`, onnxruntime-genai and llama.cpp's `llama-server` (benchmarks/peers.py
re-exports this module).

Every generate function takes pre-tokenized prompts (list of lists of int ids), decodes greedily
at batch 1 one prompt at a time, forces exactly `max_new_tokens` new tokens (EOS is masked until
then; `max_new_tokens` may be one int or one int per prompt), warms up once on the first prompt,
and returns a dict with at least
{"name", "tokens_per_s", "output_ids", "new_tokens", "seconds"}. `seconds` is the summed
wall-clock time of the per-prompt generate calls (prefill + decode, model load excluded).

onnxruntime-genai lives in its own venv (default /work/venv-peers, override with the env var
SPECDEC_PEERS_PYTHON). When `onnxruntime_genai` is not importable in the calling interpreter, the
ortgenai_* functions transparently re-run themselves in that interpreter through this file's
`__main__` entry: `python path/to/specdec/bench/peers.py < {"fn": "ortgenai_generate", "kwargs": {...}}`
(or `python -m specdec.bench.peers`), which prints one line `PEERS_RESULT_JSON:<json>` on stdout.
The peers venv does not have specdec installed, so this file is run by path and must import
nothing from the package at module level: only the standard library here; torch, transformers
and onnxruntime_genai are imported inside the functions that need them.

For interleaved benchmarks that must load a model once and time it many times, two handles
keep a model loaded between calls, each with `load_s` (model load, timed apart from generation),
`run(ids, n) -> (output_ids, seconds, stats)` and `close()`: `OrtGenaiWorker` (onnxruntime-genai
in a long-lived PEERS_PYTHON process, `python peers.py --serve`, one JSON line per call) and
`LlamaServer` (a `llama-server` process at batch 1, one HTTP request per prompt, prompt cache
off so every call prefills).
"""
from __future__ import annotations

import copy
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

# onnxruntime-genai may live in another environment: name its interpreter here
PEERS_PYTHON = os.environ.get("SPECDEC_PEERS_PYTHON", "")
_RESULT_TAG = "PEERS_RESULT_JSON:"

Result = dict[str, Any]


def _lengths(max_new_tokens: int | list[int], n: int) -> list[int]:
    """One new-token count per prompt."""
    if isinstance(max_new_tokens, int):
        return [max_new_tokens] * n
    lengths = [int(x) for x in max_new_tokens]
    if len(lengths) != n:
        raise ValueError(f"max_new_tokens has {len(lengths)} entries for {n} prompts")
    return lengths


def _result(name: str, output_ids: list[list[int]], seconds: float, **extra: Any) -> Result:
    new_tokens = sum(len(o) for o in output_ids)
    return {"name": name, "tokens_per_s": new_tokens / seconds if seconds > 0 else 0.0,
            "output_ids": output_ids, "new_tokens": new_tokens, "seconds": seconds, **extra}


def _drive(run: Any, prompts_ids: list[list[int]], max_new_tokens: int | list[int], *stat_keys: str) -> tuple[list[list[int]], float, list[float]]:
    """The contract's loop: warm up on the first prompt, then ``run(ids, n) -> (output, seconds, stats)`` per prompt;
    returns the outputs, the summed seconds and the summed ``stats[key]`` of each of ``stat_keys``."""
    lengths = _lengths(max_new_tokens, len(prompts_ids))
    run(prompts_ids[0], lengths[0])  # warm-up
    outputs, seconds, sums = [], 0.0, [0.0] * len(stat_keys)
    for ids, n in zip(prompts_ids, lengths, strict=True):
        out, dt, stats = run(ids, n)
        outputs.append(out)
        seconds += dt
        sums = [total + float(stats.get(key, 0)) for total, key in zip(sums, stat_keys, strict=True)]
    return outputs, seconds, sums


# --------------------------------------------------------------------------- HF transformers


def hf_generate(ckpt_dir: str, prompts_ids: list[list[int]], max_new_tokens: int | list[int],
                assistant_dir: str | None = None, num_assistant_tokens: int = 4,
                prompt_lookup_num_tokens: int | None = None, max_matching_ngram_size: int = 2,
                num_threads: int | None = None, stop_ids: list[int] | None = None) -> Result:
    """Greedy `model.generate` (fp32, eager attention); optionally assisted or prompt-lookup.

    stop_ids: stop a prompt at the first of these tokens (kept in its output, as specdec-run
    does) instead of forcing exactly max_new_tokens; None or [] forces the length.
    """
    import torch
    from transformers import AutoModelForCausalLM

    if assistant_dir is not None and prompt_lookup_num_tokens is not None:
        raise ValueError("choose either assistant_dir or prompt_lookup_num_tokens, not both")
    if num_threads is not None:
        torch.set_num_threads(num_threads)

    def load(path: str) -> Any:
        return AutoModelForCausalLM.from_pretrained(
            path, dtype=torch.float32, attn_implementation="eager").eval()

    model = load(ckpt_dir)
    lengths = _lengths(max_new_tokens, len(prompts_ids))
    kwargs: dict[str, Any] = dict(do_sample=False, num_beams=1, use_cache=True)
    if stop_ids:
        kwargs.update(eos_token_id=list(stop_ids), pad_token_id=int(stop_ids[0]))
    name = "hf_greedy"
    if assistant_dir is not None:
        assistant = load(assistant_dir)
        # transformers 5.x reads the drafting schedule from the *assistant's* generation_config.
        # The default assistant_confidence_threshold (0.4) would stop drafting early whenever
        # the draft is unsure; 0.0 disables that so exactly K tokens are drafted per round.
        gc = assistant.generation_config
        gc.num_assistant_tokens = num_assistant_tokens
        gc.num_assistant_tokens_schedule = "constant"
        gc.assistant_confidence_threshold = 0.0
        kwargs["assistant_model"] = assistant
        name = f"hf_assisted_k{num_assistant_tokens}"
    elif prompt_lookup_num_tokens is not None:
        kwargs["prompt_lookup_num_tokens"] = prompt_lookup_num_tokens
        kwargs["max_matching_ngram_size"] = max_matching_ngram_size
        name = f"hf_prompt_lookup_k{prompt_lookup_num_tokens}_n{max_matching_ngram_size}"

    def run(ids: list[int], n: int) -> tuple[list[int], float]:
        x = torch.tensor([ids], dtype=torch.long)
        mask = torch.ones_like(x)
        # min_new_tokens == max_new_tokens: no early stop on EOS
        length = dict(max_new_tokens=n) if stop_ids else dict(max_new_tokens=n, min_new_tokens=n)
        with torch.inference_mode():
            t0 = time.perf_counter()
            out = model.generate(input_ids=x, attention_mask=mask, **kwargs, **length)
            dt = time.perf_counter() - t0
        return out[0, len(ids):].tolist(), dt, {}

    outputs, seconds, _ = _drive(run, prompts_ids, lengths)
    return _result(name, outputs, seconds)


# --------------------------------------------------------------------------- onnxruntime-genai


def _have_ortgenai() -> bool:
    return importlib.util.find_spec("onnxruntime_genai") is not None


def ortgenai_unavailable() -> str | None:
    """Why onnxruntime-genai cannot run here (one line), or None when it can."""
    if _have_ortgenai():
        return None
    if not PEERS_PYTHON:
        return ("onnxruntime-genai is not installed here: `pip install onnxruntime-genai onnx_ir`, "
                "or set SPECDEC_PEERS_PYTHON to a Python that has it")
    if not (os.path.isfile(PEERS_PYTHON) and os.access(PEERS_PYTHON, os.X_OK)):
        return f"SPECDEC_PEERS_PYTHON={PEERS_PYTHON} is not an executable Python"
    return None


def _call_in_peers_venv(fn: str, kwargs: dict[str, Any]) -> Result:
    """Run `fn(**kwargs)` from this file under PEERS_PYTHON and return its JSON result."""
    if not PEERS_PYTHON:
        raise NotImplementedError("onnxruntime-genai is not installed here: `pip install onnxruntime-genai onnx_ir`, "
                                  "or set SPECDEC_PEERS_PYTHON to a Python that has it.")
    proc = subprocess.run([PEERS_PYTHON, os.path.abspath(__file__)],
                          input=json.dumps({"fn": fn, "kwargs": kwargs}),
                          capture_output=True, text=True)
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(_RESULT_TAG):
            return _raise_if_error(json.loads(line[len(_RESULT_TAG):]))
    raise RuntimeError(f"{fn} failed in {PEERS_PYTHON} (rc={proc.returncode}):\n"
                       f"{proc.stderr[-4000:]}")


def ortgenai_build(ckpt_dir: str, out_dir: str, precision: str = "fp32",
                   cache_dir: str | None = None) -> str:
    """Export a local HF checkpoint with the onnxruntime-genai model builder (CPU EP).

    Runs fully offline: `-i` points at a local directory and HF_HUB_OFFLINE=1 stops any hub call.
    """
    why = ortgenai_unavailable()
    if why:
        raise NotImplementedError(why)
    python = sys.executable if _have_ortgenai() else PEERS_PYTHON
    cache_dir = cache_dir or out_dir.rstrip("/") + "_cache"
    cmd = [python, "-m", "onnxruntime_genai.models.builder", "-i", os.path.abspath(ckpt_dir),
           "-o", os.path.abspath(out_dir), "-p", precision, "-e", "cpu", "-c", cache_dir]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0 or not os.path.exists(os.path.join(out_dir, "genai_config.json")):
        raise RuntimeError(f"builder failed: {' '.join(cmd)}\n{proc.stdout[-2000:]}"
                           f"\n{proc.stderr[-4000:]}")
    return out_dir


def _make_speculative_dir(target_dir: str, draft_dir: str, k: int, wrap: str) -> str:
    """Write into `wrap` a `model.type = "speculative"` genai_config over target + draft.

    onnxruntime-genai (verified on 0.18.0) enables draft-model speculative decoding when
    genai_config.json has a `model.draft` decoder block next to `model.decoder`. Filenames
    are resolved relative to the wrapper directory and 0.18 rejects ".." in them, so the two
    exports are symlinked into the wrapper as target/ and draft/.
    """
    def load(d: str) -> dict[str, Any]:
        with open(os.path.join(d, "genai_config.json"), encoding="utf-8") as f:
            return json.load(f)

    tcfg, dcfg = load(target_dir), load(draft_dir)
    if tcfg["model"]["vocab_size"] != dcfg["model"]["vocab_size"]:
        raise ValueError("target and draft must share the vocabulary")
    cfg = copy.deepcopy(tcfg)
    cfg["model"]["type"] = "speculative"
    for key, src, cdir, link in (("decoder", tcfg, target_dir, "target"),
                                 ("draft", dcfg, draft_dir, "draft")):
        os.symlink(os.path.abspath(cdir), os.path.join(wrap, link))
        block = copy.deepcopy(src["model"]["decoder"])
        block["filename"] = f"{link}/{block['filename']}"
        cfg["model"][key] = block
    cfg["speculative"] = {"max_draft_tokens": k}
    with open(os.path.join(wrap, "genai_config.json"), "w", encoding="utf-8") as f:
        json.dump(cfg, f, indent=2)
    return wrap


class OrtGenaiModel:
    """An onnxruntime-genai model (optionally with a draft or n-gram decoding) loaded once.

    Needs `onnxruntime_genai` importable in this interpreter (ortgenai_generate and
    OrtGenaiWorker take care of running it in PEERS_PYTHON otherwise).
    """

    def __init__(self, model_dir: str, draft_dir: str | None = None, num_draft_tokens: int = 4,
                 ngram: int | None = None, num_threads: int | None = None, profile_prefix: str | None = None) -> None:
        """profile_prefix: ONNX Runtime's profiler on for the target's session (and the draft's, PREFIX_draft); the JSON
        files are written when the model is closed."""
        import onnxruntime_genai as og

        if draft_dir is not None and ngram is not None:
            raise ValueError("onnxruntime-genai cannot combine n-gram and draft-model decoding")
        if (draft_dir or ngram) and not hasattr(og.GeneratorParams, "set_speculative_options"):
            raise NotImplementedError(
                f"onnxruntime-genai {og.__version__} has no speculative decoding API "
                "(GeneratorParams.set_speculative_options, added by microsoft/onnxruntime-genai#2233)")
        self.og = og
        self.spec_opts: dict[str, int] = {}
        self.name = "ortgenai_greedy"
        if draft_dir is not None:
            self.spec_opts = {"max_draft_tokens": num_draft_tokens}
            self.name = f"ortgenai_spec_k{num_draft_tokens}"
        elif ngram is not None:
            self.spec_opts = {"ngram_size": ngram, "max_draft_tokens": num_draft_tokens}
            self.name = f"ortgenai_ngram_k{num_draft_tokens}_n{ngram}"
        t0 = time.perf_counter()
        with tempfile.TemporaryDirectory(prefix="ortgenai_spec_") as wrap:
            path = _make_speculative_dir(model_dir, draft_dir, num_draft_tokens, wrap) \
                if draft_dir is not None else model_dir
            config = og.Config(path)
            if num_threads is not None or profile_prefix is not None:
                def options(suffix: str) -> dict[str, Any]:
                    opts: dict[str, Any] = {} if num_threads is None else {"intra_op_num_threads": num_threads}
                    if profile_prefix is not None:
                        opts["enable_profiling"] = profile_prefix + suffix
                    return {"session_options": opts}
                blocks = {"decoder": options(""), **({"draft": options("_draft")} if draft_dir else {})}
                config.overlay(json.dumps({"model": blocks}))
            self.model = og.Model(config)  # sessions are created here; the wrapper dir may go after
        self.load_s = time.perf_counter() - t0
        if ngram is not None and "ngram_size" not in og.GeneratorParams(self.model).get_speculative_options():
            raise NotImplementedError(f"onnxruntime-genai {og.__version__} has no n-gram decoding "
                                      "(speculative option ngram_size, microsoft/onnxruntime-genai#2314)")

    def run(self, ids: list[int], n: int) -> tuple[list[int], float, dict[str, Any]]:
        """Greedy: exactly n new tokens; wall seconds of prefill + decode; speculative stats."""
        import numpy as np

        og = self.og
        total = len(ids) + n
        t0, c0, start_ns = time.perf_counter(), time.process_time(), time.time_ns()
        params = og.GeneratorParams(self.model)
        # min_length == max_length masks EOS so exactly max_new_tokens are produced.
        params.set_search_options(do_sample=False, max_length=total, min_length=total, num_beams=1)
        if self.spec_opts:
            params.set_speculative_options(**self.spec_opts)
        gen = og.Generator(self.model, params)
        gen.append_tokens(np.asarray([ids], dtype=np.int32))  # prefill
        while not gen.is_done():
            gen.generate_next_token()
        dt, cpu_s = time.perf_counter() - t0, time.process_time() - c0
        seq = gen.get_sequence(0)
        raw = dict(gen.get_speculative_stats()) if self.spec_opts else {}
        stats = {k: float(v) for k, v in raw.items() if isinstance(v, (int, float))}  # drops the histogram lists
        stats["cpu_s"] = cpu_s  # this process's CPU seconds (prefill + decode)
        stats["start_ns"], stats["end_ns"] = start_ns, time.time_ns()  # when it ran (the wall clock: a profile's events placed in time)
        return [int(t) for t in seq[len(ids):]], dt, stats

    def close(self) -> None:
        self.model = None


def ortgenai_generate(model_dir: str, prompts_ids: list[list[int]], max_new_tokens: int | list[int],
                      draft_dir: str | None = None, num_draft_tokens: int = 4,
                      ngram: int | None = None, num_threads: int | None = None) -> Result:
    """Greedy decoding with the onnxruntime-genai C++ Generator loop.

    draft_dir: a second builder export -> draft-model speculative decoding, K=num_draft_tokens.
    ngram: onnxruntime-genai n-gram (prompt-lookup) decoding with `ngram_size=ngram`, i.e. the
      last ngram-1 tokens are matched against the history (HF's max_matching_ngram_size=2 is
      roughly ngram=3, though HF also falls back to shorter matches); K=num_draft_tokens.
    Runs in PEERS_PYTHON via a subprocess when onnxruntime_genai is not importable here.
    """
    if not _have_ortgenai():
        return _call_in_peers_venv("ortgenai_generate", dict(
            model_dir=model_dir, prompts_ids=prompts_ids, max_new_tokens=max_new_tokens,
            draft_dir=draft_dir, num_draft_tokens=num_draft_tokens, ngram=ngram,
            num_threads=num_threads))
    model = OrtGenaiModel(model_dir, draft_dir, num_draft_tokens, ngram, num_threads)
    outputs, seconds, (accepted, evaluated) = _drive(model.run, prompts_ids, max_new_tokens, "draft_tokens_accepted", "draft_tokens_evaluated")
    extra: dict[str, Any] = {"ortgenai_version": model.og.__version__, "load_s": model.load_s}
    if model.spec_opts:  # draft tokens accepted / draft tokens the target examined
        extra["acceptance_rate"] = accepted / evaluated if evaluated else 0.0
    return _result(model.name, outputs, seconds, **extra)


class OrtGenaiWorker:
    """An OrtGenaiModel kept loaded in a long-lived process (PEERS_PYTHON, or this interpreter).

    The process runs this file with `--serve`: one JSON request per stdin line, one tagged JSON
    answer per stdout line. Errors come back as the exception they were.
    """

    def __init__(self, model_dir: str, draft_dir: str | None = None, num_draft_tokens: int = 4,
                 ngram: int | None = None, num_threads: int | None = None, profile_prefix: str | None = None) -> None:
        why = ortgenai_unavailable()
        if why:
            raise NotImplementedError(why)
        python = sys.executable if _have_ortgenai() else PEERS_PYTHON
        self.proc = subprocess.Popen([python, os.path.abspath(__file__), "--serve"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            answer = self._ask({"op": "load", "kwargs": dict(model_dir=model_dir, draft_dir=draft_dir,
                                                             num_draft_tokens=num_draft_tokens, ngram=ngram,
                                                             num_threads=num_threads, profile_prefix=profile_prefix)})
        except BaseException:
            self.close()
            raise
        self.name, self.load_s, self.version = answer["name"], answer["load_s"], answer["version"]

    def _ask(self, request: dict[str, Any]) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        for line in self.proc.stdout:
            if line.startswith(_RESULT_TAG):
                return _raise_if_error(json.loads(line[len(_RESULT_TAG):]))
        err = self.proc.stderr.read() if self.proc.stderr else ""
        raise RuntimeError(f"the onnxruntime-genai worker exited (rc={self.proc.wait()}):\n{err[-4000:]}")

    def run(self, ids: list[int], n: int) -> tuple[list[int], float, dict[str, Any]]:
        a = self._ask({"op": "run", "ids": list(ids), "n": n})
        return a["output_ids"], a["seconds"], a["stats"]

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()  # the worker's loop ends at end of input
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _serve() -> None:
    """Worker entry (`--serve`): load one OrtGenaiModel, then run requests until stdin closes."""
    model: OrtGenaiModel | None = None
    for line in sys.stdin:
        req = json.loads(line)
        try:
            if req["op"] == "load":
                model = OrtGenaiModel(**req["kwargs"])
                payload: dict[str, Any] = {"name": model.name, "load_s": model.load_s, "version": model.og.__version__}
            elif model is None:
                raise ValueError("load a model first")
            else:
                out, dt, stats = model.run(req["ids"], int(req["n"]))
                payload = {"output_ids": out, "seconds": dt, "stats": stats}
        except Exception as e:  # reported back to the parent, which re-raises
            payload = {"error": str(e), "error_type": type(e).__name__}
        sys.stdout.write(_RESULT_TAG + json.dumps(payload) + "\n")
        sys.stdout.flush()
    if model is not None:
        model.close()  # its sessions end here: a profiler writes its file


# --------------------------------------------------------------------------- llama.cpp


def llamacpp_unavailable(server_bin: str) -> str | None:
    """Why `server_bin` cannot serve here (one line), or None when it can."""
    if not (os.path.isfile(server_bin) and os.access(server_bin, os.X_OK)):
        return (f"{server_bin} is not an executable llama-server: build it from llama.cpp "
                "(cmake --build build --target llama-server), see benchmarks/README.md")
    return None


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class LlamaServer:
    """llama.cpp's `llama-server` at batch 1 (one slot), greedy, one HTTP request per prompt.

    draft: a draft GGUF -> its draft-model speculation (`--spec-type draft-simple`,
      `--spec-draft-n-max num_draft_tokens`, `--spec-draft-n-min 0`: `-md` alone loads the draft
      but drafts nothing in this llama.cpp); spec_type: e.g. "ngram-simple" (with spec_args such
      as ["--spec-ngram-simple-size-n", "3"]); neither: target-only. The server reads the GGUF
      with mmap, so several servers on one file share its pages. num_threads sets -t/-tb and,
      with a draft, -td/-tbd. Every request turns the prompt cache off (each call prefills) and
      `ignore_eos` on, so exactly n tokens come back. The server reports speculation only in its
      log ("draft acceptance = ... (A accepted / D generated)"), so with a log_path, run() reads
      each request's drafted/accepted counts from there.
    """

    def __init__(self, server_bin: str, model: str, num_threads: int | None = None, draft: str | None = None,
                 num_draft_tokens: int = 4, spec_type: str | None = None, spec_args: list[str] | None = None,
                 ctx_size: int = 2048, log_path: str | None = None, timeout_s: float = 300.0) -> None:
        why = llamacpp_unavailable(server_bin)
        if why:
            raise NotImplementedError(why)
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [server_bin, "-m", model, "--host", "127.0.0.1", "--port", str(self.port), "-np", "1",
               "-c", str(ctx_size), "--no-webui"]
        if num_threads is not None:
            cmd += ["-t", str(num_threads), "-tb", str(num_threads)]
        if draft is not None:
            spec_type = spec_type or "draft-simple"
            cmd += ["-md", draft, "--spec-draft-n-max", str(num_draft_tokens), "--spec-draft-n-min", "0"]
            if num_threads is not None:
                cmd += ["-td", str(num_threads), "-tbd", str(num_threads)]
        if spec_type is not None:
            cmd += ["--spec-type", spec_type, *(spec_args or [])]
        self.command = cmd
        env = dict(os.environ)
        lib = os.path.dirname(os.path.abspath(server_bin))  # a shared-library build keeps its .so files beside it
        env["LD_LIBRARY_PATH"] = lib + (os.pathsep + env["LD_LIBRARY_PATH"] if env.get("LD_LIBRARY_PATH") else "")
        self.log_path = log_path
        self._log = open(log_path or os.devnull, "w")
        self._log_offset = 0
        t0 = time.perf_counter()
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, env=env)
        try:
            self._wait_ready(timeout_s)
        except BaseException:
            self.close()
            raise
        self.load_s = time.perf_counter() - t0
        self.name = "llamacpp" + (f"_draft_k{num_draft_tokens}" if draft else "") + (f"_{spec_type}" if spec_type else "")

    def _request(self, path: str, body: dict[str, Any] | None = None, timeout: float = 600.0) -> dict[str, Any]:
        import urllib.request

        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url + path, data=data, headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return json.loads(resp.read())

    def _wait_ready(self, timeout_s: float) -> None:
        import urllib.error

        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"llama-server exited (rc={self.proc.returncode}): {' '.join(self.command)}")
            try:
                if self._request("/health", timeout=5).get("status") == "ok":
                    return
            except (urllib.error.URLError, ConnectionError, OSError, ValueError):
                pass  # still loading (503) or not listening yet
            time.sleep(0.05)
        raise RuntimeError(f"llama-server did not become ready in {timeout_s:.0f} s: {' '.join(self.command)}")

    def tokenize(self, text: str) -> list[int]:
        return [int(t) for t in self._request("/tokenize", {"content": text})["tokens"]]

    def run(self, ids: list[int], n: int) -> tuple[list[int], float, dict[str, Any]]:
        """Greedy: exactly n new tokens after the token ids; wall seconds of the request; the server's timings."""
        body = {"prompt": list(ids), "n_predict": n, "temperature": 0.0, "top_k": 1, "ignore_eos": True,
                "cache_prompt": False, "return_tokens": True, "stream": False}
        t0 = time.perf_counter()
        r = self._request("/completion", body)
        dt = time.perf_counter() - t0
        return [int(t) for t in r["tokens"]], dt, {**(r.get("timings") or {}), **self._draft_counts()}

    def _draft_counts(self) -> dict[str, int]:
        """{"draft_n", "draft_n_accepted"} from the log lines written since the last call."""
        if not self.log_path:
            return {}
        with open(self.log_path, errors="replace") as f:
            f.seek(self._log_offset)
            text = f.read()
            self._log_offset = f.tell()
        drafted = accepted = 0
        for line in text.splitlines():
            if "draft acceptance =" in line and "(" in line:
                counts = line.split("(", 1)[1].split(")", 1)[0]  # "    3 accepted /     8 generated"
                a, _, d = counts.partition("accepted /")
                accepted += int(a.strip())
                drafted += int(d.split()[0])
        return {"draft_n": drafted, "draft_n_accepted": accepted}

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


def llamacpp_generate(server_bin: str, model: str, prompts_ids: list[list[int]], max_new_tokens: int | list[int],
                      draft: str | None = None, num_draft_tokens: int = 4, spec_type: str | None = None,
                      spec_args: list[str] | None = None, num_threads: int | None = None) -> Result:
    """Greedy decoding with llama.cpp's llama-server (see LlamaServer), in the contract above."""
    server = LlamaServer(server_bin, model, num_threads, draft, num_draft_tokens, spec_type, spec_args)
    try:
        outputs, seconds, (drafted, accepted) = _drive(server.run, prompts_ids, max_new_tokens, "draft_n", "draft_n_accepted")
    finally:
        server.close()
    extra: dict[str, Any] = {"load_s": server.load_s}
    if draft or spec_type:
        extra["acceptance_rate"] = accepted / drafted if drafted else 0.0
    return _result(server.name, outputs, seconds, **extra)


def _raise_if_error(payload: dict[str, Any]) -> dict[str, Any]:
    if "error" in payload:
        exc = {"NotImplementedError": NotImplementedError,
               "ValueError": ValueError}.get(payload["error_type"], RuntimeError)
        raise exc(payload["error"])
    return payload


def _main() -> None:
    """Subprocess entry: JSON {"fn": name, "kwargs": {...}} on stdin -> tagged JSON on stdout."""
    req = json.loads(sys.stdin.read())
    fns = {"ortgenai_generate": ortgenai_generate, "ortgenai_build": ortgenai_build,
           "hf_generate": hf_generate}
    try:
        payload: Any = fns[req["fn"]](**req.get("kwargs", {}))
        if not isinstance(payload, dict):
            payload = {"value": payload}
    except Exception as e:  # reported back to the parent, which re-raises
        payload = {"error": str(e), "error_type": type(e).__name__}
    sys.stdout.write(_RESULT_TAG + json.dumps(payload) + "\n")


if __name__ == "__main__":
    if sys.argv[1:] == ["--serve"]:
        _serve()
    else:
        _main()
