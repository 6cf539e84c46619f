"""The methods benchmarks/bench_gpu.py decodes with, and its Hugging Face section.

Every method runs on the engines bench_gpu.py opened on the GPU (one executor per engine, shared): target-only,
draft-target at each fixed k and auto, n-gram, on the target; EAGLE chain and tree when the target is an EAGLE
target (its module opened on the same GPU); Medusa tree on the Medusa target; target-only on the int4 target.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def decode_methods(engines: dict, draft_lens: list[int], ngram: list[int] | None, tree: str, kind: str = "cuda",
                   more: bool = False, peagle_refine: tuple[int | str, ...] = ()) -> dict[str, tuple[Any, str]]:
    """name -> (Orchestrator, the name of the target-only run on the same engine: the output it must reproduce).

    kind: where the EAGLE module opens (the target's device kind). more: also n-gram auto, suffix decoding (its trees
    where the target verifies them) and EAGLE auto: every method and auto (benchmarks/bench_torch.py). peagle_refine:
    P-EAGLE's chains again with each of these --peagle_refine settings (a module trained to read its drafts)."""
    from specdec.runtime.orchestrator import Orchestrator
    from specdec.runtime.proposers.draft_model import DraftModelProposer
    from specdec.runtime.proposers.ngram import NGramProposer

    target, draft = engines["target"][0], engines["draft"][0]
    base = "target-only"
    methods = {base: Orchestrator(target)}
    for k in draft_lens:
        methods[f"draft-target k={k}"] = Orchestrator(target, DraftModelProposer(draft), draft_len=k)
    methods["draft-target auto"] = Orchestrator(target, DraftModelProposer(draft), draft_len="auto")
    if ngram:
        methods[f"n-gram k={ngram[0]} n={ngram[1]}"] = Orchestrator(target, NGramProposer(ngram[0], ngram[1]), draft_len=ngram[0])
        if more:
            methods["n-gram auto"] = Orchestrator(target, NGramProposer(ngram[0], ngram[1]), draft_len="auto")
    if more:
        from specdec.runtime.proposers.suffix import SuffixConfig, SuffixProposer

        suffix = SuffixConfig(max_draft_len=min(SuffixConfig().max_draft_len, target.build.max_draft_len))
        methods["suffix"] = Orchestrator(target, SuffixProposer(suffix, trees=target.tree_attention), draft_len=suffix.max_draft_len)
        methods["suffix auto"] = Orchestrator(target, SuffixProposer(suffix, trees=target.tree_attention), draft_len="auto")
    refs = {name: base for name in methods}
    if target.build.speculative_decoding_mode == "eagle":
        from specdec.formats.engine_format import eagle_module_dir, load_engine_dir
        from specdec.runtime.backends import Placement, open_executor
        from specdec.runtime.proposers.eagle import EagleProposer

        module = open_executor(load_engine_dir(eagle_module_dir(target.engine)), Placement(kind, 0))
        methods["EAGLE chain k=4"] = Orchestrator(target, EagleProposer(target, module), draft_len=4)
        eagle_tree = EagleProposer(target, module, tree)
        methods[f"EAGLE tree n={len(eagle_tree.tree)}"] = Orchestrator(target, eagle_tree, draft_len=len(eagle_tree.tree))
        if more:
            methods["EAGLE tree auto"] = Orchestrator(target, EagleProposer(target, module, tree), draft_len="auto")
        refs.update({name: base for name in methods if name not in refs})
    if "medusa" in engines:
        from specdec.runtime.proposers.medusa import MedusaProposer

        medusa = engines["medusa"][0]
        proposer = MedusaProposer(medusa, tree)
        methods["Medusa target-only"] = Orchestrator(medusa)  # its own engine: its own reference (and its cost of the heads)
        methods[f"Medusa tree n={len(proposer.tree)}"] = Orchestrator(medusa, proposer, draft_len=len(proposer.tree))
        refs.update({"Medusa target-only": "Medusa target-only", f"Medusa tree n={len(proposer.tree)}": "Medusa target-only"})
    if "peagle" in engines:  # a P-EAGLE target: its own engine (its module's fc), its own reference
        methods.update(_peagle_methods(engines["peagle"][0], tree, kind, more, peagle_refine))
        refs.update({name: "P-EAGLE target-only" for name in methods if name.startswith("P-EAGLE")})
    if "int4" in engines:
        methods["int4 target-only"] = Orchestrator(engines["int4"][0])
        refs["int4 target-only"] = "int4 target-only"
        if draft_lens:
            k = max(draft_lens)
            methods[f"int4 draft-target k={k}"] = Orchestrator(engines["int4"][0], DraftModelProposer(draft), draft_len=k)
            refs[f"int4 draft-target k={k}"] = "int4 target-only"
    return {name: (orch, refs[name]) for name, orch in methods.items()}


def _peagle_methods(target, tree: str, kind: str, more: bool, refine: tuple[int | str, ...] = ()) -> dict[str, Any]:
    """P-EAGLE (a block of drafts per module call) on a peagle target: target-only, a chain of 4, the tree (and both under
    auto); for each ``refine`` setting, the chain of 4 (and auto's) refined so (the same module executor)."""
    from specdec.formats.engine_format import eagle_module_dir, load_engine_dir
    from specdec.runtime.backends import Placement, open_executor
    from specdec.runtime.orchestrator import Orchestrator
    from specdec.runtime.proposers.peagle import PEagleProposer

    module = open_executor(load_engine_dir(eagle_module_dir(target.engine)), Placement(kind, 0))
    proposer = PEagleProposer(target, module, tree)
    methods = {"P-EAGLE target-only": Orchestrator(target), "P-EAGLE chain k=4": Orchestrator(target, PEagleProposer(target, module), draft_len=4),
               f"P-EAGLE tree n={len(proposer.tree)}": Orchestrator(target, proposer, draft_len=len(proposer.tree))}
    if more:  # auto: a chain's round priced by its drafts (a line fitted per batch size), a tree's nodes that pay
        methods["P-EAGLE chain auto"] = Orchestrator(target, PEagleProposer(target, module), draft_len="auto")
        methods["P-EAGLE tree auto"] = Orchestrator(target, PEagleProposer(target, module, tree), draft_len="auto")
    for r in refine:  # "auto" needs the draft policy: its name says auto, so its step costs are measured before it runs
        methods[f"P-EAGLE chain k=4, refine {r}"] = Orchestrator(target, PEagleProposer(target, module, refine=r), draft_len=4)
        if more:
            methods[f"P-EAGLE chain auto, refine {r}"] = Orchestrator(target, PEagleProposer(target, module, refine=r), draft_len="auto")
    return methods


def hf_section(target: str, draft: str, prompts: list[list[int]], batches: list[int], n_new: int, decode: dict, count=None) -> dict[str, Any]:
    """Hugging Face greedy (static cache + torch.compile) at each batch size, assisted k=4 at batch 1; ours over theirs.
    count(b): how many of ``prompts`` batch size b decodes (default: all), as ours did at b (their outputs are compared)."""
    from gpu_peers import hf_generate

    out: dict[str, Any] = {}
    model = None
    for b in batches:
        r = hf_generate(target, prompts[: count(b)] if count else prompts, n_new, b, model=model)
        model = r.pop("model")
        out[f"greedy static+compile b={b}"] = _versus(r, decode.get(str(b), {}).get("target-only"))
    del model
    r = hf_generate(target, prompts[: count(1)] if count else prompts, n_new, 1, draft=draft, k=4)
    r.pop("model")
    out["assisted k=4 b=1 (dynamic cache)"] = _versus(r, decode.get("1", {}).get("draft-target k=4"))
    for name, row in out.items():
        vs = f", ours {row['ours_over_peer']:.2f}x" if "ours_over_peer" in row else ""
        same = (f"{row['same_outputs']}/{row['outputs']} outputs equal ours" if row["same_outputs"] is not None
                else "outputs not compared (none of ours here)")
        print(f"hf {name:<34}{row['tokens_per_s']:>9.1f} tokens/s{vs}, {same}", flush=True)
    return out


def _versus(peer: dict, ours: dict | None) -> dict[str, Any]:
    row = {k: v for k, v in peer.items() if k != "output_ids"}
    ids = ours.get("output_ids") if ours else None
    row["outputs"] = len(peer["output_ids"])
    row["same_outputs"] = sum(a == b for a, b in zip(peer["output_ids"], ids, strict=False)) if ids else None  # None: nothing to compare
    if ours and "tokens_per_s" in ours:
        row["ours_over_peer"] = float(np.asarray(ours["tokens_per_s"]["median"])) / peer["tokens_per_s"]
    return row
