#!/usr/bin/env python3
"""Train a draft for the demo target with ANOTHER tokenizer: the cross-tokenizer demo (issue 24).

The demo pair's draft shares the target's 4096-token BPE. Users often hold a
small model of another family, whose tokenizer differs; specdec drafts with
it through text (runtime/proposers/cross_tokenizer.py). This script makes
such a draft offline with the demo pair's own recipe (examples/train_demo_pair.py:
same corpus, same held-out files, same draft architecture and training loop)
and a different byte-level BPE: 3000 tokens, its special tokens in the other
order (``<|pad|>`` = 0, ``<|endoftext|>`` = 1), so ids mean different things
on the two sides.

Output (``--output-dir``, default ``examples/demo-pair/draft-bpe3k``): the
checkpoint (float16 safetensors), tokenizer.json, tokenizer_config.json,
training_log.json and a model card README.md with the measured figures.

    python examples/train_cross_tokenizer_draft.py
    python examples/train_cross_tokenizer_draft.py --output-dir /tmp/x --max-steps 20   # a smoke run
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import sysconfig
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import train_demo_pair as demo  # noqa: E402  (the demo pair's recipe, reused as is)


def train_tokenizer(texts, vocab_size: int):
    """The demo's byte-level BPE with another size and the special tokens in the other order."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, special_tokens=[demo.PAD, demo.EOT],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer, length=len(texts))
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=demo.EOT, eos_token=demo.EOT, unk_token=None, pad_token=demo.PAD,
                                   model_max_length=1024, clean_up_tokenization_spaces=False, padding_side="left")


@torch.no_grad()
def heldout_loss(model, stream: np.ndarray, seq_len: int, batch: int) -> tuple[float, int]:
    """Mean next-token loss (nats) over the held-out stream in seq_len windows, and the tokens scored."""
    data, n = demo.heldout_windows(stream, seq_len)
    total, count = 0.0, 0
    for i in range(0, n, batch):
        x = torch.stack([data[r * seq_len : r * seq_len + seq_len + 1] for r in range(i, min(n, i + batch))])
        logits = model(input_ids=x[:, :-1]).logits.float()
        total += F.cross_entropy(logits.reshape(-1, logits.size(-1)), x[:, 1:].reshape(-1), reduction="sum").item()
        count += x[:, 1:].numel()
    return total / count, count


CARD = """# draft-bpe3k: a draft for the demo target with another tokenizer

> **A toy.** Like the demo pair beside it (`../README.md`), it exists to show and
> test speculative decoding offline: here, drafting with a model whose tokenizer
> is not the target's. It is not a useful language model.

A `LlamaForCausalLM` with the demo draft's architecture ({layers} layers, hidden {hidden},
{params:.2f} M parameters, float16 safetensors, {size:.1f} MiB with its tokenizer), trained from
scratch on CPU on the demo pair's corpus (the Python {py} standard library, the same
{n_train} training files; the same {n_heldout} held-out files, `../heldout_files.txt`).

**Its tokenizer is not the target's**: a byte-level BPE of **{vocab} tokens** (the target's
has 4096), trained on the same training files, with `<|pad|>` = {pad_id} and
`<|endoftext|>` = {eot_id} (the target has them the other way round). Token ids mean
different things on the two sides, so specdec drafts with it through text: draft tokens are
decoded to bytes and re-encoded with the target's tokenizer, and the accepted text is
re-encoded for the draft (docs/suffix-decoding.md#a-draft-with-another-tokenizer).

```bash
specdec-build --model_dir examples/demo-pair/draft-bpe3k --output_dir /tmp/draft-bpe3k
specdec-run --engine_dir TARGET_ENGINE --draft_engine_dir /tmp/draft-bpe3k --draft_len 4 --input_text "def "
```

## Training

`{command}`: plain next-token cross-entropy on random 256-token windows of the packed
training stream (batch 16), AdamW, warmup then cosine decay to 0.1x the peak LR {lr}, bf16 autocast,
seed {seed}, {threads} torch threads, a budget of {minutes} min of CPU time per thread
({steps} steps, {tokens:.1f} M tokens, {wall:.1f} min wall clock on a shared 2-core machine).
Final train loss {final:.3f} nats/token. Software: torch {torch_v}, transformers {tf_v}, tokenizers {tok_v}.

## Evaluation (held-out files, the float16 checkpoint reloaded)

Losses per token are not comparable across tokenizers; per byte of text they are.

| | this draft ({vocab} tokens) | demo target (4096) | demo draft (4096) |
|---|---|---|---|
| held-out loss (nats/token) | {d_loss:.3f} | {t_loss:.3f} | {dd_loss:.3f} |
| held-out bytes per token | {d_bpt:.2f} | {t_bpt:.2f} | {t_bpt:.2f} |
| **bits per byte** | **{d_bpb:.3f}** | {t_bpb:.3f} | {dd_bpb:.3f} |

How often its drafts survive the demo target's verification, measured by specdec itself, is in
docs/benchmarks.md#the-demo-pair-and-a-draft-with-another-tokenizer and benchmarks/bench_drafters.py.
"""


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--output-dir", type=Path, default=Path("examples/demo-pair/draft-bpe3k"))
    p.add_argument("--target-dir", type=Path, default=Path("examples/demo-pair/target"), help="the demo target (for the card's comparison)")
    p.add_argument("--demo-draft-dir", type=Path, default=Path("examples/demo-pair/draft"))
    p.add_argument("--vocab-size", type=int, default=3000)
    p.add_argument("--minutes", type=float, default=8.0, help="training budget, CPU minutes per thread (the demo draft's)")
    p.add_argument("--max-steps", type=int, default=None)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=1236)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    demo.enable_determinism()
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    t_start = time.perf_counter()
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    train_items, heldout_items = demo.collect_corpus(stdlib, 50)
    tok = train_tokenizer([t for _, t in train_items], args.vocab_size)
    demo.check_roundtrip(tok, [t for _, t in heldout_items] + ["\tx = 1\r\n\n  \n# ü → 😀 日本語\n"])
    demo.log(f"tokenizer: {len(tok)} tokens, decode(encode(x)) == x on every held-out file")
    train_stream = demo.encode_stream(tok, [t for _, t in train_items])
    heldout_stream = demo.encode_stream(tok, [t for _, t in heldout_items])
    train_args = argparse.Namespace(seq_len=256, batch_size=16, budget_clock="cpu", threads=args.threads, max_steps=args.max_steps,
                                    warmup_steps=100, min_lr_ratio=0.1, weight_decay=0.1, grad_clip=1.0, no_bf16=False,
                                    log_every=50, distill_alpha=0.0)
    demo.set_seed(args.seed)
    model = demo.make_model(demo.DRAFT_ARCH, tok, 1024, 10000.0)
    result = demo.train_lm("draft-bpe3k", model, train_stream, train_args, args.minutes, args.lr, args.seed)
    staging = args.output_dir.with_name(args.output_dir.name + ".tmp")
    demo.save_model(model, staging)
    demo.save_tokenizer(tok, staging)

    # evaluation on the reloaded float16 checkpoints, per token and per byte
    heldout_bytes = sum(len(t.encode()) for _, t in heldout_items)
    draft = AutoModelForCausalLM.from_pretrained(staging, dtype=torch.float32).eval()
    d_loss, d_count = heldout_loss(draft, heldout_stream, 256, 16)
    t_tok = AutoTokenizer.from_pretrained(args.target_dir)
    t_stream = demo.encode_stream(t_tok, [t for _, t in heldout_items])
    t_loss, t_count = heldout_loss(AutoModelForCausalLM.from_pretrained(args.target_dir, dtype=torch.float32).eval(), t_stream, 256, 16)
    dd_loss, _ = heldout_loss(AutoModelForCausalLM.from_pretrained(args.demo_draft_dir, dtype=torch.float32).eval(), t_stream, 256, 16)
    d_bpt = heldout_bytes / (len(heldout_stream) - 1)
    t_bpt = heldout_bytes / (len(t_stream) - 1)
    figures = dict(d_loss=d_loss, t_loss=t_loss, dd_loss=dd_loss, d_bpt=d_bpt, t_bpt=t_bpt,
                   d_bpb=d_loss / math.log(2) / d_bpt, t_bpb=t_loss / math.log(2) / t_bpt, dd_bpb=dd_loss / math.log(2) / t_bpt)
    demo.log(f"eval: {json.dumps({k: round(v, 4) for k, v in figures.items()})}")
    versions = demo.versions()
    log = {**{k: result[k] for k in demo.TRAIN_RESULT_KEYS}, "eval": figures, "versions": versions,
           "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}}
    (staging / "training_log.json").write_text(json.dumps(log, indent=1) + "\n")
    arch = demo.DRAFT_ARCH
    (staging / "README.md").write_text(CARD.format(
        layers=arch["num_hidden_layers"], hidden=arch["hidden_size"], params=demo.n_params(draft) / 1e6,
        size=demo.dir_size(staging) / 2**20, py=versions["python"], n_train=len(train_items), n_heldout=len(heldout_items),
        vocab=len(tok), pad_id=tok.pad_token_id, eot_id=tok.eos_token_id, lr=args.lr, seed=args.seed, threads=args.threads,
        command="python examples/train_cross_tokenizer_draft.py" + "".join(f" {a}" for a in (argv if argv is not None else sys.argv[1:])),
        minutes=args.minutes, steps=result["steps"], tokens=result["tokens_seen"] / 1e6, wall=(time.perf_counter() - t_start) / 60,
        final=result["final_train_loss"], torch_v=versions["torch"], tf_v=versions["transformers"], tok_v=versions["tokenizers"], **figures))
    if args.output_dir.exists():
        import shutil

        shutil.rmtree(args.output_dir)
    staging.rename(args.output_dir)
    demo.log(f"wrote {args.output_dir}")


if __name__ == "__main__":
    main()
