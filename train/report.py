"""What a training run leaves for people: a loss curve PNG and a short model card."""

from __future__ import annotations

import platform
import warnings
from pathlib import Path

import torch


def loss_curve_png(losses: list[float], path: Path, title: str) -> bool:
    """Raw per-step loss and its moving average; False (with a warning) where matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ModuleNotFoundError:
        warnings.warn("matplotlib is not installed (pip install 'specdec[train]'): no loss_curve.png written.", stacklevel=1)
        return False
    window = max(1, len(losses) // 50)
    smooth = [sum(losses[max(0, i - window + 1) : i + 1]) / len(losses[max(0, i - window + 1) : i + 1]) for i in range(len(losses))]
    fig, ax = plt.subplots(figsize=(6, 3.5), dpi=100)
    steps = range(1, len(losses) + 1)
    ax.plot(steps, losses, color="0.75", linewidth=0.8, label="per step")
    ax.plot(steps, smooth, color="C0", linewidth=1.5, label=f"mean of {window}")
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return True


def _fmt(values: list[float] | None) -> str:
    return ", ".join(f"{v:.3f}" for v in values) if values else "-"


def _length(cfg) -> str:
    """How long the run was asked to be: steps, a time budget, or epochs."""
    parts = [f"max_steps {cfg.max_steps}"] if cfg.max_steps else [f"epochs {cfg.num_epochs}"]
    if cfg.max_time:
        parts.append(f"max_time {cfg.max_time:g} s")
    if cfg.max_cpu_time:
        parts.append(f"max_cpu_time {cfg.max_cpu_time:g} CPU s")
    return ", ".join(parts)


def model_card(cfg, described: tuple[str, str, str], provenance: dict, losses: list[float], accuracy: list[float],
               before: list[float] | None, times: tuple[float, float], steps: int, held_out: bool, plotted: bool,
               before_missing: str = "not measured") -> str:
    """described: the run's (what was trained, what the accuracy figures are, the flags that shaped it): runs.Run.card.
    times: (wall seconds, CPU seconds of the process) over the run. before_missing: why ``before`` is None."""
    seconds, cpu_seconds = times
    what, acc_label, shape = described
    tail = losses[-10:]
    split = "held-out split" if held_out else "training data (no --eval_fraction)"
    lines = [
        f"# {cfg.mode} heads (specdec-train)",
        "",
        f"{what}. Trained with the base model frozen. Layout: NVIDIA ModelOpt's export format "
        "(docs/train-heads.md); read it with `specdec.train.load_heads`.",
        "",
        "| | |",
        "|---|---|",
        f"| base model | `{provenance['base_model']}` |",
        f"| base weights sha256 | `{provenance['base_model_sha256']}` |",
        f"| data | `{provenance['data']}` ({provenance['data_bytes']:,} bytes, {provenance['data_sequences']} sequences) |",
        f"| mode | {cfg.mode} ({shape}) |",
        f"| hyper-parameters | lr {cfg.lr:g} ({cfg.lr_scheduler}, warmup {cfg.warmup_steps}), AdamW, batch {cfg.batch_size}, "
        f"training_seq_len {cfg.training_seq_len}, {_length(cfg)}, seed {cfg.seed} |",
        f"| steps | {steps} |",
        f"| final loss (mean of last {len(tail)} steps) | {sum(tail) / max(1, len(tail)):.4f} |",
        f"| {acc_label}, {split} | {_fmt(accuracy)} |",
        f"| same, before training | {_fmt(before) if before is not None else f'not available: {before_missing}'} |",
        f"| time | {seconds:.0f} s ({cpu_seconds:.0f} CPU s) on {platform.machine()} CPU, {torch.get_num_threads()} thread(s), "
        f"torch {torch.__version__} |",
        "",
        "![loss](loss_curve.png)" if plotted else "(no loss curve: matplotlib is not installed)",
        "",
    ]
    return "\n".join(lines)
