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
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file

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
                               peagle_placeholders=cfg.get("peagle_placeholders", "constant")), base)
    run.heads.load_state_dict({k: v.float() for k, v in load_file(str(heads / "model.safetensors")).items()}, strict=True)
    return run


@torch.no_grad()
def blocks(run, base, seq, k: int) -> tuple[dict[int, list[int]], list[int]]:
    """{anchor p: the k drafted tokens}, and the sequence's ids."""
    ids, attn, loss_mask = collate([seq])
    out = run_base(base, ids, attn, run.aux_ids)
    aux, next_embeds = out.aux_hidden[:, :-1], base.get_input_embeddings()(ids[:, 1:])  # pairs: features at t, token t+1
    layout = parallel_layout(attn[:, :-1], loss_mask, k, 1.0, 1.0, None)  # every anchor
    drafted = run.heads.lm_head(run.heads.parallel_hidden(aux, next_embeds, layout))[0].argmax(-1)  # [T' + M]
    real = aux.shape[1]
    found: dict[int, dict[int, int]] = {p: {0: int(drafted[p])} for p in range(real)}
    for j in range(layout.used.shape[1]):
        if layout.used[0, j]:
            found[int(layout.anchors[0, j])][int(layout.depths[0, j])] = int(drafted[real + j])
    full = {p: [d[i] for i in range(k)] for p, d in found.items() if len(d) == k}
    return full, ids[0].tolist()


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
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    if bool(args.data) == bool(args.bench_prompts):
        p.error("give one of --data and --bench_prompts")
    torch.set_num_threads(args.threads)
    base = load_base(args.base)
    run = load_module(args.heads, args.base, base)
    run.heads.eval()
    accepted = [0] * (args.k + 1)  # rounds that accepted a tokens
    seqs = (read_sequences(args.data, None, args.max_len, None) if args.data
            else bench_answers(base, args.base, args.bench_prompts, args.prompt_tokens, args.max_new_tokens))
    for seq in seqs:
        drafted, ids = blocks(run, base, seq, args.k)
        anchor = seq.prompt_len - 1  # the prompt's last pair: its next token is the target's first answer token
        while anchor in drafted:
            truth = ids[anchor + 2 : anchor + 2 + args.k]
            a = 0
            while a < args.k and drafted[anchor][a] == truth[a]:
                a += 1
            accepted[a] += 1
            anchor += 1 if args.every_position else a + 1
    rounds = sum(accepted)
    per_depth = [sum(accepted[d:]) / rounds for d in range(1, args.k + 1)]
    data = args.data or f"bench_heads.py's {args.bench_prompts} + {args.bench_prompts} prompts x {args.max_new_tokens} tokens"
    print(json.dumps({"heads": str(args.heads), "data": data, "k": args.k, "rounds": rounds,
                      "anchors": "every position" if args.every_position else "round by round",
                      "acceptance_length": round(1 + sum(per_depth), 3), "per_depth_acceptance": [round(x, 3) for x in per_depth]}))


if __name__ == "__main__":
    main()
