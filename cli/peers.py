"""Peer baselines for specdec-bench --compare and specdec-eval: HF `transformers.generate` and
onnxruntime-genai (benchmarks/peers.py re-exports this module).

Every generate function takes pre-tokenized prompts (list of lists of int ids), decodes greedily
at batch 1 one prompt at a time, forces exactly `max_new_tokens` new tokens (EOS is masked until
then; `max_new_tokens` may be one int or one int per prompt), warms up once on the first prompt,
and returns a dict with at least
{"name", "tokens_per_s", "output_ids", "new_tokens", "seconds"}. `seconds` is the summed
wall-clock time of the per-prompt generate calls (prefill + decode, model load excluded).

onnxruntime-genai lives in its own venv (default /work/venv-peers, override with the env var
SPECDEC_PEERS_PYTHON). When `onnxruntime_genai` is not importable in the calling interpreter, the
ortgenai_* functions transparently re-run themselves in that interpreter through this file's
`__main__` entry: `python path/to/specdec/cli/peers.py < {"fn": "ortgenai_generate", "kwargs": {...}}`
(or `python -m specdec.cli.peers`), which prints one line `PEERS_RESULT_JSON:<json>` on stdout.
The peers venv does not have specdec installed, so this file is run by path and must import
nothing from the package at module level: only the standard library here; torch, transformers
and onnxruntime_genai are imported inside the functions that need them.
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
        return out[0, len(ids):].tolist(), dt

    run(prompts_ids[0], lengths[0])  # warm-up
    outputs, seconds = [], 0.0
    for ids, n in zip(prompts_ids, lengths):
        out, dt = run(ids, n)
        outputs.append(out)
        seconds += dt
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
            payload = json.loads(line[len(_RESULT_TAG):])
            if "error" in payload:
                exc = {"NotImplementedError": NotImplementedError,
                       "ValueError": ValueError}.get(payload["error_type"], RuntimeError)
                raise exc(payload["error"])
            return payload
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
    import numpy as np
    import onnxruntime_genai as og

    if draft_dir is not None and ngram is not None:
        raise ValueError("onnxruntime-genai cannot combine n-gram and draft-model decoding")
    if (draft_dir or ngram) and not hasattr(og.GeneratorParams, "set_speculative_options"):
        raise NotImplementedError(
            f"onnxruntime-genai {og.__version__} has no speculative decoding API "
            "(GeneratorParams.set_speculative_options, added by microsoft/onnxruntime-genai#2233)")

    spec_opts: dict[str, int] = {}
    name = "ortgenai_greedy"
    if draft_dir is not None:
        spec_opts = {"max_draft_tokens": num_draft_tokens}
        name = f"ortgenai_spec_k{num_draft_tokens}"
    elif ngram is not None:
        spec_opts = {"ngram_size": ngram, "max_draft_tokens": num_draft_tokens}
        name = f"ortgenai_ngram_k{num_draft_tokens}_n{ngram}"

    with tempfile.TemporaryDirectory(prefix="ortgenai_spec_") as wrap:
        path = _make_speculative_dir(model_dir, draft_dir, num_draft_tokens, wrap) \
            if draft_dir is not None else model_dir
        config = og.Config(path)
        if num_threads is not None:
            sess = {"session_options": {"intra_op_num_threads": num_threads}}
            blocks = {"decoder": sess, **({"draft": sess} if draft_dir else {})}
            config.overlay(json.dumps({"model": blocks}))
        model = og.Model(config)  # sessions are created here; the wrapper dir may go after

    if ngram is not None and "ngram_size" not in og.GeneratorParams(model).get_speculative_options():
        raise NotImplementedError(f"onnxruntime-genai {og.__version__} has no n-gram decoding "
                                  "(speculative option ngram_size, microsoft/onnxruntime-genai#2314)")

    lengths = _lengths(max_new_tokens, len(prompts_ids))

    def run(ids: list[int], n: int) -> tuple[list[int], float, dict[str, Any]]:
        total = len(ids) + n
        t0 = time.perf_counter()
        params = og.GeneratorParams(model)
        # min_length == max_length masks EOS so exactly max_new_tokens are produced.
        params.set_search_options(do_sample=False, max_length=total, min_length=total,
                                  num_beams=1)
        if spec_opts:
            params.set_speculative_options(**spec_opts)
        gen = og.Generator(model, params)
        gen.append_tokens(np.asarray([ids], dtype=np.int32))  # prefill
        while not gen.is_done():
            gen.generate_next_token()
        dt = time.perf_counter() - t0
        seq = gen.get_sequence(0)
        stats = dict(gen.get_speculative_stats()) if spec_opts else {}
        return [int(t) for t in seq[len(ids):]], dt, stats

    run(prompts_ids[0], lengths[0])  # warm-up
    outputs, seconds, accepted, evaluated = [], 0.0, 0.0, 0.0
    for ids, n in zip(prompts_ids, lengths):
        out, dt, stats = run(ids, n)
        outputs.append(out)
        seconds += dt
        accepted += float(stats.get("draft_tokens_accepted", 0))
        evaluated += float(stats.get("draft_tokens_evaluated", 0))
    extra: dict[str, Any] = {"ortgenai_version": og.__version__}
    if spec_opts:  # draft tokens accepted / draft tokens the target examined
        extra["acceptance_rate"] = accepted / evaluated if evaluated else 0.0
    return _result(name, outputs, seconds, **extra)


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
    _main()
