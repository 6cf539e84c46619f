"""Charts of method against method, written beside a benchmark's JSON.

The scripts in benchmarks/ compare methods side by side in one run and write their figures as JSON; each also
writes this chart beside it (the same name, .png): one horizontal bar per method, its spread over rounds as an
error bar, and a line at the reference (1.0: target-only). matplotlib (the bench extra) is imported here, when a
chart is drawn; without it the JSON is still written and one note says no chart was.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Bar:
    """One method's figure: its median over rounds and, where there were several rounds, their range."""

    label: str
    value: float
    low: float | None = None
    high: float | None = None


def beside(json_path: str | Path) -> Path:
    """Where the chart of a benchmark's JSON goes: the same path with .png."""
    return Path(json_path).with_suffix(".png")


def spread_bar(label: str, spread: Mapping[str, float]) -> Bar:
    """A Bar from benchmarks/prompts.py's spread(): {"median", "min", "max"}."""
    return Bar(label, spread["median"], spread.get("min"), spread.get("max"))


def write_bars(path: str | Path, title: str, panels: Mapping[str, Sequence[Bar]], xlabel: str = "speed over target-only",
               reference: float | None = 1.0) -> Path | None:
    """Draw one panel of horizontal bars per entry of ``panels`` (its key is the panel's title) into ``path``.

    Returns the path, or None when matplotlib is not installed (a note on stderr says so)."""
    try:
        from matplotlib.figure import Figure  # the object API: no global pyplot state, no display needed
    except ImportError:
        print(f"note: no chart written ({path}): matplotlib is not installed (pip install 'specdec[bench]').", file=sys.stderr)
        return None
    panels = {name: list(bars) for name, bars in panels.items() if bars}
    if not panels:
        return None
    tallest = max(len(bars) for bars in panels.values())
    fig = Figure(figsize=(6.5 * len(panels), 1.2 + 0.38 * tallest), layout="constrained")
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    for ax, (name, bars) in zip(axes, panels.items(), strict=True):
        ys = range(len(bars))[::-1]  # the first bar on top, as in the printed table
        values = [b.value for b in bars]
        lo = [b.value - b.low if b.low is not None else 0.0 for b in bars]
        hi = [b.high - b.value if b.high is not None else 0.0 for b in bars]
        ax.barh(list(ys), values, xerr=[lo, hi], color="tab:blue", alpha=0.8, capsize=3)
        ax.set_yticks(list(ys), [b.label for b in bars], fontsize=8)
        for y, b in zip(ys, bars, strict=True):  # the median, right of its error bar
            ax.annotate(f"{b.value:.2f}", (b.high if b.high is not None else b.value, y), xytext=(4, -3), textcoords="offset points", fontsize=7)
        if reference is not None:
            ax.axvline(reference, color="gray", linestyle=":")
        ax.set(xlabel=xlabel, title=name)
        ax.grid(axis="x", alpha=0.3)
    fig.suptitle(title, fontsize=10)
    fig.savefig(path, dpi=100, format="png")
    return Path(path)
