"""Hugging Face ``generate`` on the same GPU, the way a GPU user runs it: the peer of benchmarks/bench_gpu.py.

* greedy with ``cache_implementation="static"`` and the forward compiled by ``torch.compile``
  (mode "reduce-overhead": CUDA graphs), in bfloat16 (transformers' "Optimizing inference" guide);
* assisted generation (``assistant_model``, k drafts per round) where transformers runs it: it keeps a
  dynamic cache, uncompiled, and batch 1 only.

Each configuration is warmed up (compilation happens there, and is not timed), then times every batch of
prompts, exactly ``n_new`` new tokens each (EOS ignored). Prompts of a batch have the same length (the caller
trims them), so no padding changes what is computed.
"""

from __future__ import annotations

import time
from typing import Any


def _load(path: str, dtype: str):
    import torch
    from transformers import AutoModelForCausalLM

    dt = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
    return AutoModelForCausalLM.from_pretrained(path, dtype=dt).to("cuda").eval()


def hf_generate(target: str, prompts: list[list[int]], n_new: int, batch: int, dtype: str = "bfloat16", compiled: bool = True,
                draft: str | None = None, k: int = 4, model=None) -> dict[str, Any]:
    """tokens/s of transformers' generate on cuda:0 over ``prompts`` in batches of ``batch``; output ids per prompt.

    compiled: static cache + torch.compile (ignored with ``draft``: assisted generation runs eager, dynamic cache).
    model: an already loaded target (reused across calls: loading 16 GB takes a while)."""
    import torch

    model = model if model is not None else _load(target, dtype)
    kwargs: dict[str, Any] = dict(do_sample=False, num_beams=1, max_new_tokens=n_new, min_new_tokens=n_new)
    if draft:
        if batch != 1:
            raise ValueError("transformers' assisted generation runs at batch 1 only")
        assistant = _load(draft, dtype)
        gc = assistant.generation_config
        gc.num_assistant_tokens, gc.num_assistant_tokens_schedule, gc.assistant_confidence_threshold = k, "constant", 0.0
        kwargs["assistant_model"] = assistant
    elif compiled:
        # generate compiles the forward itself for a static cache (mode "reduce-overhead": CUDA graphs) and marks
        # each step for the graph trees; wrapping model.forward in torch.compile by hand breaks that
        # ("accessing tensor output of CUDAGraphs that has been overwritten", transformers 5.17).
        kwargs["cache_implementation"] = "static"
    batches = [prompts[i : i + batch] for i in range(0, len(prompts), batch)]
    outs: list[list[int]] = []
    total = 0.0
    if compiled and not draft:
        # forget the graphs compiled for another batch size: a recompilation for a new shape makes torch.compile mark the
        # batch axis dynamic, and the dynamic graph is slower (the batch-1 figure of the first run was such a recompilation)
        import torch._dynamo

        torch._dynamo.reset()
    with torch.inference_mode():
        warm = 3 if compiled and not draft else 2  # compilation, CUDA graph capture, and one more call of the captured shape
        for i, rows in enumerate([batches[0]] * warm + batches):
            x = torch.tensor(rows, device="cuda")
            torch.cuda.synchronize()
            t = time.perf_counter()
            y = model.generate(input_ids=x, attention_mask=torch.ones_like(x), **kwargs)
            torch.cuda.synchronize()
            if i >= warm:
                total += time.perf_counter() - t
                outs += [row[x.shape[1]:] for row in y.tolist()]
    tokens = sum(map(len, outs))
    return {"output_ids": outs, "output_tokens": tokens, "total_s": total, "tokens_per_s": tokens / total, "model": model}
