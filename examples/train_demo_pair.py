#!/usr/bin/env python3
"""Train specdec's tiny offline demo model pair (a target and a draft LM).

Speculative decoding needs two models that share a tokenizer and that agree
with each other often. No model hub is reachable from where specdec is
developed and tested, so this script builds such a pair from scratch on CPU,
using only what every Python installation ships with: the source code of the
Python standard library (PSF licence).

Steps (all deterministic apart from the wall-clock time budget):

1. corpus   - every ``*.py`` file under ``sysconfig.get_paths()["stdlib"]``,
              minus test directories, site-packages and build-specific files;
              sorted, with a hash-selected ~2% of files held out.
2. tokenizer- byte-level BPE (``tokenizers``), vocab 4096, special tokens
              ``<|endoftext|>`` (BOS/EOS between files) and ``<|pad|>``;
              saved as a Hugging Face fast tokenizer in both model dirs.
3. target   - ``LlamaForCausalLM``: 6 layers, d=256, 8 heads / 4 KV heads.
4. draft    - ``LlamaForCausalLM``: 2 layers, d=128, 4 heads / 2 KV heads.
              Both are plain next-token LMs trained on the same packed random
              256-token windows; AdamW, linear warmup + cosine decay, under a
              fixed CPU wall-clock budget (or a step cap).
5. eval     - held-out loss / perplexity of each model (weights reloaded from
              the saved float16 checkpoints), teacher-forced greedy agreement
              between draft and target, and a simulation of greedy
              speculative decoding on target-generated text.
6. card     - ``README.md`` (model card) with the measured figures.

Output layout (``--output-dir``, default ``examples/demo-pair``)::

    README.md  heldout_files.txt
    target/  {config,generation_config}.json model.safetensors
             tokenizer.json tokenizer_config.json training_log.json
    draft/   (same files)

Example::

    python examples/train_demo_pair.py --output-dir examples/demo-pair
    python examples/train_demo_pair.py --output-dir /tmp/demo-smoke --max-steps 20
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import json
import math
import os
import platform
import random
import shlex
import shutil
import sys
import sysconfig
import time
from pathlib import Path

# Idle OpenMP threads sleep instead of spinning. On a shared machine spinning
# burns CPU that other processes could use, and it slowed training by 2-4x in
# our measurements when the cores were oversubscribed.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

EOT = "<|endoftext|>"
PAD = "<|pad|>"

# Directory names (anywhere in a file's relative path) that are not part of
# the corpus: test suites, third-party packages, caches.
EXCLUDED_DIRS = frozenset(
    {"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__"}
)

TARGET_ARCH = dict(
    num_hidden_layers=6,
    hidden_size=256,
    intermediate_size=768,
    num_attention_heads=8,
    num_key_value_heads=4,
    head_dim=32,
)
DRAFT_ARCH = dict(
    num_hidden_layers=2,
    hidden_size=128,
    intermediate_size=384,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
)


TRAIN_RESULT_KEYS = ("steps", "tokens_seen", "epochs_seen", "wall_time_s", "budget_clock", "budget_clock_s",
                     "final_train_loss", "warmup_steps", "loss_curve")

# --------------------------------------------------------------------------
# utilities
# --------------------------------------------------------------------------

def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def set_seed(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def enable_determinism() -> bool:
    try:
        torch.use_deterministic_algorithms(True, warn_only=True)
        return True
    except Exception as exc:  # pragma: no cover - depends on torch build
        log(f"deterministic algorithms unavailable: {exc}")
        return False


def versions() -> dict:
    import tokenizers
    import transformers

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "tokenizers": tokenizers.__version__,
        "numpy": np.__version__,
        "platform": platform.platform(),
    }


# --------------------------------------------------------------------------
# corpus
# --------------------------------------------------------------------------

def is_corpus_file(rel: Path) -> bool:
    if set(rel.parts[:-1]) & EXCLUDED_DIRS:
        return False
    if rel.parts[0].startswith("config-"):  # python-config.py of the build
        return False
    if rel.name.startswith("_sysconfigdata"):  # build-specific, generated
        return False
    return True


def is_heldout(rel_posix: str, heldout_mod: int) -> bool:
    digest = hashlib.sha256(rel_posix.encode("utf-8")).hexdigest()
    return int(digest, 16) % heldout_mod == 0


def collect_corpus(stdlib: Path, heldout_mod: int):
    """Return (train, heldout) as sorted lists of (relative posix path, text)."""
    files = sorted(
        (p for p in stdlib.rglob("*.py") if p.is_file()),
        key=lambda p: p.relative_to(stdlib).as_posix(),
    )
    train, heldout = [], []
    for path in files:
        rel = path.relative_to(stdlib)
        if not is_corpus_file(rel):
            continue
        raw = path.read_bytes()
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            text = raw.decode("latin-1")
        text = text.replace(EOT, "").replace(PAD, "")  # never in practice
        if not text.strip():
            continue
        item = (rel.as_posix(), text)
        (heldout if is_heldout(item[0], heldout_mod) else train).append(item)
    return train, heldout


def corpus_digest(items) -> str:
    h = hashlib.sha256()
    for rel, text in items:
        h.update(rel.encode())
        h.update(b"\0")
        h.update(text.encode("utf-8", "surrogatepass"))
        h.update(b"\0")
    return h.hexdigest()


# --------------------------------------------------------------------------
# tokenizer
# --------------------------------------------------------------------------

def train_tokenizer(texts, vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=[EOT, PAD],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer, length=len(texts))
    return tok


def wrap_tokenizer(tok, max_len: int):
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=EOT,
        eos_token=EOT,
        unk_token=None,
        pad_token=PAD,
        model_max_length=max_len,
        clean_up_tokenization_spaces=False,
        padding_side="left",
    )


def encode_stream(hf_tok, texts) -> np.ndarray:
    """Pack files as <|endoftext|> f1 <|endoftext|> f2 ... <|endoftext|>."""
    eot = hf_tok.convert_tokens_to_ids(EOT)
    backend = hf_tok.backend_tokenizer
    out = [np.array([eot], dtype=np.uint16)]
    for enc in backend.encode_batch(list(texts), add_special_tokens=False):
        out.append(np.asarray(enc.ids, dtype=np.uint16))
        out.append(np.array([eot], dtype=np.uint16))
    return np.concatenate(out)


def check_roundtrip(hf_tok, texts) -> int:
    """decode(encode(x)) == x for every text; returns number of texts checked."""
    for t in texts:
        ids = hf_tok(t, add_special_tokens=False)["input_ids"]
        back = hf_tok.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
        if back != t:
            i = next((k for k, (a, b) in enumerate(zip(t, back, strict=False)) if a != b), min(len(t), len(back)))
            raise SystemExit(f"tokenizer round-trip failed near char {i}: {t[i-20:i+20]!r} vs {back[i-20:i+20]!r}")
    return len(texts)


# --------------------------------------------------------------------------
# models
# --------------------------------------------------------------------------

def make_model(arch: dict, hf_tok, max_pos: int, rope_theta: float):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=len(hf_tok),
        max_position_embeddings=max_pos,
        rope_parameters={"rope_type": "default", "rope_theta": float(rope_theta)},
        tie_word_embeddings=True,
        hidden_act="silu",
        rms_norm_eps=1e-6,
        initializer_range=0.02,
        attention_bias=False,
        mlp_bias=False,
        bos_token_id=hf_tok.bos_token_id,
        eos_token_id=hf_tok.eos_token_id,
        pad_token_id=hf_tok.pad_token_id,
        use_cache=True,
        **arch,
    )
    cfg._attn_implementation = "sdpa"
    model = LlamaForCausalLM(cfg)
    model.generation_config.bos_token_id = hf_tok.bos_token_id
    model.generation_config.eos_token_id = hf_tok.eos_token_id
    model.generation_config.pad_token_id = hf_tok.pad_token_id
    return model


def n_params(model) -> int:
    # tied embeddings are counted once
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


def lr_at(step: int, progress: float, peak: float, warmup: int, min_ratio: float) -> float:
    warm = min(1.0, (step + 1) / max(1, warmup))
    progress = min(max(progress, 0.0), 1.0)
    cos = min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))
    return peak * warm * cos


def train_lm(name, model, stream, args, minutes, peak_lr, seed, teacher=None):
    """Plain next-token training on random packed windows of ``stream``."""
    set_seed(seed)
    rng = np.random.default_rng(seed)
    L, B = args.seq_len, args.batch_size
    budget_s = minutes * 60.0
    if args.budget_clock == "cpu":
        # CPU seconds of this process divided by the thread count. On an idle
        # machine this tracks the wall clock; on a busy one it stops the
        # amount of training from depending on how much CPU others use.
        def clock():
            return time.process_time() / max(1, args.threads)
    else:
        clock = time.perf_counter
    if budget_s <= 0 and not args.max_steps:
        raise SystemExit(f"{name}: need a positive time budget or --max-steps")
    warmup = args.warmup_steps
    if args.max_steps:
        warmup = min(warmup, max(1, args.max_steps // 10))

    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": args.weight_decay},
         {"params": no_decay, "weight_decay": 0.0}],
        lr=peak_lr, betas=(0.9, 0.95), eps=1e-8,
    )
    model.train()
    use_bf16 = not args.no_bf16
    high = len(stream) - L - 1
    curve, window_losses = [], []
    recent = collections.deque(maxlen=max(1, args.log_every))  # for the final train loss
    tokens = 0
    step = 0
    t0 = time.perf_counter()
    c0 = clock()
    t_log, tok_log = t0, 0
    log(f"{name}: training {n_params(model)/1e6:.2f}M params, batch {B}x{L}, peak lr {peak_lr}, "
        f"budget {minutes} min ({args.budget_clock} clock)" + (f", max {args.max_steps} steps" if args.max_steps else ""))
    while True:
        progress = (clock() - c0) / budget_s if budget_s > 0 else 0.0
        if args.max_steps:
            progress = max(progress, step / args.max_steps)
        if progress >= 1.0:
            break
        lr = lr_at(step, progress, peak_lr, warmup, args.min_lr_ratio)
        for g in opt.param_groups:
            g["lr"] = lr
        starts = rng.integers(0, high, size=B)
        batch = torch.from_numpy(np.stack([stream[s:s + L + 1] for s in starts]).astype(np.int64))
        inp, tgt = batch[:, :-1], batch[:, 1:]
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=use_bf16):
            logits = model(input_ids=inp).logits
        logits = logits.float()
        loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), tgt.reshape(-1))
        total = loss
        if teacher is not None and args.distill_alpha > 0:
            with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=use_bf16):
                t_logits = teacher(input_ids=inp).logits
            kl = F.kl_div(F.log_softmax(logits, -1), F.log_softmax(t_logits.float(), -1),
                          log_target=True, reduction="batchmean") / L
            total = (1 - args.distill_alpha) * loss + args.distill_alpha * kl
        opt.zero_grad(set_to_none=True)
        total.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
        opt.step()
        step += 1
        tokens += B * L
        window_losses.append(loss.item())
        recent.append(window_losses[-1])
        if step % args.log_every == 0:
            now = time.perf_counter()
            tps = (tokens - tok_log) / (now - t_log)
            mean_loss = sum(window_losses) / len(window_losses)
            curve.append({"step": step, "loss": round(mean_loss, 4), "lr": lr, "tokens": tokens,
                          "elapsed_s": round(now - t0, 1), "budget_clock_s": round(clock() - c0, 1),
                          "tok_per_s": round(tps)})
            log(f"{name} step {step:5d}  loss {mean_loss:.4f}  lr {lr:.2e}  "
                f"{tps:,.0f} tok/s  wall {now - t0:5.0f}s  budget {clock() - c0:5.0f}s "
                f"({min(progress, 1):.0%})")
            window_losses = []
            t_log, tok_log = now, tokens
    wall = time.perf_counter() - t0
    budget_used = clock() - c0
    final_train_loss = float(sum(recent) / len(recent)) if recent else float("nan")
    log(f"{name}: done, {step} steps, {tokens:,} tokens in {wall:.0f}s; final train loss {final_train_loss:.4f}")
    model.eval()
    return {
        "steps": step,
        "tokens_seen": tokens,
        "epochs_seen": round(tokens / len(stream), 3),
        "wall_time_s": round(wall, 1),
        "budget_clock": args.budget_clock,
        "budget_clock_s": round(budget_used, 1),
        "final_train_loss": round(final_train_loss, 4),
        "loss_curve": curve,
        "warmup_steps": warmup,
    }


# --------------------------------------------------------------------------
# evaluation
# --------------------------------------------------------------------------

def heldout_windows(stream: np.ndarray, seq_len: int) -> torch.Tensor:
    n = (len(stream) - 1) // seq_len
    return torch.from_numpy(stream[: n * seq_len + 1].astype(np.int64)), n


@torch.no_grad()
def evaluate_pair(target, draft, stream, seq_len, batch_size):
    """Held-out loss of both models and teacher-forced draft/target agreement."""
    data, n = heldout_windows(stream, seq_len)
    sums = {"target_nll": 0.0, "draft_nll": 0.0, "agree": 0, "target_acc": 0,
            "draft_acc": 0, "min_pq": 0.0}
    count = 0
    for i in range(0, n, batch_size):
        rows = range(i, min(n, i + batch_size))
        x = torch.stack([data[r * seq_len: r * seq_len + seq_len + 1] for r in rows])
        inp, tgt = x[:, :-1], x[:, 1:]
        lt = target(input_ids=inp).logits.float()
        ld = draft(input_ids=inp).logits.float()
        V = lt.size(-1)
        sums["target_nll"] += F.cross_entropy(lt.reshape(-1, V), tgt.reshape(-1), reduction="sum").item()
        sums["draft_nll"] += F.cross_entropy(ld.reshape(-1, V), tgt.reshape(-1), reduction="sum").item()
        at, ad = lt.argmax(-1), ld.argmax(-1)
        sums["agree"] += (at == ad).sum().item()
        sums["target_acc"] += (at == tgt).sum().item()
        sums["draft_acc"] += (ad == tgt).sum().item()
        sums["min_pq"] += torch.minimum(lt.softmax(-1), ld.softmax(-1)).sum(-1).sum().item()
        count += tgt.numel()
    tl, dl = sums["target_nll"] / count, sums["draft_nll"] / count
    return {
        "heldout_tokens": count,
        "target_loss": round(tl, 4), "target_ppl": round(math.exp(tl), 3),
        "draft_loss": round(dl, 4), "draft_ppl": round(math.exp(dl), 3),
        "greedy_agreement": round(sums["agree"] / count, 4),
        "target_top1_acc": round(sums["target_acc"] / count, 4),
        "draft_top1_acc": round(sums["draft_acc"] / count, 4),
        "sampling_acceptance_t1": round(sums["min_pq"] / count, 4),
    }


@torch.no_grad()
def simulate_greedy_specdec(target, draft, stream, n_prompts, prompt_len, new_tokens, gammas, seed):
    """Greedy speculative decoding on the target's own greedy continuations.

    With greedy verification the accepted text is exactly the target's greedy
    continuation, and draft token j of a block is accepted iff the draft's
    argmax given that text agrees with the target for j and all earlier block
    positions. So per-position agreement on target-generated text determines
    the acceptance pattern exactly.
    """
    rng = np.random.default_rng(seed)
    starts = rng.integers(0, len(stream) - prompt_len - 1, size=n_prompts)
    prompts = torch.from_numpy(np.stack([stream[s:s + prompt_len] for s in starts]).astype(np.int64))
    # fixed-length greedy continuations (EOS does not stop them; all rows equal length)
    seq = target.generate(input_ids=prompts, attention_mask=torch.ones_like(prompts),
                          max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                          pad_token_id=target.config.pad_token_id)
    assert seq.shape[1] == prompt_len + new_tokens
    ld = draft(input_ids=seq[:, :-1]).logits
    d_pred = ld.argmax(-1)[:, prompt_len - 1:]  # predictions for generated positions
    gen = seq[:, prompt_len:]
    agree = (d_pred == gen)
    out = {"prompts": n_prompts, "prompt_len": prompt_len, "new_tokens": new_tokens,
           "agreement_on_target_greedy_text": round(agree.float().mean().item(), 4)}
    flags = agree.tolist()
    for g in gammas:
        emitted = calls = accepted = 0
        for row in flags:
            pos = 0
            while pos < len(row):
                k = 0
                while k < g and pos + k < len(row) and row[pos + k]:
                    k += 1
                accepted += k
                step_tokens = min(k + 1, len(row) - pos)
                emitted += step_tokens
                calls += 1
                pos += step_tokens
        out[f"gamma{g}_tokens_per_target_call"] = round(emitted / calls, 3)
        out[f"gamma{g}_draft_acceptance_rate"] = round(accepted / (calls * g), 4)
    return out


def sample_text(model, hf_tok, prompt: str, new_tokens: int) -> str:
    ids = hf_tok(EOT + prompt, return_tensors="pt", add_special_tokens=False)
    out = model.generate(**ids, max_new_tokens=new_tokens, do_sample=False,
                         pad_token_id=hf_tok.pad_token_id)
    return hf_tok.decode(out[0, ids["input_ids"].shape[1]:], skip_special_tokens=False)


# --------------------------------------------------------------------------
# saving / card
# --------------------------------------------------------------------------

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def save_model(model, out: Path):
    out.mkdir(parents=True, exist_ok=True)
    model.config.use_cache = True
    model.to(torch.float16).save_pretrained(out, safe_serialization=True)
    model.to(torch.float32)


def save_tokenizer(hf_tok, out: Path):
    out.mkdir(parents=True, exist_ok=True)
    hf_tok.save_pretrained(out)
    # transformers 5 records its internal class name ("TokenizersBackend"); the
    # generic name loads the same tokenizer.json in transformers 4.x and 5.x.
    cfg_path = out / "tokenizer_config.json"
    tok_cfg = json.loads(cfg_path.read_text())
    tok_cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    cfg_path.write_text(json.dumps(tok_cfg, indent=2, ensure_ascii=False) + "\n")
    for extra in ("special_tokens_map.json", "chat_template.jinja"):  # not used; keep dirs minimal
        if (out / extra).exists() and extra not in TOKENIZER_FILES:
            (out / extra).unlink()


def copy_tokenizer(src: Path, dst: Path):
    """The draft gets byte-identical tokenizer files."""
    dst.mkdir(parents=True, exist_ok=True)
    for name in TOKENIZER_FILES:
        shutil.copyfile(src / name, dst / name)


def dir_size(p: Path) -> int:
    return sum(f.stat().st_size for f in p.rglob("*") if f.is_file())


def write_card(out_dir: Path, info: dict) -> None:
    t, d, ev, sim = info["target"], info["draft"], info["pair_eval"], info["specdec_sim"]
    tc, dc = t["config"], d["config"]  # the card's long rows

    def heads(cfg: dict) -> str:
        return f"{cfg['num_attention_heads']} / {cfg['num_key_value_heads']}"

    gam = info["gammas"]
    alpha = info["args"]["distill_alpha"]
    sim_note = (
        "\n  That is higher than on held-out human-written code, because greedy output is "
        "repetitive and easy to predict."
        if sim["agreement_on_target_greedy_text"] > ev["greedy_agreement"] else ""
    )
    distill_line = (
        "Plain next-token cross-entropy for both models, on the same data. The draft is *not* "
        "distilled (`--distill-alpha` turns that on)." if not alpha else
        f"Target: plain next-token cross-entropy. Draft: (1-{alpha:g})·cross-entropy + "
        f"{alpha:g}·KL(target ‖ draft) against the trained target, on the same data."
    )
    sim_rows = "\n".join(
        f"| {g} | {sim[f'gamma{g}_draft_acceptance_rate']:.3f} | {sim[f'gamma{g}_tokens_per_target_call']:.2f} |"
        for g in gam
    )
    curve_t = ", ".join(f"{c['step']}: {c['loss']:.2f}" for c in t["loss_curve"][:: max(1, len(t["loss_curve"]) // 8)])
    curve_d = ", ".join(f"{c['step']}: {c['loss']:.2f}" for c in d["loss_curve"][:: max(1, len(d["loss_curve"]) // 8)])
    card = f"""# specdec demo pair: toy target + draft LMs trained on the Python stdlib

> **This is a toy pair.** It is there to show and test speculative decoding
> offline, and it is not a useful language model. It writes text that looks
> like Python, but the code is usually wrong. Do not use it for anything else.

`target/` and `draft/` are two small `LlamaForCausalLM` checkpoints trained
from scratch on CPU. They share one byte-level BPE tokenizer, so the draft can
propose tokens that the target checks. Speculative decoding only pays off when
the draft's guesses match the target's, and this pair agrees on
**{ev['greedy_agreement']:.1%}** of held-out positions (greedy, teacher-forced).

Both load with plain `transformers`:

```python
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
tok = AutoTokenizer.from_pretrained("examples/demo-pair/target")
target = AutoModelForCausalLM.from_pretrained("examples/demo-pair/target", dtype=torch.float32)
draft = AutoModelForCausalLM.from_pretrained("examples/demo-pair/draft", dtype=torch.float32)
```

The weights are stored in float16. Without `dtype=`, transformers 5 loads
them in float16, which is slow on CPU, so pass `dtype=torch.float32` there.

## Models

| | target | draft |
|---|---|---|
| architecture | LlamaForCausalLM | LlamaForCausalLM |
| layers | {t['config']['num_hidden_layers']} | {d['config']['num_hidden_layers']} |
| hidden size | {t['config']['hidden_size']} | {d['config']['hidden_size']} |
| intermediate size | {t['config']['intermediate_size']} | {d['config']['intermediate_size']} |
| attention heads / KV heads (GQA) | {heads(tc)} | {heads(dc)} |
| head dim | {t['config']['head_dim']} | {d['config']['head_dim']} |
| max positions (RoPE θ = {tc['rope_parameters']['rope_theta']:g}) | {tc['max_position_embeddings']} | {dc['max_position_embeddings']} |
| tied input/output embeddings | yes | yes |
| parameters | {t['n_params']/1e6:.2f} M | {d['n_params']/1e6:.2f} M |
| stored dtype | float16 (safetensors) | float16 (safetensors) |
| size on disk (with tokenizer) | {t['dir_bytes']/2**20:.1f} MiB | {d['dir_bytes']/2**20:.1f} MiB |

Tokenizer (the same files in both directories): byte-level BPE trained with
`tokenizers` on the training split. It has {info['tokenizer']['vocab_size']} tokens,
including `<|endoftext|>` (id {info['tokenizer']['eot_id']}; BOS, EOS and file
separator) and `<|pad|>` (id {info['tokenizer']['pad_id']}). It uses a ByteLevel
pre-tokenizer and decoder, so `decode(encode(x)) == x` for any text, whitespace
and newlines included. The script checks this on every held-out file. On
held-out code it averages {info['tokenizer']['heldout_chars_per_token']:.2f} characters per token.

## Data

The `*.py` source files of the Python {info['versions']['python']} standard library, as found
offline at `sysconfig.get_paths()["stdlib"]`. The script leaves out test
directories (`test/`, `tests/`, `idlelib/idle_test/`, `lib2to3/tests/`, ...),
`site-packages/`, the build's `config-*/` directory and the generated
`_sysconfigdata_*.py`. That leaves {info['corpus']['n_files']} files
({info['corpus']['bytes']/1e6:.1f} MB), sorted by path. A file is held out when
`sha256(relative_path) % {info['corpus']['heldout_mod']} == 0`. This picks
{info['corpus']['n_heldout']} files ({info['corpus']['heldout_bytes']/1e3:.0f} kB; listed in
`heldout_files.txt`), which are used for neither tokenizer nor model training.
Files are packed into a single token stream separated by `<|endoftext|>`:
{info['corpus']['train_tokens']:,} training tokens and {info['corpus']['heldout_tokens']:,}
held-out tokens. Corpus SHA-256: `{info['corpus']['sha256'][:16]}…`. A different
Python version gives a different corpus.

**Licence of the data:** the Python standard library is distributed under the
[Python Software Foundation License](https://docs.python.org/3/license.html)
(PSF License Version 2), a permissive licence. These weights are derived from that code.

## Training recipe

```
{info['command']}
```

Run from the repository root. The pair in this directory was trained on a
shared 2-core CPU machine, under `nice -n 19`.

- {distill_line}
- Each step draws a batch of {info['args']['batch_size']} random windows of {info['args']['seq_len']} tokens from the packed
  training stream, using a seeded NumPy generator.
- AdamW (β = 0.9/0.95, weight decay {info['args']['weight_decay']} on matrices), gradient
  clipping at {info['args']['grad_clip']}, linear warmup for {t['warmup_steps']} steps, then cosine decay to
  {info['args']['min_lr_ratio']:g}× the peak LR. Cosine progress follows the time budget, so
  the step count depends on machine speed. The clock is
  `--budget-clock {info['args']['budget_clock']}`: `cpu` is process CPU time divided by the thread
  count, which matches the wall clock on an idle machine and does not shrink
  training when the machine is shared. To get a step-defined schedule, pass
  `--max-steps N` with large `--*-minutes`.
- Peak LR: {info['args']['target_lr']:g} (target), {info['args']['draft_lr']:g} (draft). bf16 autocast on CPU, fp32 master weights.
- Seeds: {info['seeds']} (python `random`, NumPy and torch),
  `torch.use_deterministic_algorithms(True)`, {info['args']['threads']} torch threads.
- Software: torch {info['versions']['torch']}, transformers {info['versions']['transformers']},
  tokenizers {info['versions']['tokenizers']}, Python {info['versions']['python']}.

| | target | draft |
|---|---|---|
| time budget | {info['args']['target_minutes']:g} min | {info['args']['draft_minutes']:g} min |
| budget used ({info['args']['budget_clock']} clock) | {t['budget_clock_s']/60:.1f} min | {d['budget_clock_s']/60:.1f} min |
| wall time | {t['wall_time_s']/60:.1f} min | {d['wall_time_s']/60:.1f} min |
| optimizer steps | {t['steps']:,} | {d['steps']:,} |
| tokens seen (epochs) | {t['tokens_seen']/1e6:.1f} M ({t['epochs_seen']:.2f}) | {d['tokens_seen']/1e6:.1f} M ({d['epochs_seen']:.2f}) |
| final train loss (nats/token) | {t['final_train_loss']:.3f} | {d['final_train_loss']:.3f} |

Train loss by step: target {curve_t}; draft {curve_d}.
The full curves are in each `training_log.json`.

## Evaluation (held-out files, float16 checkpoints reloaded from disk)

Teacher-forced, on {ev['heldout_tokens']:,} held-out tokens in {info['args']['seq_len']}-token windows:

| | target | draft |
|---|---|---|
| held-out loss (nats/token) | {ev['target_loss']:.3f} | {ev['draft_loss']:.3f} |
| held-out perplexity | **{ev['target_ppl']:.2f}** | **{ev['draft_ppl']:.2f}** |
| top-1 next-token accuracy | {ev['target_top1_acc']:.3f} | {ev['draft_top1_acc']:.3f} |

Draft vs target. These are the numbers speculative decoding depends on:

- **Greedy agreement** (fraction of positions where the draft's argmax equals the
  target's argmax): **{ev['greedy_agreement']:.3f}**
- Expected acceptance when sampling at temperature 1, `E[Σ min(p_target, p_draft)]`:
  {ev['sampling_acceptance_t1']:.3f}
- Greedy speculative decoding, simulated exactly on the target's own greedy
  continuations ({sim['prompts']} held-out prompts of {sim['prompt_len']} tokens, {sim['new_tokens']} new tokens
  each). The draft agrees with the target on {sim['agreement_on_target_greedy_text']:.3f} of those positions.{sim_note}

| γ (draft tokens per step) | draft-token acceptance | tokens per target forward |
|---|---|---|
{sim_rows}

Greedy continuations of `def `, for a quick look (target):

```python
def {info['sample_target']}
```

## Intended use and limitations

- Intended use: demos, tests and benchmarks of specdec's speculative decoding
  (engine compilation, draft/verify loop, acceptance statistics), offline and
  on CPU.
- These models are tiny and were trained for minutes on a few million tokens
  of a single kind of text. They do not follow instructions, they have no knowledge, and the code
  they write is mostly wrong. Do not use their output for anything.
- The figures were measured on CPU with the checkpoints stored here. Other
  hardware and kernels can move the agreement and speed-up figures a little.
"""
    (out_dir / "README.md").write_text(card, encoding="utf-8")


# --------------------------------------------------------------------------
# main
# --------------------------------------------------------------------------

def parse_args(argv=None):
    p = argparse.ArgumentParser(
        description=(
            "Train specdec's tiny offline demo pair: a 6-layer target and a 2-layer draft "
            "LlamaForCausalLM sharing a 4096-token byte-level BPE tokenizer, trained on CPU on "
            "the Python standard library's own source (PSF licence). Writes target/, draft/, "
            "heldout_files.txt and a model card (README.md) into --output-dir."
        ),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--output-dir", type=Path, default=Path("examples/demo-pair"),
                   help="where target/, draft/, heldout_files.txt and README.md are written")
    p.add_argument("--target-minutes", type=float, default=22.0,
                   help="training time budget for the target in minutes, measured by --budget-clock; "
                        "the cosine LR schedule follows it")
    p.add_argument("--draft-minutes", type=float, default=8.0,
                   help="training time budget for the draft in minutes, measured by --budget-clock")
    p.add_argument("--budget-clock", choices=("cpu", "wall"), default="cpu",
                   help="'cpu': process CPU time / --threads, equal to the wall clock on an idle "
                        "machine, but the training amount stays put when the machine is shared or "
                        "the run is niced; 'wall': plain wall-clock time")
    p.add_argument("--max-steps", type=int, default=None,
                   help="cap optimizer steps per model (e.g. 20 for a smoke run); the LR schedule "
                        "ends at whichever of time budget or step cap comes first")
    p.add_argument("--seq-len", type=int, default=256, help="training window length in tokens")
    p.add_argument("--batch-size", type=int, default=16, help="windows per optimizer step")
    p.add_argument("--target-lr", type=float, default=2e-3, help="peak AdamW learning rate, target")
    p.add_argument("--draft-lr", type=float, default=3e-3, help="peak AdamW learning rate, draft")
    p.add_argument("--min-lr-ratio", type=float, default=0.1, help="final LR as a fraction of peak")
    p.add_argument("--warmup-steps", type=int, default=100, help="linear warmup steps")
    p.add_argument("--weight-decay", type=float, default=0.1, help="AdamW weight decay (matrices only)")
    p.add_argument("--grad-clip", type=float, default=1.0, help="gradient-norm clipping threshold")
    p.add_argument("--distill-alpha", type=float, default=0.0,
                   help="if >0, train the draft on (1-a)*CE + a*KL(target||draft) (slower per step)")
    p.add_argument("--vocab-size", type=int, default=4096, help="BPE vocabulary size incl. special tokens")
    p.add_argument("--heldout-mod", type=int, default=50,
                   help="a file is held out iff sha256(relative path) %% N == 0 (50 => ~2%%)")
    p.add_argument("--max-positions", type=int, default=1024, help="max_position_embeddings of both models")
    p.add_argument("--rope-theta", type=float, default=10000.0, help="RoPE base")
    p.add_argument("--seed", type=int, default=1234, help="base seed (target uses seed, draft seed+1)")
    p.add_argument("--threads", type=int, default=2, help="torch.set_num_threads")
    p.add_argument("--no-bf16", action="store_true", help="train in plain fp32 instead of bf16 autocast")
    p.add_argument("--log-every", type=int, default=50, help="log step/loss/tokens-per-second every N steps")
    p.add_argument("--eval-batch-size", type=int, default=16, help="windows per batch during evaluation")
    p.add_argument("--sim-prompts", type=int, default=8, help="prompts for the greedy spec-decode simulation")
    p.add_argument("--sim-new-tokens", type=int, default=128, help="greedy tokens per simulation prompt")
    p.add_argument("--reuse-target", action="store_true",
                   help="do not retrain tokenizer/target: load them from --output-dir and train only the draft")
    p.add_argument("--stdlib", type=Path, default=None,
                   help="override the stdlib directory (default: sysconfig.get_paths()['stdlib'])")
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")
    torch.set_num_threads(args.threads)
    deterministic = enable_determinism()
    set_seed(args.seed)
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()  # e.g. "sequence longer than model_max_length" on whole files
    t_start = time.perf_counter()
    out_dir: Path = args.output_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    tdir, ddir = out_dir / "target", out_dir / "draft"
    argv_used = sys.argv[1:] if argv is None else list(argv)
    command = "python examples/train_demo_pair.py " + " ".join(shlex.quote(a) for a in argv_used)

    # 1. corpus ------------------------------------------------------------
    stdlib = Path(args.stdlib or sysconfig.get_paths()["stdlib"])
    train_items, heldout_items = collect_corpus(stdlib, args.heldout_mod)
    all_items = sorted(train_items + heldout_items)
    n_files = len(all_items)
    log(f"corpus: {stdlib}: {n_files} files, {len(heldout_items)} held out "
        f"({sum(len(t) for _, t in all_items)/1e6:.1f}M chars)")
    (out_dir / "heldout_files.txt").write_text(
        "".join(rel + "\n" for rel, _ in heldout_items), encoding="utf-8")

    # 2. tokenizer -----------------------------------------------------------
    if args.reuse_target:
        hf_tok = AutoTokenizer.from_pretrained(tdir)
        log(f"tokenizer: reused from {tdir}")
    else:
        t0 = time.perf_counter()
        tok = train_tokenizer([t for _, t in train_items], args.vocab_size)
        hf_tok = wrap_tokenizer(tok, args.max_positions)
        log(f"tokenizer: trained {len(hf_tok)} tokens in {time.perf_counter()-t0:.0f}s")
    eot_id = hf_tok.convert_tokens_to_ids(EOT)
    pad_id = hf_tok.convert_tokens_to_ids(PAD)
    assert hf_tok.bos_token_id == eot_id and hf_tok.eos_token_id == eot_id and hf_tok.pad_token_id == pad_id
    check_roundtrip(hf_tok, [t for _, t in heldout_items] + ["\tx = 1\r\n\n  \n# ü → 😀\n"])
    log("tokenizer: decode(encode(x)) == x on all held-out files")
    train_stream = encode_stream(hf_tok, [t for _, t in train_items])
    heldout_stream = encode_stream(hf_tok, [t for _, t in heldout_items])
    heldout_chars = sum(len(t) for _, t in heldout_items)
    log(f"tokens: train {len(train_stream):,}, held-out {len(heldout_stream):,} "
        f"({heldout_chars / (len(heldout_stream) - len(heldout_items) - 1):.2f} chars/token)")

    corpus_info = {
        "stdlib": str(stdlib), "n_files": n_files, "n_train": len(train_items),
        "n_heldout": len(heldout_items), "heldout_mod": args.heldout_mod,
        "bytes": sum(len(t.encode()) for _, t in all_items),
        "heldout_bytes": sum(len(t.encode()) for _, t in heldout_items),
        "train_tokens": int(len(train_stream)), "heldout_tokens": int(len(heldout_stream)),
        "sha256": corpus_digest(all_items),
    }
    tok_info = {"vocab_size": len(hf_tok), "eot_id": eot_id, "pad_id": pad_id,
                "heldout_chars_per_token": round(
                    heldout_chars / (len(heldout_stream) - len(heldout_items) - 1), 3)}
    common = {
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "command": command, "versions": versions(), "deterministic_algorithms": deterministic,
        "corpus": corpus_info, "tokenizer": tok_info,
    }

    # 3. target --------------------------------------------------------------
    if args.reuse_target:
        target = AutoModelForCausalLM.from_pretrained(tdir, dtype=torch.float32)
        prev = json.loads((tdir / "training_log.json").read_text())
        target_result = {k: prev[k] for k in TRAIN_RESULT_KEYS}
        log(f"target: reused from {tdir}")
    else:
        set_seed(args.seed)
        target = make_model(TARGET_ARCH, hf_tok, args.max_positions, args.rope_theta)
        target_result = train_lm("target", target, train_stream, args, args.target_minutes,
                                 args.target_lr, args.seed)
        save_model(target, tdir)
        save_tokenizer(hf_tok, tdir)
    target.eval()

    # 4. draft ---------------------------------------------------------------
    set_seed(args.seed + 1)
    draft = make_model(DRAFT_ARCH, hf_tok, args.max_positions, args.rope_theta)
    teacher = target if args.distill_alpha > 0 else None
    if teacher is not None:
        for p in teacher.parameters():
            p.requires_grad_(False)
    draft_result = train_lm("draft", draft, train_stream, args, args.draft_minutes,
                            args.draft_lr, args.seed + 1, teacher=teacher)
    save_model(draft, ddir)
    copy_tokenizer(tdir, ddir)
    del target, draft, teacher

    # 5. evaluation on the reloaded float16 checkpoints ----------------------
    log("eval: reloading checkpoints from disk")
    tok_t = AutoTokenizer.from_pretrained(tdir)
    tok_d = AutoTokenizer.from_pretrained(ddir)
    assert tok_t.get_vocab() == tok_d.get_vocab() == hf_tok.get_vocab()
    for a in TOKENIZER_FILES:
        assert (tdir / a).read_bytes() == (ddir / a).read_bytes(), f"{a} differs between target and draft"
    check_roundtrip(tok_t, [t for _, t in heldout_items[:3]])
    target = AutoModelForCausalLM.from_pretrained(tdir, dtype=torch.float32).eval()
    draft = AutoModelForCausalLM.from_pretrained(ddir, dtype=torch.float32).eval()
    t0 = time.perf_counter()
    pair_eval = evaluate_pair(target, draft, heldout_stream, args.seq_len, args.eval_batch_size)
    log(f"eval: {json.dumps(pair_eval)} ({time.perf_counter()-t0:.0f}s)")
    gammas = [1, 2, 4, 8]
    sim = simulate_greedy_specdec(target, draft, heldout_stream, args.sim_prompts, 64,
                                  args.sim_new_tokens, gammas, args.seed)
    log(f"spec-decode simulation: {json.dumps(sim)}")
    sample_t = sample_text(target, tok_t, "def ", 48)
    sample_d = sample_text(draft, tok_d, "def ", 48)
    log(f"sample target: def {sample_t!r}")
    log(f"sample draft:  def {sample_d!r}")

    # 6. logs and card ---------------------------------------------------------
    infos = {}
    for name, model, result, arch_seed, mdir, minutes, lr in [
        ("target", target, target_result, args.seed, tdir, args.target_minutes, args.target_lr),
        ("draft", draft, draft_result, args.seed + 1, ddir, args.draft_minutes, args.draft_lr),
    ]:
        entry = {
            "model": name,
            "config": json.loads((mdir / "config.json").read_text()),
            "n_params": n_params(model),
            **{k: result[k] for k in TRAIN_RESULT_KEYS},
            "time_budget_minutes": minutes,
            "peak_lr": lr,
            "seed": arch_seed,
            "heldout_loss": pair_eval[f"{name}_loss"],
            "heldout_ppl": pair_eval[f"{name}_ppl"],
            "heldout_top1_acc": pair_eval[f"{name}_top1_acc"],
            "pair_eval": pair_eval,
            "specdec_sim": sim,
            **common,
        }
        (mdir / "training_log.json").write_text(json.dumps(entry, indent=2, default=str) + "\n")
        entry["dir_bytes"] = dir_size(mdir)
        infos[name] = entry
    card_info = {
        **common, "target": infos["target"], "draft": infos["draft"], "pair_eval": pair_eval,
        "specdec_sim": sim, "gammas": gammas, "seeds": f"{args.seed} (target), {args.seed + 1} (draft)",
        "sample_target": sample_t.split(EOT)[0].rstrip(),
    }
    write_card(out_dir, card_info)
    total = dir_size(out_dir)
    log(f"wrote {out_dir}/README.md; total size {total/2**20:.1f} MiB; "
        f"total time {(time.perf_counter()-t_start)/60:.1f} min")
    log(f"SUMMARY target ppl {pair_eval['target_ppl']}, draft ppl {pair_eval['draft_ppl']}, "
        f"greedy agreement {pair_eval['greedy_agreement']}")


if __name__ == "__main__":
    main()
