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


REFINING = ROOT / "examples/demo-pair/heads/peagle-refine"  # the shipped module trained to read its drafts (--peagle_refine)


def test_refining_k_minus_1_times_drafts_what_one_call_per_token_drafts(tmp_path):
    """--refine: each call after the first reads the previous call's drafts, so call m + 1 fixes position m + 1 and
    k - 1 of them draft what the module drafts reading its own drafts one position at a time (a reference built
    position by position here); no refining is the blind block."""
    import torch

    from specdec.train.base import load_base, run_base
    from specdec.train.peagle import parallel_layout
    from specdec.train.runs import collate

    base_dir = str(ROOT / "examples/demo-pair/target")
    base = load_base(base_dir)
    run = replay.load_module(REFINING, base_dir, base)
    run.heads.eval()
    assert run.heads.refines
    seq = replay.bench_answers(base, base_dir, 1, 24, 24)[0]
    k = 4
    blind, ids = replay.blocks(run, base, seq, k)
    refined, _ = replay.blocks(run, base, seq, k, refine=k - 1)
    assert refined.keys() == blind.keys() and len(refined) > 10
    with torch.no_grad():  # the reference: position d + 1 read from row (p, d) after positions 1..d are drafted
        t, attn, loss_mask = collate([seq])
        out = run_base(base, t, attn, run.aux_ids)
        aux, next_embeds = out.aux_hidden[:, :-1], base.get_input_embeddings()(t[:, 1:])
        layout = parallel_layout(attn[:, :-1], loss_mask, k, 1.0, 1.0, None)
        layout.reads = layout.used
        slots = {(int(a), int(d)): j for j, (a, d, u) in enumerate(zip(layout.anchors[0], layout.depths[0], layout.used[0], strict=True)) if u}
        real = aux.shape[1]
        drafts = {p: [blind[p][0][0][0]] for p in refined}  # position 1: the real row's guess, the same blind or not
        for d in range(1, k):
            read = torch.zeros(1, layout.used.shape[1], dtype=torch.long)
            for p in drafts:
                for e in range(1, d + 1):
                    read[0, slots[p, e]] = drafts[p][e - 1]
            logits = run.heads.lm_head(run.heads.parallel_hidden(aux, next_embeds, layout, read_embeds=base.get_input_embeddings()(read)))[0]
            for p in drafts:
                drafts[p].append(int(logits[real + slots[p, d]].argmax()))
    assert {p: [c[0] for c in b[0]] for p, b in refined.items()} == drafts
    changed = sum(refined[p][0] != blind[p][0] for p in refined)
    assert changed > 0  # reading the drafts changes some blocks (else the reference proves nothing)


def test_refine_needs_a_module_trained_to_read_drafts(tmp_path):
    args = [sys.executable, str(ROOT / "benchmarks" / "peagle_replay.py"), "--base", str(ROOT / "examples/demo-pair/target"),
            "--bench_prompts", "1", "--prompt_tokens", "24", "--max_new_tokens", "24", "--k", "3", "--refine", "1"]
    refused = subprocess.run([*args, "--heads", str(ROOT / "examples/demo-pair/heads/peagle")], capture_output=True, text=True, timeout=300)
    assert refused.returncode == 2 and "not trained to read drafts" in refused.stderr and "Traceback" not in refused.stderr
    out = subprocess.run([*args, "--heads", str(REFINING)], capture_output=True, text=True, timeout=300, check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1])["refine"] == 1
