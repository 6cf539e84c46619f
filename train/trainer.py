"""specdec-train run: train Medusa heads or an EAGLE-3 module on a frozen base model.

The loop is plain PyTorch (no HF Trainer): batch -> frozen base forward (no grad)
-> heads forward -> loss -> AdamW step on the heads only. The data order is a
function of (seed, epoch), so a resumed run sees exactly the batches an
uninterrupted one would.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from torch import nn

from ..formats.errors import DeviceError
from ..hardware.cpu import check_num_threads, physical_memory_bytes
from .base import base_config_dict, check_model_dir, load_base, weights_sha256
from .data import Sequence, check_data_file, read_sequences
from .errors import TrainConfigError
from .export import save_heads
from .runs import RUNS, Run
from .state import STATE_FILE, checkpoint_step, latest_checkpoint, load_checkpoint, publish, save_checkpoint

SCHEDULERS = ("constant", "cosine")


@dataclass
class TrainConfig:
    mode: str
    model: str
    data: str
    output_dir: str
    num_epochs: int = 1
    lr: float = 1e-5
    save_steps: int = 1000
    medusa_num_heads: int = 2
    medusa_num_layers: int = 1
    eagle_num_layers: int = 1
    eagle_aux_layer_ids: list[int] | None = None  # None: ModelOpt's default (low, middle, high)
    eagle_ttt_steps: int = 3  # training-time test steps (ModelOpt's eagle_ttt_steps): step j trains drafting depth j; 1 = depth 1 only
    eagle_loss_decay_factor: float = 0.9  # ModelOpt's: step j's loss weighs factor^(j-1) (depth 1 decides every later depth)
    peagle_depths: int = 8  # P-EAGLE: drafting positions trained (1 real pair + depths - 1 placeholders)
    peagle_mask_token_id: int | None = None  # P-EAGLE: the token placeholders read (None: the base's pad, else eos token)
    peagle_down_sample_ratio: float = 0.7  # P-EAGLE: depth d keeps max(ratio^d, ratio_min) of the anchors (COD sampling)
    peagle_down_sample_ratio_min: float = 0.2
    peagle_gate: str = "none"  # P-EAGLE: none | greedy | soft: weigh a position's loss by how right the block's earlier positions were
    peagle_placeholders: str = "anchored"  # P-EAGLE: anchored (one vector per depth, added to the anchor's features) | constant (vLLM's)
    peagle_truth_tokens: bool = False  # P-EAGLE: placeholders read the true tokens: a bound for benchmarks/peagle_replay.py, never built
    peagle_refine: bool = False  # P-EAGLE: half the blocks read the true tokens, so a second call may refine a block reading its drafts
    batch_size: int = 4
    training_seq_len: int = 512
    max_steps: int | None = None  # overrides num_epochs
    warmup_steps: int = 0
    lr_scheduler: str = "constant"
    eval_fraction: float = 0.0  # held-out share of the sequences for the top-1 report; 0 reports on the training data
    eval_data: str | None = None  # a separate .jsonl to report top-1 on (instead of --eval_fraction)
    max_time: float | None = None  # stop (and save) after the step that passes this many seconds of training
    max_cpu_time: float | None = None  # the same in CPU seconds of this process (all its threads): a budget a shared machine does not bend
    seed: int = 0
    resume: bool = False
    overwrite_output_dir: bool = False
    num_threads: int | None = None

    def validate(self) -> None:
        """Every flag check that needs no file: run before anything is read or written."""
        if self.mode not in RUNS:
            raise TrainConfigError(f"--mode {self.mode!r} is not one of {', '.join(RUNS)}.")
        run = RUNS[self.mode]
        positive = {"num_epochs": self.num_epochs, "save_steps": self.save_steps, "batch_size": self.batch_size, **run.counts(self)}
        for name, value in positive.items():
            if value < 1:
                raise TrainConfigError(f"--{name} {value} must be >= 1.")
        run.check_config(self)
        if self.training_seq_len < 3:
            raise TrainConfigError(f"--training_seq_len {self.training_seq_len} must be >= 3 (a head predicts two tokens ahead).")
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise TrainConfigError(f"--lr {self.lr} must be a positive number.")
        if self.max_steps is not None and self.max_steps < 1:
            raise TrainConfigError(f"--max_steps {self.max_steps} must be >= 1.")
        if self.max_steps is not None and self.warmup_steps > self.max_steps:  # every step would run below --lr
            raise TrainConfigError(f"--warmup_steps {self.warmup_steps} is more than --max_steps {self.max_steps}: the run would end while "
                                   "still warming up. Use fewer warmup steps.")
        if self.warmup_steps < 0:
            raise TrainConfigError(f"--warmup_steps {self.warmup_steps} must be >= 0.")
        if self.lr_scheduler not in SCHEDULERS:
            raise TrainConfigError(f"--lr_scheduler {self.lr_scheduler!r} is not one of {', '.join(SCHEDULERS)}.")
        if not 0 <= self.eval_fraction < 1:
            raise TrainConfigError(f"--eval_fraction {self.eval_fraction} must be in [0, 1).")
        if self.eagle_aux_layer_ids is not None and (not self.eagle_aux_layer_ids or min(self.eagle_aux_layer_ids) < 0):
            raise TrainConfigError(f"--eagle_aux_layer_ids {self.eagle_aux_layer_ids} must be non-empty layer indices >= 0.")
        for flag, value in (("max_time", self.max_time), ("max_cpu_time", self.max_cpu_time)):
            if value is not None and not value > 0:  # NaN too
                raise TrainConfigError(f"--{flag} {value} must be > 0 seconds.")
        try:
            check_num_threads(self.num_threads)
        except DeviceError as err:
            raise TrainConfigError(str(err)) from None
        if self.resume and self.overwrite_output_dir:
            raise TrainConfigError("--resume continues the run in --output_dir and --overwrite_output_dir deletes it: choose one.")


@dataclass
class TrainResult:
    output_dir: Path
    steps: int
    losses: list[float]
    final_loss: float
    accuracy: list[float]  # top-1 per head (medusa) or per drafting depth 1..eagle_ttt_steps (eagle), on the eval split
    accuracy_before: list[float] | None
    seconds: float
    cpu_seconds: float  # CPU time of the process over the run (all threads; this session only when resumed on top of others)
    base: nn.Module = field(repr=False)
    heads: nn.Module = field(repr=False)


# what --resume must be given again: the batch order is a function of (seed, batch size, the data less what is held out),
# the heads' shapes and inputs of the rest; another value would not continue the run, and its card would describe a run
# that never happened (and a held-out set changed on resume could hold sequences already trained on)
RESUME_FIXED = ("batch_size", "seed", "model", "data", "eval_data", "eval_fraction", "training_seq_len", "medusa_num_layers", "eagle_num_layers",
                "eagle_aux_layer_ids", "eagle_ttt_steps", "peagle_depths", "peagle_placeholders", "peagle_mask_token_id", "peagle_truth_tokens",
                "peagle_refine")
RESUME_PATHS = ("model", "data", "eval_data")  # compared resolved: the run's own files, wherever it is started from


def check_output_dir(cfg: TrainConfig) -> Path:
    out = Path(cfg.output_dir)
    if out.exists() and not out.is_dir():
        raise TrainConfigError(f"--output_dir {out} exists and is not a directory.")
    busy = out.is_dir() and any(out.iterdir())
    if cfg.resume and latest_checkpoint(out) is None:
        raise TrainConfigError(f"--resume: {out} holds no checkpoint-N folder to resume from.")
    if busy and not cfg.resume and not cfg.overwrite_output_dir:
        raise TrainConfigError(f"--output_dir {out} exists and is not empty; pass --resume to continue its run or --overwrite_output_dir to start "
                               "over.")
    if busy and cfg.overwrite_output_dir:  # it is deleted: only ever a run's own output, never what the run reads or where it stands
        where = out.resolve()
        for flag, path in (("--model", cfg.model), ("--data", cfg.data), ("--eval_data", cfg.eval_data)):
            if path is not None and Path(path).resolve().is_relative_to(where):
                raise TrainConfigError(f"--output_dir {out} is or holds {flag} {path}: --overwrite_output_dir would delete it. Choose another "
                                       "--output_dir.")
        if Path.cwd().resolve().is_relative_to(where):
            raise TrainConfigError(f"--output_dir {out} is the current directory or holds it: --overwrite_output_dir would delete it. Choose "
                                   "another --output_dir.")
        if not is_training_output(out):
            raise TrainConfigError(f"--output_dir {out} holds files that are not a specdec-train run's output: --overwrite_output_dir deletes "
                                   "only a previous run. Choose another --output_dir, or empty it yourself.")
    return out


def is_training_output(path: Path) -> bool:
    """A previous specdec-train run's output directory: its checkpoints or its exported heads (a config.json it wrote)."""
    if latest_checkpoint(path) is not None or (path / "training_log.json").is_file():
        return True
    try:
        return "specdec_train" in json.loads((path / "config.json").read_text())
    except (OSError, ValueError, TypeError):
        return False


def _batch_for_step(step: int, train: list[Sequence], batch_size: int, seed: int) -> list[Sequence]:
    per_epoch = math.ceil(len(train) / batch_size)
    epoch, k = divmod(step, per_epoch)
    order = torch.randperm(len(train), generator=torch.Generator().manual_seed(seed * 1_000_003 + epoch)).tolist()
    return [train[i] for i in order[k * batch_size : (k + 1) * batch_size]]


def _lr_at(cfg: TrainConfig, step: int, total: int, budget_done: float | None = None) -> float:
    """The learning rate of ``step``. Cosine decays over the steps, or under a time budget (``budget_done``: the share of
    --max_time / --max_cpu_time spent so far) over the budget, whichever ends first: a budget's step count is unknown."""
    if cfg.warmup_steps and step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    if cfg.lr_scheduler == "cosine":
        done = max((step - cfg.warmup_steps) / max(1, total - cfg.warmup_steps), budget_done or 0.0)
        return cfg.lr * 0.5 * (1 + math.cos(math.pi * min(1.0, done)))
    return cfg.lr


def _budget_done(cfg: TrainConfig, wall_s: float, cpu_s: float) -> float | None:
    """The share of this run's time budget spent (the larger of wall and CPU), None without one."""
    shares = [spent / budget for spent, budget in ((wall_s, cfg.max_time), (cpu_s, cfg.max_cpu_time)) if budget]
    return max(shares) if shares else None


def make_run(cfg: TrainConfig, base: nn.Module) -> Run:
    """The heads of ``cfg.mode`` on ``base`` (runs.py): what the mode-blind loop below trains."""
    return RUNS[cfg.mode](cfg, base)


def train(cfg: TrainConfig, say: Callable[[str], None] = print, progress_bar: bool = True) -> TrainResult:
    cfg.validate()
    model_dir = check_model_dir(cfg.model)
    data_path = check_data_file(cfg.data, "--data")
    eval_path = check_data_file(cfg.eval_data, "--eval_data") if cfg.eval_data else None
    out = check_output_dir(cfg)
    if cfg.num_threads:
        torch.set_num_threads(cfg.num_threads)
    started, cpu_started = time.perf_counter(), time.process_time()

    # Everything that can be refused is checked before the base model loads (seconds to minutes).
    base_cfg = base_config_dict(model_dir)
    tokenizer = _tokenizer(model_dir)
    seqs = read_sequences(data_path, tokenizer, cfg.training_seq_len, base_cfg.get("vocab_size"))
    if eval_path:
        train_seqs, eval_seqs = seqs, read_sequences(eval_path, tokenizer, cfg.training_seq_len, base_cfg.get("vocab_size"), "--eval_data")
    else:
        train_seqs, eval_seqs = _split(seqs, cfg.eval_fraction, cfg.seed)
    per_epoch = math.ceil(len(train_seqs) / cfg.batch_size)
    total = cfg.max_steps or cfg.num_epochs * per_epoch
    if cfg.resume:
        resume_from = latest_checkpoint(out)  # (check_output_dir made sure there is one)
        _check_resume_flags(cfg, resume_from)
        _check_resume_length(cfg, resume_from, total, per_epoch)
    RUNS[cfg.mode].check_base(cfg, base_cfg)
    _check_memory(cfg, base_cfg)
    base = load_base(model_dir)
    run = make_run(cfg, base)
    names = {i: n for i, (n, _) in enumerate(run.params)}
    optimizer = torch.optim.AdamW([p for _, p in run.params], lr=cfg.lr, weight_decay=0.0)

    provenance = _provenance(cfg, model_dir, data_path, len(seqs), run)
    config = run.export_config(base_cfg, provenance)
    step, losses, elapsed_before = 0, [], 0.0
    before, before_missing = None, ""  # the top-1 before training: kept in each checkpoint, so a resumed run's card shows it
    if cfg.overwrite_output_dir and out.exists():
        shutil.rmtree(out)
    if cfg.resume:
        ckpt = resume_from
        state = load_checkpoint(ckpt, run.heads, optimizer, names)
        step, losses, elapsed_before = state["step"], state["losses"], state.get("elapsed_s", 0.0)
        say(f"resuming from {ckpt} at step {step}")
        if step == total:  # (past it was refused before the base loaded); the outputs are written again, as an interrupted end would
            say(f"{ckpt.name} is already at step {step} of {total}; nothing left to train (raise --max_steps or --num_epochs to go on).")
        before, before_missing = _resumed_before(state, ckpt)
    if step == 0:
        before = run.accuracy(eval_seqs or train_seqs, cfg.batch_size)  # the baseline the card compares with
    say(f"{cfg.mode}: {len(train_seqs)} training sequences{f', {len(eval_seqs)} held out' if eval_seqs else ''}; "
        f"{total} steps of batch {cfg.batch_size}; {sum(p.numel() for _, p in run.params):,} trainable parameters")

    run.heads.train()
    bar = _bar(None if cfg.max_time or cfg.max_cpu_time else total, step, progress_bar)  # under a time budget the step count is not known
    last_saved = None
    loop_start, loop_cpu_start = time.perf_counter(), time.process_time()
    decay_from = 0.0  # the share of a time budget spent when warmup ended: cosine decays over the rest
    while step < total:
        budget = _budget_done(cfg, time.perf_counter() - loop_start, time.process_time() - loop_cpu_start)
        if budget is not None and step == cfg.warmup_steps:
            decay_from = min(budget, 0.99)
        lr = _lr_at(cfg, step, total, None if budget is None else (budget - decay_from) / (1.0 - decay_from))
        for g in optimizer.param_groups:
            g["lr"] = lr
        loss, _ = run.forward(_batch_for_step(step, train_seqs, cfg.batch_size, cfg.seed))
        optimizer.zero_grad(set_to_none=True)
        if loss.requires_grad:  # a batch whose every scored token fell past a short sequence's end has nothing to learn
            loss.backward()
            optimizer.step()
        step += 1
        losses.append(loss.item())
        if bar is not None:
            bar.update(1)
            bar.set_postfix(loss=f"{losses[-1]:.4f}")
        out_of_time = cfg.max_time is not None and time.perf_counter() - loop_start >= cfg.max_time
        out_of_cpu = cfg.max_cpu_time is not None and time.process_time() - loop_cpu_start >= cfg.max_cpu_time
        if (out_of_time or out_of_cpu) and step < total:
            flag, budget = ("max_time", cfg.max_time) if out_of_time else ("max_cpu_time", cfg.max_cpu_time)
            say(f"--{flag} {budget:g} s reached at step {step} of {total}")
            total = step
        if step % cfg.save_steps == 0 or step == total:
            elapsed = elapsed_before + time.perf_counter() - started
            last_saved = save_checkpoint(out, step, run.heads, config, optimizer, names,
                                         {"losses": losses, "elapsed_s": elapsed, "config": asdict(cfg), "accuracy_before": before})
    if bar is not None:
        bar.close()
    run.heads.eval()
    accuracy = run.accuracy(eval_seqs or train_seqs, cfg.batch_size)
    seconds, cpu_seconds = elapsed_before + time.perf_counter() - started, time.process_time() - cpu_started
    final_loss = _tail_mean(losses)
    _write_final(out, run, config, cfg, losses, accuracy, before, (seconds, cpu_seconds), step, provenance, bool(eval_seqs), before_missing)
    if last_saved:
        say(f"checkpoint {last_saved}")
    return TrainResult(out, step, losses, final_loss, accuracy, before, seconds, cpu_seconds, base, run.heads)


def _check_resume_flags(cfg: TrainConfig, ckpt: Path) -> None:
    """Refuse a --resume whose RESUME_FIXED flags differ from the checkpoint's run (read from its trainer_state.json, before
    the base loads; an unreadable one is load_checkpoint's to report)."""
    try:
        saved = json.loads((ckpt / STATE_FILE).read_text()).get("config") or {}
    except (OSError, ValueError, AttributeError):
        return

    def same(k: str) -> bool:
        a, b = saved[k], getattr(cfg, k)
        return str(Path(a).resolve()) == str(Path(b).resolve()) if k in RESUME_PATHS and a and b else a == b

    changed = [f"--{k} {saved[k]} (now {getattr(cfg, k)})" for k in RESUME_FIXED if k in saved and not same(k)]
    if changed:
        raise TrainConfigError(f"cannot resume from {ckpt}: it was trained with {', '.join(changed)}; resume with the same values.")


def _check_resume_length(cfg: TrainConfig, ckpt: Path, total: int, per_epoch: int) -> None:
    """A resumed run cannot end before the step its checkpoint reached: it trained nothing and wrote the longer run's heads and
    card again under the shorter run's flags."""
    step = checkpoint_step(ckpt)
    if step <= total:
        return
    asked = f"--max_steps {cfg.max_steps}" if cfg.max_steps else f"--num_epochs {cfg.num_epochs} ({total} steps)"
    more = f"--max_steps {step} or more" if cfg.max_steps else f"--num_epochs {math.ceil(step / per_epoch)} or more (or --max_steps {step})"
    raise TrainConfigError(f"--resume: {asked} ends before step {step}, where {ckpt} already is; resume with {more}, or leave out --resume and "
                           "pass another --output_dir to start over.")


def _resumed_before(state: dict, ckpt: Path) -> tuple[list[float] | None, str]:
    """The top-1 the first run measured before training (each checkpoint keeps it; --resume refuses another evaluation
    set), or None and why."""
    saved = state.get("accuracy_before")
    if saved is None:
        return None, f"{ckpt.name}, which this run resumed from, does not record it"
    return saved, ""


TRAINING_BYTES_PER_PARAMETER = 16  # float32 weight, its gradient and AdamW's two moments


def trainable_parameters(cfg: TrainConfig, base_cfg: dict) -> int:
    """About how many parameters the heads (or the EAGLE module) of ``cfg`` have on this base (layout.py's shapes)."""
    hidden, vocab, inter = (int(base_cfg.get(k) or 0) for k in ("hidden_size", "vocab_size", "intermediate_size"))
    if cfg.mode == "medusa":
        return cfg.medusa_num_heads * (cfg.medusa_num_layers * (hidden * hidden + hidden) + vocab * hidden)
    aux = len(set(cfg.eagle_aux_layer_ids)) if cfg.eagle_aux_layer_ids else 3
    layer = 4 * hidden * hidden + 3 * hidden * inter  # q/k/v/o at most hidden wide, gate/up/down
    placeholder = aux * hidden if cfg.mode == "peagle" else 0  # P-EAGLE's mask_hidden
    # fc, layers (layer 0's q/k/v twice as wide), lm_head
    return aux * hidden * hidden + cfg.eagle_num_layers * layer + 3 * hidden * hidden + vocab * hidden + placeholder


def _check_memory(cfg: TrainConfig, base_cfg: dict) -> None:
    """Refuse heads that could never be trained in this machine's memory (--medusa_num_heads 2147483647), before the
    base model loads: such a run would swap and stall, or be killed, rather than fail."""
    need = trainable_parameters(cfg, base_cfg) * TRAINING_BYTES_PER_PARAMETER
    have = physical_memory_bytes()
    if have is not None and need > have:
        what = f"--medusa_num_heads {cfg.medusa_num_heads} --medusa_num_layers {cfg.medusa_num_layers}" if cfg.mode == "medusa" else \
            f"--eagle_num_layers {cfg.eagle_num_layers}"
        raise TrainConfigError(f"{what}: training them needs about {need / 2**30:.1f} GiB ({TRAINING_BYTES_PER_PARAMETER} bytes per trainable "
                               f"parameter: weight, gradient, AdamW moments), more than this machine's {have / 2**30:.1f} GiB. Use fewer heads or "
                               "layers.")


def _tokenizer(model_dir: Path):
    if not (model_dir / "tokenizer.json").is_file():
        return None
    from ..formats.tokenizer import Tokenizer

    return Tokenizer(model_dir)


def _split(seqs: list[Sequence], fraction: float, seed: int) -> tuple[list[Sequence], list[Sequence]]:
    n_eval = int(len(seqs) * fraction)
    if n_eval == 0:
        return seqs, []
    if n_eval >= len(seqs):
        raise TrainConfigError(f"--eval_fraction {fraction} leaves no training sequence of {len(seqs)}.")
    order = torch.randperm(len(seqs), generator=torch.Generator().manual_seed(seed)).tolist()
    held = set(order[:n_eval])
    return [s for i, s in enumerate(seqs) if i not in held], [s for i, s in enumerate(seqs) if i in held]


def _provenance(cfg: TrainConfig, model_dir: Path, data_path: Path, n_seqs: int, run: Run) -> dict:
    return {
        "mode": cfg.mode,
        "base_model": str(model_dir.resolve()),
        "base_model_sha256": weights_sha256(model_dir),
        "data": str(data_path.resolve()),
        "data_bytes": data_path.stat().st_size,
        "data_sequences": n_seqs,
        **run.provenance(),
    }


def _tail_mean(losses: list[float], n: int = 10) -> float:
    tail = losses[-n:]
    return sum(tail) / len(tail) if tail else float("nan")


def _bar(total: int | None, start: int, enabled: bool):
    if not enabled:
        return None
    from tqdm import tqdm

    return tqdm(total=total, initial=start, desc="train", unit="step", dynamic_ncols=True)


def _write_final(out: Path, run: Run, config: dict, cfg: TrainConfig, losses: list[float], accuracy: list[float],
                 before: list[float] | None, times: tuple[float, float], steps: int, provenance: dict, held_out: bool,
                 before_missing: str = "") -> None:
    """Heads, log, loss curve and model card, each file complete or absent (staged, then renamed into ``out``).
    before_missing: why ``before`` is None (on --resume: the checkpoint lacks it, or measured it on another evaluation set)."""
    from .report import loss_curve_png, model_card

    out.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".final.", dir=out))
    try:
        save_heads(run.heads, config, tmp)
        seconds, cpu_seconds = times
        log = {"steps": steps, "losses": losses, "accuracy": accuracy, "accuracy_before": before,
               **({"accuracy_before_missing": before_missing} if before is None else {}), "held_out": held_out,
               "seconds": seconds, "cpu_seconds": cpu_seconds, "config": asdict(cfg), "provenance": provenance}
        (tmp / "training_log.json").write_text(json.dumps(log, indent=1) + "\n")
        plotted = loss_curve_png(losses, tmp / "loss_curve.png", f"{cfg.mode} training loss: {run.loss_description()}")
        (tmp / "README.md").write_text(model_card(cfg, run.card(), provenance, losses, accuracy, before, times, steps, held_out, plotted,
                                                     before_missing))
        publish(tmp)
        for f in tmp.iterdir():
            os.replace(f, out / f.name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
