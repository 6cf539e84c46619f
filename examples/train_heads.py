#!/usr/bin/env python3
"""Train Medusa heads and an EAGLE-3 module for the demo target, on the demo corpus, on a CPU budget.

The demo target (examples/demo-pair/target: 6 layers, hidden 256, vocab 4096)
was trained on the Python standard library's source (examples/train_demo_pair.py).
This script follows ModelOpt's speculative-decoding workflow on it:

1. prompts  - code snippets (4-12 lines ending at a line break) cut at random
              from the corpus's training files, and from its held-out files
              (sha256(path) % 50 == 0, as train_demo_pair.py splits them) for evaluation;
2. data     - the target answers them greedily (``specdec-train prepare-data``;
              with the demo engine when ``--engine-dir`` exists, else transformers);
3. medusa   - ``--medusa-heads`` heads of one residual block, trained on the answers;
4. eagle    - an EAGLE-3 module of one decoder layer over the target's layers [1, 2], with
              ``--eagle-ttt-steps`` training-time-test steps (step j = drafting depth j,
              fed the module's own outputs as drafting does);
5. peagle   - a P-EAGLE module (EAGLE-3's, plus a learned placeholder) drafting ``--peagle-depths`` positions
              in one pass;
6. report   - top-1 accuracy per head / per depth on the held-out answers, before and after.

``--modes eagle`` trains the EAGLE module only (``--modes medusa`` the Medusa heads only). ``--cpu-minutes``
budgets each mode in CPU time of this process instead of wall time (a shared machine stretches the latter);
``--reuse-data`` keeps OUTPUT_DIR/data's answers when they answer the prompts drawn (the same ``--prompts``,
``--more-prompts`` and ``--data-seed``; ``--seed`` seeds the training only). ``--more-prompts N`` adds N training
prompts from a stream of their own, so a larger set keeps the smaller one's prompts and held-out snippets (to compare
training on more answers).

Example (a few minutes on 2 threads, after the quickstart built demo-engines/)::

    python examples/train_heads.py --output-dir demo-engines/heads --threads 2 --minutes 2

Measured (shared 2-core CPU, 2 threads, --minutes 2; 373 s in all; before --eagle-ttt-steps existed), held-out top-1 before -> after:
Medusa heads 0/1/2 (tokens t+2/t+3/t+4) 0.040/0.135/0.156 -> 0.566/0.473/0.416 in 174 steps;
EAGLE-3 trained on depth 1 only (the target's t+2) 0.005 -> 0.576 in 155 steps.

EAGLE-3 with training-time test (the shipped examples/demo-pair/heads/eagle: ``--modes eagle
--eagle-ttt-steps 3 --prompts 2048 --minutes 10 --threads 2``, 702 s in all on a shared 2-core CPU,
loss steps weighted 0.9^(j-1)), held-out top-1 at drafting depths 1/2/3 (tokens t+2/t+3/t+4)
0.001/0.004/0.000 -> 0.650/0.652/0.621 in 893 steps. A module trained on depth 1 only (385 steps,
0.670 held-out at depth 1) accepted nothing past depth 1 when drafting: it had never seen its own
outputs fed back, which is how drafting reaches depths 2 and 3.

The heads land in OUTPUT_DIR/medusa and OUTPUT_DIR/eagle in ModelOpt's layout
(docs/train-heads.md), each with its model card and loss curve. The Medusa heads
build into a target engine (specdec-build --speculative_decoding_mode medusa --medusa_dir
OUTPUT_DIR/medusa), the EAGLE module into an eagle target (--speculative_decoding_mode eagle
--eagle_dir OUTPUT_DIR/eagle); specdec-run drafts with either.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import sysconfig
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from train_demo_pair import collect_corpus  # noqa: E402  (the demo corpus and its held-out split)

from specdec.train.prepare import PrepareConfig, prepare_data  # noqa: E402
from specdec.train.trainer import TrainConfig, train  # noqa: E402

HELDOUT_MOD = 50  # train_demo_pair.py's default split


def snippets(items: list[tuple[str, str]], n: int, rng: random.Random) -> list[str]:
    """``n`` prompts: 4-12 consecutive lines of a random file (at most 400 characters), so answers outweigh prompts."""
    out = []
    while len(out) < n:
        _, text = rng.choice(items)
        lines = text.splitlines()
        if len(lines) < 24:
            continue
        start = rng.randrange(0, len(lines) - 12)
        chunk = "\n".join(lines[start : start + rng.randint(4, 12)])[:400]
        if chunk.strip():
            out.append(chunk + "\n")
    return out


def write_prompts(path: Path, prompts: list[str]) -> Path:
    path.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts))
    return path


def draw_prompts(train_items: list[tuple[str, str]], heldout_items: list[tuple[str, str]], prompts: int, eval_prompts: int,
                 more_prompts: int, seed: int) -> dict[str, list[str]]:
    """{"prompts": training prompts, "eval_prompts": held-out ones}. The held-out ones are drawn after ``prompts``
    training ones from the same stream, and ``more_prompts`` from a stream of their own (seed + 1): adding more keeps
    both."""
    rng = random.Random(seed)
    drawn = {"prompts": snippets(train_items, prompts, rng)}
    drawn["eval_prompts"] = snippets(heldout_items, eval_prompts, rng)
    drawn["prompts"] += snippets(train_items, more_prompts, random.Random(seed + 1))
    return drawn


def answered_prompts(path: Path) -> list[str]:
    """The prompts an answers file (prepare-data's conversations) answers, in order."""
    return [json.loads(line)["conversations"][0]["content"] for line in path.read_text().splitlines() if line.strip()]


def reusable(answers: Path, prompts: list[str]) -> bool:
    """--reuse-data: whether ``answers`` answers exactly ``prompts``, in order (else they are answered again)."""
    return answers.is_file() and answered_prompts(answers) == prompts


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--output-dir", type=Path, default=Path("demo-engines/heads"))
    p.add_argument("--target", type=Path, default=HERE / "demo-pair" / "target")
    p.add_argument("--engine-dir", type=Path, default=Path("demo-engines/target"), help="used for prepare-data when it exists")
    p.add_argument("--prompts", type=int, default=256, help="training prompts")
    p.add_argument("--eval-prompts", type=int, default=32, help="held-out prompts (from held-out files)")
    p.add_argument("--more-prompts", type=int, default=0,
                   help="more training prompts, from a stream of their own: a larger set that keeps --prompts' "
                        "prompts and held-out snippets, to compare training on more answers")
    p.add_argument("--max-token", type=int, default=64, help="tokens the target answers per prompt")
    p.add_argument("--minutes", type=float, default=2.0, help="training wall-clock budget per mode")
    p.add_argument("--cpu-minutes", type=float, default=None, help="training budget per mode in CPU minutes of this process (instead of --minutes)")
    p.add_argument("--max-steps", type=int, default=None, help="train exactly this many steps per mode (instead of a time budget)")
    p.add_argument("--reuse-data", action="store_true", help="keep OUTPUT_DIR/data's answers when they answer the prompts drawn")
    p.add_argument("--medusa-heads", type=int, default=3)
    p.add_argument("--eagle-ttt-steps", type=int, default=3, help="EAGLE training-time-test steps (depths trained)")
    p.add_argument("--peagle-depths", type=int, default=8, help="P-EAGLE drafting positions trained (one pass drafts up to this many)")
    p.add_argument("--peagle-layers", type=int, default=1, help="P-EAGLE: decoder layers of the module")
    p.add_argument("--peagle-decay", type=float, default=0.5, help="P-EAGLE: drafting position j's loss weighs this^(j-1)")
    p.add_argument("--peagle-down-sample-ratio", type=float, default=0.7,
                   help="P-EAGLE: placeholder depth d trains on max(ratio^d, 0.2) of the anchors (1: every anchor at every depth)")
    p.add_argument("--peagle-gate", choices=("none", "greedy", "soft"), default="none",
                   help="P-EAGLE: weigh position j's loss by whether (greedy) or how likely (soft) positions 1..j-1 were right")
    p.add_argument("--peagle-truth-tokens", action="store_true",
                   help="P-EAGLE: a bound, not a drafter: the placeholders read the true tokens (what a k-call drafter reads), into "
                        "OUTPUT_DIR/peagle-truth-tokens, for benchmarks/peagle_replay.py (specdec-build refuses it)")
    p.add_argument("--peagle-refine", action="store_true",
                   help="P-EAGLE: train half the blocks reading the true tokens, so that drafting may refine a block with a second "
                        "call that reads the first call's drafts (it still drafts in one call)")
    p.add_argument("--modes", default="medusa,eagle", help="which to train: medusa, eagle, peagle (comma-separated)")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--lr-scheduler", choices=("constant", "cosine"), default="constant",
                   help="cosine decays over the budget (--minutes / --cpu-minutes) or --max-steps")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=0, help="the training's seed")
    p.add_argument("--data-seed", type=int, default=0, help="the prompts' seed (the shipped heads': 0)")
    args = p.parse_args()

    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not modes or set(modes) - {"medusa", "eagle", "peagle"}:
        p.error(f"--modes {args.modes!r}: expected some of medusa, eagle, peagle")
    if args.peagle_truth_tokens and "peagle" not in modes:
        p.error("--peagle-truth-tokens trains a P-EAGLE module: add peagle to --modes")
    if args.peagle_refine and "peagle" not in modes:
        p.error("--peagle-refine trains a P-EAGLE module: add peagle to --modes")
    if args.peagle_refine and args.peagle_truth_tokens:
        p.error("--peagle-refine trains a drafter; --peagle-truth-tokens a bound that reads the true tokens always: give one")

    started = time.perf_counter()
    out = args.output_dir
    data = out / "data"
    data.mkdir(parents=True, exist_ok=True)
    train_items, heldout_items = collect_corpus(Path(sysconfig.get_paths()["stdlib"]), HELDOUT_MOD)
    drawn = draw_prompts(train_items, heldout_items, args.prompts, args.eval_prompts, args.more_prompts, args.data_seed)
    for name, prompts in drawn.items():
        write_prompts(data / f"{name}.jsonl", prompts)
    print(f"corpus: {len(train_items)} training files, {len(heldout_items)} held out")

    on_engine = (args.engine_dir / "config.json").is_file()
    gen = dict(engine_dir=str(args.engine_dir)) if on_engine else dict(model_dir=str(args.target))
    generator = None
    if on_engine:  # the runtime answers: specdec-train prepare-data's own generator (train/ imports nothing of the runtime)
        from specdec.cli.train import EngineGenerator as generator
    for name, prompts in drawn.items():
        answers = data / f"{name}.answers.jsonl"
        if args.reuse_data and answers.is_file():
            if reusable(answers, prompts):
                continue
            print(f"--reuse-data: {answers} answers other prompts (another --prompts, --more-prompts or --data-seed); answering again")
        prepare_data(PrepareConfig(str(data / f"{name}.jsonl"), str(data / f"{name}.answers.jsonl"), max_token=args.max_token,
                                   num_threads=args.threads, **gen), progress_bar=False, generator=generator)
    data_s = time.perf_counter() - started

    budget = (dict(max_steps=args.max_steps) if args.max_steps else dict(max_cpu_time=args.cpu_minutes * 60) if args.cpu_minutes
              else dict(max_time=args.minutes * 60))
    common = dict(model=str(args.target), data=str(data / "prompts.answers.jsonl"), eval_data=str(data / "eval_prompts.answers.jsonl"),
                  lr=args.lr, batch_size=args.batch_size, num_epochs=1000, save_steps=100_000, training_seq_len=256,
                  lr_scheduler=args.lr_scheduler, seed=args.seed, num_threads=args.threads, overwrite_output_dir=True, **budget)
    results = {}
    if "medusa" in modes:
        results["medusa"] = train(TrainConfig(mode="medusa", output_dir=str(out / "medusa"), medusa_num_heads=args.medusa_heads,
                                              medusa_num_layers=1, **common))
    if "eagle" in modes:
        results["eagle"] = train(TrainConfig(mode="eagle", output_dir=str(out / "eagle"), eagle_num_layers=1,
                                             eagle_ttt_steps=args.eagle_ttt_steps, **common))
    if "peagle" in modes:
        results["peagle"] = train(TrainConfig(mode="peagle", output_dir=str(out / ("peagle-truth-tokens" if args.peagle_truth_tokens else "peagle")),
                                              eagle_num_layers=args.peagle_layers, peagle_truth_tokens=args.peagle_truth_tokens,
                                              peagle_refine=args.peagle_refine,
                                              peagle_depths=args.peagle_depths, eagle_loss_decay_factor=args.peagle_decay,
                                              peagle_down_sample_ratio=args.peagle_down_sample_ratio, peagle_gate=args.peagle_gate, **common))

    print(f"\nheld-out top-1 ({args.eval_prompts} prompts from held-out files, {args.max_token} greedy target tokens each); "
          f"data {data_s:.0f} s, {args.threads} thread(s)")
    print(f"{'head':<34}{'before':>8}{'after':>8}{'steps':>7}{'train s':>9}{'CPU s':>8}")
    for mode, r in results.items():
        labels = ([f"medusa head {i} (token t+{i + 2})" for i in range(len(r.accuracy))] if mode == "medusa"
                  else [f"{mode} depth {j + 1} (target's t+{j + 2})" for j in range(len(r.accuracy))])
        for label, before, after in zip(labels, r.accuracy_before or [float("nan")] * len(labels), r.accuracy, strict=False):
            print(f"{label:<34}{before:>8.3f}{after:>8.3f}{r.steps:>7}{r.seconds:>9.0f}{r.cpu_seconds:>8.0f}")
    folders = {m: f"{out}/{m}-truth-tokens" if m == "peagle" and args.peagle_truth_tokens else f"{out}/{m}" for m in results}
    print(f"total {time.perf_counter() - started:.0f} s; heads in {', '.join(folders.values())}")


if __name__ == "__main__":
    main()
