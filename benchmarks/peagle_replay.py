"""Greedy acceptance of a P-EAGLE module from its training rows, without an engine (issue 43).

    python benchmarks/peagle_replay.py --heads examples/demo-pair/heads/peagle --base examples/demo-pair/target \\
        --data demo-heads/data/eval_prompts.answers.jsonl --k 4
    python benchmarks/peagle_replay.py --heads examples/demo-pair/heads/peagle --base examples/demo-pair/target --bench_prompts 16

Over answers the target wrote greedily (prepare-data's .jsonl), one training pass (train/peagle.py's layout, every
anchor kept) gives every block the module would draft: the real pair at anchor p, then its placeholders. Replayed
round by round as drafting runs (the first anchor is the prompt's last pair; a round that accepts a tokens moves the
anchor by a + 1), the block is compared with the answer: mean acceptance length and the share of rounds accepted
at each depth, as benchmarks/bench_heads.py reports them for a built engine. ``--bench_prompts N``: instead of
``--data``, bench_heads.py's N ordinary and N copy-heavy prompts, answered greedily by the base (transformers, float32).
``--every_position`` scores a block at every anchor instead: the gap between the two is how much harder drafting's
anchors (mostly just after a miss) are.

``--choices TREE`` also replays a draft tree from the same blocks (each depth's top candidates, the same under every
parent, as drafting's trees), and ``--best_first`` beside it the tree of as many nodes whose paths have the highest
products of the positions' probabilities, chosen anew each round (EAGLE-2's dynamic tree, for a block whose
positions are blind to each other): what choosing the tree per round would add to a static one.

A module trained with its placeholders reading the true tokens (``examples/train_heads.py --peagle-truth-tokens``,
recorded in its config.json) is replayed as it was trained: under greedy verification a position counts only after
drafts that were the true tokens, so this is the acceptance of the same module drafting one call per token, reading
its drafts. Its gap to the blind module's is what drafting the block in one call costs. A tree deeper than ``--k``
replays the blocks of its depth (the chain's figure is then over those anchors).
"""

from __future__ import annotations

import argparse
import heapq
import json
import sys
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file

from specdec.formats.errors import RequestError
from specdec.formats.heads import REFINE_KEY, TRUTH_TOKENS_KEY
from specdec.runtime.tree import parse_choices
from specdec.train.base import load_base, run_base
from specdec.train.data import Sequence, read_sequences
from specdec.train.peagle import parallel_layout
from specdec.train.runs import collate
from specdec.train.trainer import TrainConfig, make_run


def load_module(heads: Path, base_dir: str, base):
    """The trained module as the trainer builds it, with the checkpoint's weights (float16 widened)."""
    cfg = json.loads((heads / "config.json").read_text())
    trained = cfg.get("specdec_train", {})
    run = make_run(TrainConfig(mode="peagle", model=base_dir, data="-", output_dir="-", eagle_num_layers=cfg["num_hidden_layers"],
                               peagle_depths=cfg.get("para_depths", trained.get("peagle_depths", 8)),
                               eagle_aux_layer_ids=cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"],
                               peagle_placeholders=cfg.get("peagle_placeholders", "constant"),
                               peagle_truth_tokens=bool(trained.get(TRUTH_TOKENS_KEY, False)),
                               peagle_refine=bool(trained.get(REFINE_KEY, False))), base)
    run.heads.load_state_dict({k: v.float() for k, v in load_file(str(heads / "model.safetensors")).items()}, strict=True)
    return run


Block = tuple[list[list[int]], list[list[float]]]  # per position: its top candidates' ids, and their probabilities


@torch.no_grad()
def blocks(run, base, seq, k: int, top: int = 1, refine: int = 0) -> tuple[dict[int, Block], list[int]]:
    """{anchor p: the block the module drafts there, k positions x ``top`` candidates}, and the sequence's ids.
    ``refine``: calls after the first, each placeholder reading the previous call's greedy draft at its position."""
    ids, attn, loss_mask = collate([seq])
    out = run_base(base, ids, attn, run.aux_ids)
    aux, next_embeds = out.aux_hidden[:, :-1], base.get_input_embeddings()(ids[:, 1:])  # pairs: features at t, token t+1
    layout = parallel_layout(attn[:, :-1], loss_mask, k, 1.0, 1.0, None)  # every anchor
    logits = run.heads.lm_head(run.heads.parallel_hidden(aux, next_embeds, layout))[0]  # [T' + M, vocab]
    real = aux.shape[1]
    found: dict[int, dict[int, int]] = {p: {0: p} for p in range(real)}  # anchor -> depth -> its row
    for j in range(layout.used.shape[1]):
        if layout.used[0, j]:
            found[int(layout.anchors[0, j])][int(layout.depths[0, j])] = real + j
    if refine:  # placeholder (p, d) reads the draft at position d: row (p, d - 1)'s guess (the real row p's for d = 1)
        slots = zip(layout.anchors[0].tolist(), layout.depths[0].tolist(), layout.used[0].tolist(), strict=True)
        source = torch.tensor([found[a][d - 1] if u else 0 for a, d, u in slots])  # [M]
        layout.reads = layout.used
    for _ in range(refine):  # real rows do not see placeholders: only the placeholders' guesses change
        read = base.get_input_embeddings()(logits.argmax(-1)[source]).unsqueeze(0)  # [1, M, hidden]
        logits = run.heads.lm_head(run.heads.parallel_hidden(aux, next_embeds, layout, read_embeds=read))[0]
    probs, cands = torch.softmax(logits.float(), dim=-1).topk(top, dim=-1)  # [T' + M, top] each
    full = {p: ([cands[d[i]].tolist() for i in range(k)], [probs[d[i]].tolist() for i in range(k)])
            for p, d in found.items() if len(d) == k}
    return full, ids[0].tolist()


def best_first(probs: list[list[float]], nodes: int) -> list[tuple[int, ...]]:
    """The ``nodes`` paths of candidate ranks (as --peagle_choices writes them) with the highest products of the
    positions' probabilities; probs [positions][candidates], each position's in descending order. A path's value is
    at most its prefix's, so every prefix is taken first: the paths are a tree, in the order taken."""
    def value(path: tuple[int, ...]) -> float:
        return float(np.prod([probs[d][r] for d, r in enumerate(path)]))

    heap = [(-value((0,)), (0,))]
    taken: list[tuple[int, ...]] = []
    while heap and len(taken) < nodes:
        _, path = heapq.heappop(heap)
        taken.append(path)  # each path is pushed once, by its previous sibling or (a first child) its parent
        if path[-1] + 1 < len(probs[0]):
            sibling = path[:-1] + (path[-1] + 1,)
            heapq.heappush(heap, (-value(sibling), sibling))
        if len(path) < len(probs):
            child = path + (0,)
            heapq.heappush(heap, (-value(child), child))
    return taken


def accepted(paths: list[tuple[int, ...]], cands: list[list[int]], truth: list[int]) -> int:
    """Greedy acceptance of a tree drawn from one block: the longest path whose tokens are the truth's first ones."""
    return max((len(p) for p in paths if all(cands[d][r] == truth[d] for d, r in enumerate(p))), default=0)


@torch.no_grad()
def bench_answers(base, base_dir: str, n: int, prompt_tokens: int, new_tokens: int) -> list[Sequence]:
    """bench_heads.py's prompts (benchmarks/prompts.py) with the base's greedy answers, end-of-sequence ignored as there."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from prompts import workloads

    prompts, _ = workloads(Path(base_dir), n, prompt_tokens)
    out = []
    for ids in prompts:
        answer = base.generate(torch.tensor([ids]), max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False)
        out.append(Sequence(answer[0].tolist(), len(ids)))
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--heads", type=Path, required=True, help="a P-EAGLE checkpoint (specdec-train's output)")
    p.add_argument("--base", required=True, help="the base model it was trained on")
    p.add_argument("--data", help="prepare-data .jsonl: prompts with the target's greedy answers")
    p.add_argument("--bench_prompts", type=int, default=0, help="instead of --data: bench_heads.py's N + N prompts, answered here")
    p.add_argument("--prompt_tokens", type=int, default=96)
    p.add_argument("--max_new_tokens", type=int, default=96)
    p.add_argument("--k", type=int, default=4, help="chain length drafted per round")
    p.add_argument("--max_len", type=int, default=512)
    p.add_argument("--every_position", action="store_true", help="score a block at every anchor, not round by round")
    p.add_argument("--choices", help='a draft tree to replay beside the chain, as --peagle_choices, e.g. "[[0],[1],[0,0]]"')
    p.add_argument("--best_first", action="store_true", help="with --choices: also the best-first tree of as many nodes, chosen each round")
    p.add_argument("--refine", type=int, default=0,
                   help="a module trained with --peagle-refine: calls after the first, each reading the previous call's drafts")
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    if bool(args.data) == bool(args.bench_prompts):
        p.error("give one of --data and --bench_prompts")
    if args.best_first and not args.choices:
        p.error("--best_first compares with --choices' tree: give both")
    try:
        tree = parse_choices(args.choices, "--choices")
    except RequestError as err:
        p.error(str(err))
    depth = max(args.k, tree.depth if tree is not None else 0)
    if not 0 <= args.refine < depth:
        p.error(f"--refine counts calls after the first: 0 to {depth - 1} (call m + 1 settles position m + 1 of {depth})")
    torch.set_num_threads(args.threads)
    base = load_base(args.base)
    run = load_module(args.heads, args.base, base)
    run.heads.eval()
    truth_tokens = run.heads.reads_true_tokens  # the bound: its probabilities saw the truth, so they may not choose a tree
    if truth_tokens and args.best_first:
        p.error(f"{args.heads} reads the true tokens (the bound): --best_first would choose its trees from the truth")
    if args.refine and not run.heads.refines:
        p.error(f"{args.heads} was not trained to read drafts (examples/train_heads.py --peagle-refine): --refine needs one that was")
    chain = [(0,) * d for d in range(1, args.k + 1)]
    drafts = {"chain": lambda probs: chain}
    if tree is not None:
        drafts[f"tree {args.choices}"] = lambda probs: tree.paths
        if args.best_first:
            drafts[f"best-first, {len(tree)} nodes"] = lambda probs: best_first(probs, len(tree))
    top = 1 if tree is None else len(tree) if args.best_first else max(tree.top_k(d) for d in range(1, tree.depth + 1))  # candidates a position needs
    seqs = (read_sequences(args.data, None, args.max_len, None) if args.data
            else bench_answers(base, args.base, args.bench_prompts, args.prompt_tokens, args.max_new_tokens))
    found = [blocks(run, base, seq, depth, top, args.refine) for seq in seqs]
    rounds_of = {}  # draft -> rounds that accepted a tokens, per a
    for name, paths_for in drafts.items():
        rounds_at = [0] * (depth + 1)
        for seq, (drafted, ids) in zip(seqs, found, strict=True):
            anchor = seq.prompt_len - 1  # the prompt's last pair: its next token is the target's first answer token
            while anchor in drafted:
                cands, probs = drafted[anchor]
                a = accepted(paths_for(probs), cands, ids[anchor + 2 : anchor + 2 + depth])
                rounds_at[a] += 1
                anchor += 1 if args.every_position else a + 1
        rounds_of[name] = rounds_at
    rounds_at = rounds_of.pop("chain")
    rounds = sum(rounds_at)
    per_depth = [sum(rounds_at[d:]) / rounds for d in range(1, args.k + 1)]
    data = args.data or f"bench_heads.py's {args.bench_prompts} + {args.bench_prompts} prompts x {args.max_new_tokens} tokens"
    result = {"heads": str(args.heads), "data": data, "truth_tokens": truth_tokens, "refine": args.refine, "k": args.k, "rounds": rounds,
              "anchors": "every position" if args.every_position else "round by round",
              "acceptance_length": round(1 + sum(per_depth), 3), "per_depth_acceptance": [round(x, 3) for x in per_depth]}
    if rounds_of:
        result["trees"] = {name: {"rounds": sum(r), "acceptance_length": round(1 + sum(a * n for a, n in enumerate(r)) / sum(r), 3)}
                           for name, r in rounds_of.items()}
    print(json.dumps(result))

if __name__ == "__main__":
    main()
