#!/usr/bin/env python3
"""Fine-tune the demo target with a LoRA adapter (peft), for specdec-build --lora_dir.

The demo target (examples/demo-pair/target) learned the Python standard library. This fine-tunes it on another
code base, by default the source of the `click` package (installed with specdec), the way a LoRA fine-tune adapts
a model to a domain: LoRA on every attention and MLP projection, the base frozen, AdamW on the adapter alone, packed
256-token windows, under a wall-clock budget on the CPU. The adapter is saved as peft saves it
(adapter_config.json + adapter_model.safetensors), which is what specdec-build --lora_dir reads:

    python examples/train_lora.py --output-dir demo-engines/lora
    specdec-build --checkpoint_dir examples/demo-pair/target --lora_dir demo-engines/lora \\
        --output_dir demo-engines/target-lora --speculative_decoding_mode draft_tokens_external

Needs torch, transformers and peft (pip install peft). It prints the held-out loss of the base and of the adapted
model on the corpus's held-out files, so the fine-tune is seen to have moved the model.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import random
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROJECTIONS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def corpus_files(root: Path) -> tuple[list[Path], list[Path]]:
    """The ``*.py`` files under ``root``, sorted, split by a hash of their path: about one in eight held out (at least one)."""
    files = sorted(p for p in root.rglob("*.py") if "__pycache__" not in p.parts)
    if len(files) < 2:
        raise SystemExit(f"error: --corpus {root} holds {len(files)} .py file(s); it needs at least two (one is held out).")
    held = [p for p in files if int(hashlib.sha256(str(p.relative_to(root)).encode()).hexdigest(), 16) % 8 == 0] or files[-1:]
    return [p for p in files if p not in held], held


def heldout_prompts(files: list[Path], n: int, rng: random.Random) -> list[str]:
    """``n`` prompts: 6-12 consecutive lines of a held-out file, without the last newline (the demo tokenizer merges a newline
    with the next line's indentation, so a prompt ending in one would start the model at column 0)."""
    texts = [f.read_text(encoding="utf-8", errors="replace").splitlines() for f in files]
    texts = [lines for lines in texts if len(lines) > 13]
    if not texts:
        raise SystemExit("error: no held-out file has more than 13 lines to draw prompts from; give --corpus a larger folder.")
    out: list[str] = []
    for _ in range(1000 * n):  # (chunks of blank lines or over 600 characters are drawn again)
        if len(out) == n:
            break
        lines = rng.choice(texts)
        start = rng.randrange(0, len(lines) - 13)
        chunk = "\n".join(lines[start : start + rng.randint(6, 12)])
        if chunk.strip() and len(chunk) < 600:
            out.append(chunk)
    return out


def token_stream(files: list[Path], tokenizer, eos: int) -> list[int]:
    ids: list[int] = []
    for f in files:
        ids += tokenizer.encode(f.read_text(encoding="utf-8", errors="replace")).ids + [eos]
    return ids


def mean_loss(model, stream: list[int], window: int, torch) -> float:
    """Teacher-forced loss over the stream's consecutive windows."""
    losses = []
    with torch.no_grad():
        for start in range(0, len(stream) - window - 1, window):
            x = torch.tensor([stream[start : start + window + 1]])
            losses.append(float(torch.nn.functional.cross_entropy(model(input_ids=x[:, :-1]).logits[0], x[0, 1:])))
    return sum(losses) / max(1, len(losses))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", type=Path, default=HERE / "demo-pair" / "target", help="the base checkpoint")
    p.add_argument("--corpus", type=Path, default=None, help="a folder of .py files to fine-tune on [default: the click package's source]")
    p.add_argument("--output-dir", type=Path, default=Path("demo-engines/lora"))
    p.add_argument("--rank", type=int, default=16)
    p.add_argument("--alpha", type=float, default=32.0)
    p.add_argument("--minutes", type=float, default=3.0, help="wall-clock training budget")
    p.add_argument("--max-steps", type=int, default=0, help="stop after this many steps (0: the budget decides)")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--window", type=int, default=256)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--prompts-file", type=Path, default=None,
                   help="also write prompts from the held-out files here ({\"prompt\": ...} lines, for specdec-bench run --dataset)")
    p.add_argument("--prompts", type=int, default=16, help="how many, with --prompts-file")
    args = p.parse_args()

    import torch
    import transformers
    from peft import LoraConfig, get_peft_model
    from tokenizers import Tokenizer

    if args.corpus is None:
        import click

        args.corpus = Path(click.__file__).parent
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    tokenizer = Tokenizer.from_file(str(args.target / "tokenizer.json"))
    base = transformers.AutoModelForCausalLM.from_pretrained(args.target, dtype=torch.float32)
    eos = base.config.eos_token_id
    train_files, held_files = corpus_files(args.corpus)
    train, held = token_stream(train_files, tokenizer, eos), token_stream(held_files, tokenizer, eos)
    print(f"corpus {args.corpus}: {len(train_files)} files ({len(train):,} tokens) to train on, {len(held_files)} held out ({len(held):,} tokens)")
    base.eval()
    base_loss = mean_loss(base, held, args.window, torch)
    print(f"held-out loss of the base model: {base_loss:.3f} (perplexity {math.exp(base_loss):.2f})")

    model = get_peft_model(base, LoraConfig(r=args.rank, lora_alpha=args.alpha, target_modules=PROJECTIONS, lora_dropout=0.0))
    trainable = [q for q in model.parameters() if q.requires_grad]
    print(f"LoRA r={args.rank} alpha={args.alpha:g} on {', '.join(PROJECTIONS)}: {sum(q.numel() for q in trainable):,} trainable parameters")
    optimizer = torch.optim.AdamW(trainable, lr=args.lr, weight_decay=0.0)
    model.train()
    start, step = time.monotonic(), 0
    while (args.max_steps and step < args.max_steps) or (not args.max_steps and time.monotonic() - start < args.minutes * 60):
        starts = [rng.randrange(0, len(train) - args.window - 1) for _ in range(args.batch)]
        x = torch.tensor([train[s : s + args.window + 1] for s in starts])  # [batch, window + 1]
        logits = model(input_ids=x[:, :-1]).logits  # [batch, window, vocab]
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        step += 1
        if step % 20 == 0:
            print(f"step {step}: loss {loss.item():.3f} ({time.monotonic() - start:.0f} s)", flush=True)
    model.eval()
    tuned_loss = mean_loss(model, held, args.window, torch)
    print(f"held-out loss after {step} steps: {tuned_loss:.3f} (perplexity {math.exp(tuned_loss):.2f}; base {math.exp(base_loss):.2f})")
    model.save_pretrained(args.output_dir)
    print(f"saved the adapter to {args.output_dir} (adapter_config.json, adapter_model.safetensors)")
    if args.prompts_file:
        prompts = heldout_prompts(held_files, args.prompts, random.Random(args.seed + 1))
        args.prompts_file.write_text("".join(json.dumps({"prompt": q}) + "\n" for q in prompts))
        print(f"wrote {len(prompts)} held-out prompts to {args.prompts_file}")


if __name__ == "__main__":
    main()
