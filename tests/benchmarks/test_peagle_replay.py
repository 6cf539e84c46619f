"""benchmarks/peagle_replay.py: greedy acceptance of a P-EAGLE module's chains and trees replayed from its training
pass, and the best-first tree (EAGLE-2's dynamic tree for a block whose positions are blind to each other)."""

from __future__ import annotations

import importlib.util
import itertools
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("peagle_replay", ROOT / "benchmarks" / "peagle_replay.py")
replay = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(replay)


def all_paths(positions: int, candidates: int) -> list[tuple[int, ...]]:
    return [p for d in range(1, positions + 1) for p in itertools.product(range(candidates), repeat=d)]


def test_best_first_takes_the_paths_of_highest_probability_product_as_a_tree():
    probs = [[0.5, 0.3, 0.2], [0.9, 0.06, 0.04], [0.45, 0.35, 0.2]]  # per position, descending
    value = {p: float(np.prod([probs[d][r] for d, r in enumerate(p)])) for p in all_paths(3, 3)}
    for nodes in (1, 4, 7, 12):
        taken = replay.best_first(probs, nodes)
        assert len(taken) == len(set(taken)) == nodes
        assert all(p[:-1] in taken[: taken.index(p)] for p in taken if len(p) > 1)  # a prefix comes before its path
        # no path left out is worth more than one taken (the reference: every path, sorted by value)
        assert min(value[p] for p in taken) >= max(value[p] for p in value if p not in taken)
    assert replay.best_first(probs, 5) == [(0,), (0, 0), (1,), (1, 0), (0, 0, 0)]  # 0.5, 0.45, 0.3, 0.27, 0.2025 (then (2,): 0.2)


def test_a_tree_accepts_its_longest_path_that_matches_the_truth():
    cands = [[7, 8], [5, 6], [3, 4]]  # per position: its candidates by rank
    assert replay.accepted([(0,), (0, 0), (0, 0, 0)], cands, [7, 5, 3]) == 3
    assert replay.accepted([(0,), (0, 0), (0, 0, 0)], cands, [7, 6, 3]) == 1  # the chain stops at the miss
    assert replay.accepted([(0,), (0, 0), (0, 1), (0, 1, 0)], cands, [7, 6, 3]) == 3  # the second candidate's branch
    assert replay.accepted([(1,), (0,)], cands, [9, 5, 3]) == 0


def test_the_replay_of_a_chain_as_a_tree_is_the_chain_and_best_first_runs_beside_it():
    """On the shipped demo module: a tree that is the chain replays as the chain does, round for round."""
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "peagle_replay.py"), "--heads", str(ROOT / "examples/demo-pair/heads/peagle"),
                          "--base", str(ROOT / "examples/demo-pair/target"), "--bench_prompts", "1", "--prompt_tokens", "24",
                          "--max_new_tokens", "24", "--k", "3", "--choices", "[[0],[0,0],[0,0,0]]", "--best_first"],
                         capture_output=True, text=True, timeout=300, check=True)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    chain_as_tree = result["trees"]["tree [[0],[0,0],[0,0,0]]"]
    assert (chain_as_tree["rounds"], chain_as_tree["acceptance_length"]) == (result["rounds"], result["acceptance_length"])
    assert result["acceptance_length"] > 1.2  # the shipped module drafts: not a replay that accepts nothing
    assert 1.0 <= result["trees"]["best-first, 3 nodes"]["acceptance_length"] <= 4.0


def test_a_module_trained_on_the_true_tokens_is_replayed_so_and_may_not_choose_trees(tmp_path):
    """The bound's config.json says it reads the true tokens (train_heads.py --peagle-truth-tokens): the replay reads it
    so, and refuses --best_first, whose trees its probabilities (conditioned on the truth) would choose."""
    heads = tmp_path / "bound"
    shutil.copytree(ROOT / "examples/demo-pair/heads/peagle", heads)
    cfg = json.loads((heads / "config.json").read_text())
    cfg["specdec_train"]["peagle_truth_tokens"] = True
    (heads / "config.json").write_text(json.dumps(cfg))
    args = [sys.executable, str(ROOT / "benchmarks" / "peagle_replay.py"), "--heads", str(heads), "--base", str(ROOT / "examples/demo-pair/target"),
            "--bench_prompts", "1", "--prompt_tokens", "24", "--max_new_tokens", "24", "--k", "3"]
    refused = subprocess.run([*args, "--choices", "[[0],[1]]", "--best_first"], capture_output=True, text=True, timeout=300)
    assert refused.returncode == 2 and "reads the true tokens" in refused.stderr and "Traceback" not in refused.stderr
    out = subprocess.run(args, capture_output=True, text=True, timeout=300, check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1])["truth_tokens"] is True
