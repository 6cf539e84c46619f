"""specdec-bench's sweep: every method and draft length on one dataset, at batch 1 (or static batches).

Pure logic on numpy and the runtime: no torch, no transformers, no plotting.

``run_sweep`` decodes every request at batch 1 (or in static batches of
``batch_size``), each generating exactly its ``output_len`` tokens (no EOS
stop), for target-only and each drafting method and draft length (Medusa and
EAGLE: chains of each length their target's own drafter takes, and the tree of
``--medusa_choices`` / ``--eagle_choices`` when given, each on its own target
engine of the same model), and reports per row:

    output tokens/s       generated tokens / summed request latency (time to first token included)
    speedup               tokens/s over target-only, measured in the same run
    acceptance rate       accepted / drafted
    mean acceptance len   1 + accepted / rounds (tokens per target call)
    latency p50/p90/p99   per request (per batch when batch_size > 1)
    analytic bound        draft-target only: (1 - a^(g+1)) / ((1 - a)(g c + 1)), a = measured
                          acceptance rate, g = draft length, c = draft/target one-token step cost
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

import numpy as np

from ..formats.config_strings import DraftTargetConfig
from ..formats.engine_format import TREE_MODES, EngineDir, load_engine_dir
from ..formats.errors import RequestError
from ..runtime.backends import open_executor
from ..runtime.backends.base import Executor, Placement
from ..runtime.engine import check_draft_len
from ..runtime.loading import load_engine, load_orchestrator
from ..runtime.orchestrator import GenerationConfig, Orchestrator
from ..runtime.proposers.draft_model import DraftModelProposer
from ..runtime.proposers.ngram import NGramProposer
from ..runtime.proposers.own import OwnDrafter
from ..runtime.proposers.peagle import AUTO_ON_A_TREE, AUTO_REFINE, PEagleProposer, refine_value
from ..runtime.proposers.suffix import SuffixConfig, SuffixProposer
from ..runtime.request import METHODS as ENGINE_METHODS
from ..runtime.sampling import SamplingConfig
from ..runtime.tree import check_nodes, parse_choices
from .datasets import Record, check_fits

METHODS = ENGINE_METHODS  # none | draft | ngram | medusa | eagle | peagle | suffix
CHAIN_METHODS = frozenset({"draft", "ngram", "suffix"})  # swept over --draft_lens, each length a chain


def analytic_bound(alpha: float, gamma: int, c: float) -> float:
    """Expected speedup of draft-target over target-only (Leviathan et al. 2023, eq. 1 / Thm. 3.8)."""
    if alpha >= 1.0:
        return (gamma + 1) / (gamma * c + 1)
    return (1 - alpha ** (gamma + 1)) / ((1 - alpha) * (gamma * c + 1))


MAX_COST_REPS = 10_000  # timed one-token steps per engine: the median is steady long before this


def step_cost(engine: str | Path | EngineDir | Executor, num_threads: int | None = None, context: int = 200, reps: int = 100) -> float:
    """Seconds per one-token generation step at ``context`` tokens (as benchmarks/bench_decode.step_cost).

    ``engine``: an engine directory, or an executor already open (then ``num_threads`` is unused).
    """
    if isinstance(engine, (str, Path, EngineDir)):
        ex = open_executor(engine if isinstance(engine, EngineDir) else load_engine_dir(engine), Placement(num_threads=num_threads))
    else:
        ex = engine
    build = ex.build
    context = max(1, min(context, build.max_input_len, build.max_seq_len - 2))
    cache = ex.new_cache(1)
    token = min(5, ex.vocab_size - 1)
    ex.forward(cache, [[token] * context], all_logits=False)
    ex.forward(cache, [[token]], all_logits=True)  # warm this shape
    cache.lengths -= 1
    t = time.perf_counter()
    for _ in range(reps):
        ex.forward(cache, [[token]], all_logits=True)
        cache.lengths -= 1
    return (time.perf_counter() - t) / reps


def generate_each(
    orch: Orchestrator,
    prompts: Sequence[Sequence[int]],
    output_lens: Sequence[int],
    end_ids: tuple[int, ...] = (),
    batch_size: int = 1,
    warmup: int = 0,
    sampling: SamplingConfig | None = None,
) -> dict[str, Any]:
    """Decode ``prompts`` in consecutive batches of ``batch_size``, each request up to its output length.

    A batch runs with its longest output length (static batching: with ``end_ids=()`` every row
    of a batch generates that many tokens). Returns outputs and summed figures; ``latencies_s``
    has one entry per request (its batch's latency). ``sampling``: greedy when None; else the batch
    that starts at request i is seeded random_seed + i (each of its rows its own stream), so every
    configuration samples each request with the same numbers.
    """
    if batch_size < 1:
        raise RequestError(f"batch_size={batch_size} must be >= 1.")
    if batch_size > orch.max_batch:
        raise RequestError(f"batch_size={batch_size} exceeds the engines' max_batch_size={orch.max_batch}.")
    chunks = [(list(range(lo, min(lo + batch_size, len(prompts))))) for lo in range(0, len(prompts), batch_size)]

    def config(rows: list[int]) -> GenerationConfig:
        seeded = None if sampling is None else replace(sampling, random_seed=(sampling.random_seed + rows[0]) % 2**64)
        return GenerationConfig(max_output_len=max(output_lens[r] for r in rows), end_ids=tuple(end_ids),
                                **({} if seeded is None else {"sampling": seeded}))

    for rows in chunks[: max(0, warmup)]:
        orch.generate([prompts[r] for r in rows], config(rows))
    outputs: list[list[int]] = [[] for _ in prompts]
    latencies: list[float] = [0.0] * len(prompts)
    ttfts: list[float] = []
    total_s = drafted = accepted = rounds = rejected = 0
    for rows in chunks:
        outs, m = orch.generate([prompts[r] for r in rows], config(rows))
        for r, o in zip(rows, outs, strict=True):
            outputs[r] = o.output_ids
            latencies[r] = m.total_s
        ttfts += m.ttft_s
        total_s += m.total_s
        drafted, accepted, rounds, rejected = drafted + m.drafted, accepted + m.accepted, rounds + m.rounds, rejected + m.rejected
    tokens = sum(map(len, outputs))
    return {
        "output_ids": outputs,
        "output_tokens": tokens,
        "total_s": total_s,
        "output_tokens_per_s": tokens / total_s if total_s > 0 else 0.0,
        "latencies_s": latencies,
        "mean_ttft_s": float(np.mean(ttfts)) if ttfts else 0.0,
        "drafted": drafted,
        "accepted": accepted,
        "rounds": rounds,
        "acceptance_rate": accepted / drafted if drafted else None,
        # the alpha of the bound: acceptance of drafts the target reached (see runtime/metrics.py)
        "per_token_acceptance": accepted / (accepted + rejected) if accepted + rejected else None,
        "mean_acceptance_length": 1 + accepted / rounds if drafted and rounds else None,
    }


def percentiles(values: Sequence[float]) -> dict[str, float]:
    p50, p90, p99 = np.percentile(np.asarray(values, dtype=np.float64), [50, 90, 99]).tolist()
    return {"latency_p50_s": p50, "latency_p90_s": p90, "latency_p99_s": p99}


def parse_methods(values: Iterable[str]) -> list[str]:
    """--method none --method draft,ngram -> ["none", "draft", "ngram"] (validated, deduplicated)."""
    out: list[str] = []
    for v in values:
        for m in (x.strip().lower() for x in v.split(",")):
            if not m:
                continue
            m = {"target-only": "none", "draft-target": "draft", "draft_target": "draft", "prompt_lookup": "ngram"}.get(m, m)
            if m not in METHODS:
                raise RequestError(f"--method {m!r} is not one of {', '.join(METHODS)}.")
            if m not in out:
                out.append(m)
    return out


def parse_draft_lens(text: str) -> list[int]:
    try:
        lens = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise RequestError(f"--draft_lens {text!r} must be a comma list of integers, e.g. \"1,2,4,8\".") from None
    if not lens or min(lens) < 1:
        raise RequestError(f"--draft_lens {text!r} must list draft lengths >= 1, e.g. \"1,2,4,8\".")
    return sorted(set(lens))


def chain_limit(engine: EngineDir) -> int:
    """The longest chain a Medusa, EAGLE or P-EAGLE target's own drafter drafts (its proposer's max_chain_len)."""
    build = engine.config.build
    return min(build.medusa_num_heads, build.max_draft_len) if build.speculative_decoding_mode == "medusa" else build.max_draft_len


def run_sweep(
    target_dir: str | Path | EngineDir,
    method: Sequence[str],
    draft_dir: str | Path | EngineDir | None,
    draft_lens: Sequence[int],
    ngram_size: int,
    dataset: Sequence[Record],
    threads: int | None = None,
    warmup: int = 1,
    batch_size: int = 1,
    cost_reps: int = 100,
    say: Callable[[str], None] = lambda _: None,
    heads_dirs: dict[str, str | Path | EngineDir] | None = None,
    choices: dict[str, str | None] | None = None,
    cut_lens: bool = True,
    sampling: SamplingConfig | None = None,
    peagle_refine: int | str = 0,
) -> dict[str, Any]:
    """Target-only first (every speedup is against it), then each method x draft length.

    heads_dirs: the target engines of methods "medusa", "eagle" and "peagle" (the same model built with that
    --speculative_decoding_mode); choices: their draft trees (TensorRT-LLM's format), or None.
    cut_lens: a length longer than a target's own drafter drafts (Medusa's heads, an engine's max_draft_len) is left out
    for that method, saying so; False (lengths the user chose) also refuses, before anything is measured, a length that no
    method asked for drafts.

    sampling: sample every request with it (generate_each seeds them), else greedy.

    Returns {"settings", "step_cost", "rows"}; rows carry the figures of the module docstring,
    ``identical_to_target_only`` and ``identical_expected``: greedy drafting must reproduce target-only's
    tokens, and so must sampled drafts verified by token compare (target-only's draws for the seed); drafts
    verified by rejection sampling follow their drafts (the target's distribution, not its tokens).
    """
    if sampling is not None and sampling.greedy:
        sampling = None
    methods = parse_methods(method)
    if not methods:
        raise RequestError(f"no --method given: choose from {', '.join(METHODS)}.")
    if "draft" in methods and draft_dir is None:
        raise RequestError("--method draft needs a draft engine: pass --draft_engine_dir.")
    if CHAIN_METHODS & set(methods) and not draft_lens:
        raise RequestError("no draft lengths to sweep: pass --draft_lens, e.g. \"1,2,4,8\".")
    if "ngram" in methods and ngram_size < 1:
        raise RequestError(f"--ngram_size={ngram_size} must be >= 1.")
    if not dataset:
        raise RequestError("the dataset has no requests.")
    if batch_size < 1:  # before anything is measured (generate_each checks it against the engines)
        raise RequestError(f"--batch_size={batch_size} must be >= 1.")
    if warmup < 0:
        raise RequestError(f"--warmup={warmup} must be >= 0 (batches decoded before measuring).")
    if not 1 <= cost_reps <= MAX_COST_REPS:
        raise RequestError(f"--step_cost_reps={cost_reps} must be from 1 to {MAX_COST_REPS} (timed steps per engine).")
    heads_dirs, choices = dict(heads_dirs or {}), dict(choices or {})
    peagle_refine = refine_value(peagle_refine)
    if peagle_refine and "peagle" not in methods:
        raise RequestError("--peagle_refine refines P-EAGLE's blocks but --method has no 'peagle': add it (with a target built with "
                           "--speculative_decoding_mode peagle).")
    if peagle_refine == AUTO_REFINE and choices.get("peagle"):
        raise RequestError(AUTO_ON_A_TREE)
    for m, tree in choices.items():  # a tree nothing would draft is refused, not dropped
        if tree and m not in methods:
            raise RequestError(f"--{m}_choices is given but --method has no {m!r}: add it (with a target built with "
                               f"--speculative_decoding_mode {m}), or leave the tree out.")
    for m in TREE_MODES:
        if m in methods and heads_dirs.get(m) is None:
            raise RequestError(f"--method {m} needs a target engine built with --speculative_decoding_mode {m}: pass --{m}_engine_dir "
                               f"(or give it as --engine_dir).")
    heads = {m: (d if isinstance(d, EngineDir) else load_engine_dir(d)) for m, d in heads_dirs.items() if m in methods}
    for m, e in heads.items():  # an engine of another kind is refused before anything is measured, saying where it belongs
        mode = e.config.build.speculative_decoding_mode
        if mode != m:
            where = f"; pass it as --{mode}_engine_dir" if mode in TREE_MODES else ""
            raise RequestError(f"--method {m} needs a target engine built with --speculative_decoding_mode {m}: {e.path} was built with "
                               f"--speculative_decoding_mode {mode}{where}.")
    trees = {m: parse_choices(choices.get(m), f"--{m}_choices") for m in heads}
    for m, tree in trees.items():  # a tree the engine cannot verify is refused before anything is measured
        if tree is not None:
            check_nodes(tree, heads[m].config.build.max_draft_len, f"--{m}_choices", heads[m].path)
    # each engine is loaded (and hashed) once and passed on as an EngineDir
    target = target_dir if isinstance(target_dir, EngineDir) else load_engine_dir(target_dir)
    # a length the user chose that no method asked for can draft is refused; one that only some can is left out for the others,
    # saying so (below), as a default list's is
    # (draft, ngram and suffix take any length up to the target's max_draft_len: check_draft_len refuses past it, naming the rebuild)
    reach = [chain_limit(e) for e in heads.values()]
    if not cut_lens and draft_lens and reach and not CHAIN_METHODS & set(methods) and max(draft_lens) > max(reach):
        longest = max(reach)
        raise RequestError(f"--draft_lens {max(draft_lens)} is longer than any method asked for drafts here (at most {longest}: an engine's "
                           f"max_draft_len{', or Medusa heads' if 'medusa' in heads else ''}); use lengths <= {longest}.")
    draft = None
    if "draft" in methods:
        draft = draft_dir if isinstance(draft_dir, EngineDir) else load_engine_dir(draft_dir)  # type: ignore[arg-type]
    limits = [target.config.build] + ([draft.config.build] if draft else []) + [e.config.build for e in heads.values()]
    check_fits(dataset, min(b.max_input_len for b in limits), min(b.max_seq_len for b in limits))
    most = min(b.max_batch_size for b in limits)
    if batch_size > most:  # (generate_each checks it too, but only once target-only has been measured)
        raise RequestError(f"--batch_size={batch_size} exceeds the engines' max_batch_size={most}; use --batch_size <= {most} or rebuild "
                           f"the engines with --max_batch_size {batch_size}.")
    if "ngram" in methods or "suffix" in methods:
        check_draft_len(target, max(draft_lens), "ngram max_draft_len" if "ngram" in methods else "suffix max_draft_len")

    # One target session (and one draft session) serves every configuration: load_orchestrator
    # checks the pair once, at the longest draft length, and its executors are reused.
    if "draft" in methods:
        first = load_orchestrator(target, draft, DraftTargetConfig(max(draft_lens), [0], [0], False), num_threads=threads)
        target_ex, draft_ex = first.target, first.proposer.executor  # type: ignore[attr-defined]
    else:
        target_ex, draft_ex = load_orchestrator(target, num_threads=threads).target, None

    prompts = [r["input_ids"] for r in dataset]
    lens = [r["output_len"] for r in dataset]

    def measure(orch: Orchestrator) -> dict[str, Any]:
        return generate_each(orch, prompts, lens, (), batch_size, warmup, sampling)

    say("target-only")
    base = measure(Orchestrator(target_ex))
    base_tps = base["output_tokens_per_s"]
    rows: list[dict[str, Any]] = []

    def row(kind: str, label: str, r: dict[str, Any], orch: Orchestrator | None = None, **extra: Any) -> dict[str, Any]:
        """One configuration's figures (orch: what measured it; None for target-only itself)."""
        out = {
            "method": kind,
            "label": label,
            **extra,
            "requests": len(prompts),
            "output_tokens": r["output_tokens"],
            "total_s": r["total_s"],
            "output_tokens_per_s": r["output_tokens_per_s"],
            "speedup": r["output_tokens_per_s"] / base_tps if base_tps else 0.0,
            "acceptance_rate": r["acceptance_rate"],
            "per_token_acceptance": r["per_token_acceptance"],
            "mean_acceptance_length": r["mean_acceptance_length"],
            "mean_ttft_s": r["mean_ttft_s"],
            **percentiles(r["latencies_s"]),
            "identical_to_target_only": r["output_ids"] == base["output_ids"],
            # rejection sampling's output follows its drafts (the same distribution as target-only's, other tokens); a padded
            # draft's cuts sampling to the ids both share
            "identical_expected": sampling is None or orch is None or orch.engine.sample_differs() is None,
        }
        rows.append(out)
        return out

    row("none", "target-only", base, draft_len=0)
    cost: dict[str, float] | None = None
    if draft_ex is not None:
        t_s = step_cost(target_ex, reps=cost_reps)
        d_s = step_cost(draft_ex, reps=cost_reps)
        cost = {"target_step_s": t_s, "draft_step_s": d_s, "c": d_s / t_s}
        for k in draft_lens:
            say(f"draft-target k={k}")
            orch = Orchestrator(target_ex, DraftModelProposer(draft_ex), draft_len=k)
            r = row("draft", f"draft-target k={k}", measure(orch), orch, draft_len=k)
            alpha = r["per_token_acceptance"] or 0.0
            r["analytic_bound"] = analytic_bound(alpha, k, cost["c"])
            r["fraction_of_bound"] = r["speedup"] / r["analytic_bound"] if r["analytic_bound"] else None
    if "ngram" in methods:
        for k in draft_lens:
            say(f"ngram k={k} n={ngram_size}")
            orch = Orchestrator(target_ex, NGramProposer(k, ngram_size), draft_len=k)
            row("ngram", f"ngram k={k} n={ngram_size}", measure(orch), orch, draft_len=k, ngram_size=ngram_size)
    if "suffix" in methods:  # a fresh global cache per draft length: each row starts from the same empty cache
        on_trees = bool(target.config.build.tree_attention)
        for k in draft_lens:
            say(f"suffix k={k}")
            orch = Orchestrator(target_ex, SuffixProposer(SuffixConfig(max_draft_len=k), trees=on_trees), draft_len=k)
            row("suffix", f"suffix {'tree' if on_trees else 'chain'} k={k}", measure(orch), orch, draft_len=k)
    for m, engine_dir in heads.items():  # Medusa / EAGLE: the target's own drafter, on its own engine
        own_target = target_ex if engine_dir.path == target.path else None
        chain = load_engine(engine_dir, method=m, num_threads=threads, target_executor=own_target)
        proposer = cast(OwnDrafter, chain.proposers[m])  # a target's own drafter (proposers/own.py)
        refined = ""
        if m == "peagle" and peagle_refine:  # its calls after the first, each reading the last one's drafts
            proposer = cast(PEagleProposer, proposer).refining(peagle_refine)
            refined = ", refined auto" if peagle_refine == AUTO_REFINE else f", refined x{peagle_refine}"
        for k in draft_lens:
            if k > proposer.max_chain_len:
                say(f"{m} chain k={k}: left out ({m} drafts at most {proposer.max_chain_len} on this engine)")
                continue
            say(f"{m} chain k={k}{refined}")
            orch = Orchestrator(chain.target, proposer, draft_len=k)
            row(m, f"{m} chain k={k}{refined}", measure(orch), orch, draft_len=k, tree=None)
        if trees[m] is not None:  # the same executors, a proposer with the tree
            treed = proposer.with_tree(trees[m])
            nodes = len(trees[m])
            say(f"{m} tree ({nodes} nodes){refined}")
            orch = Orchestrator(chain.target, treed, draft_len=nodes)
            row(m, f"{m} tree n={nodes}{refined}", measure(orch), orch, draft_len=nodes, tree=choices[m])
    if "none" not in methods:
        rows[0]["reference_only"] = True  # measured for the speedups, not asked for
    settings = {
        "engine_dir": str(target.path),
        "draft_engine_dir": str(draft.path) if draft else None,
        **{f"{m}_engine_dir": str(e.path) for m, e in heads.items()},
        **{f"{m}_choices": c for m, c in choices.items() if c and m in heads},
        **({"peagle_refine": peagle_refine} if peagle_refine and "peagle" in heads else {}),
        "methods": methods,
        "draft_lens": list(draft_lens),
        "ngram_size": ngram_size,
        "requests": len(prompts),
        "input_tokens": sum(map(len, prompts)),
        "output_tokens_per_request": {"min": min(lens), "mean": float(np.mean(lens)), "max": max(lens)},
        "batch_size": batch_size,
        "warmup": warmup,
        "num_threads": threads,
        "greedy": sampling is None,
        "sampling": None if sampling is None else {"temperature": sampling.temperature, "top_k": sampling.top_k, "top_p": sampling.top_p,
                                                   "random_seed": sampling.random_seed},
    }
    return {"settings": settings, "step_cost": cost, "rows": rows, "target_only_output_ids": base["output_ids"]}


def token_agreement(a: Sequence[Sequence[int]], b: Sequence[Sequence[int]]) -> dict[str, float]:
    """Position-wise agreement of two sets of outputs.

    tokens:    identical tokens at the same position / positions in the longer of each pair
    sequences: fraction of pairs that are identical
    """
    if len(a) != len(b):
        raise ValueError(f"{len(a)} outputs against {len(b)}")
    same = total = 0
    for x, y in zip(a, b, strict=True):
        same += sum(1 for i, j in zip(x, y, strict=False) if i == j)
        total += max(len(x), len(y))
    seqs = sum(1 for x, y in zip(a, b, strict=True) if list(x) == list(y))
    return {"tokens": same / total if total else 1.0, "sequences": seqs / len(a) if a else 1.0}
