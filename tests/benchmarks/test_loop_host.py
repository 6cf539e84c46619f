"""benchmarks/loop_host.py: the loop's host time per request and round, with auto's costs pinned from a GPU run."""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import loop_host  # noqa: E402

H200 = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "torch-llama8b-h200.json"


def test_gpu_costs_interpolate_the_runs_steps_and_refuse_a_batch_it_did_not_time():
    price = loop_host.gpu_costs(H200, 16)
    steps = json.loads(H200.read_text())["steps"]["target"]["step_ms"]["16"]
    assert price(1) == pytest.approx(steps["1"]["median"] / 1e3) and price(9) == pytest.approx(steps["9"]["median"] / 1e3)
    assert steps["3"]["median"] / 1e3 < price(4) < steps["5"]["median"] / 1e3
    with pytest.raises(SystemExit, match="no target steps at batch 4"):
        loop_host.gpu_costs(H200, 4)


def test_it_measures_each_method_and_auto_drafts_nothing_at_the_gpus_batch_16_costs(tmp_path, monkeypatch):
    out = tmp_path / "loop.json"
    monkeypatch.setattr(sys, "argv", ["loop_host.py", "--work", str(tmp_path / "w"), "--batch", "16", "--repeats", "1",
                                      "--methods", "target-only,eagle-auto", "--gpu_costs", str(H200), "--json", str(out)])
    loop_host.main()
    res = json.loads(out.read_text())
    host = res["host_us_per_request_round"]
    assert set(host) == {"target-only", "eagle-auto"} and all(v["median"] > 0 for v in host.values())
    assert res["drafted"] == {"target-only": [0], "eagle-auto": [0]}  # at the H200's batch-16 costs no tree pays


def test_skip_compute_runs_each_call_shape_once_and_hands_back_copies():
    import numpy as np

    class Fake:
        def __init__(self):
            self.calls = 0

        def _run(self, cache, first, ids, positions, start, index, tree, extra):
            self.calls += 1
            return {"logits": np.full((*ids.shape, 3), self.calls, np.float32)}

    ex, cache = Fake(), object()
    loop_host.skip_compute(ex)
    step = lambda n, width: ex._run(cache, 0, np.zeros((n, width), np.int64), None, None, np.zeros((n, 1), np.int64), None, {})  # noqa: E731
    first = step(2, 1)
    again = step(2, 1)
    assert ex.calls == 1 and (again["logits"] == first["logits"]).all() and again["logits"] is not first["logits"]
    assert step(2, 3)["logits"].shape == (2, 3, 3) and ex.calls == 2  # a new call shape is computed once


def test_before_runs_every_method_on_a_second_tree_beside_this_one(tmp_path, monkeypatch):
    """--before: each method again on another source tree (here this checkout, imported under another name), in the same
    run; --warm_python on. A folder that is not a specdec tree is refused in one line."""
    root = Path(__file__).resolve().parents[2]
    out = tmp_path / "loop.json"
    argv = ["loop_host.py", "--work", str(tmp_path / "w"), "--batch", "4", "--repeats", "1", "--warm_python",
            "--methods", "target-only,peagle-chain-auto"]
    monkeypatch.setattr(sys, "argv", [*argv, "--before", str(tmp_path), "--json", str(out)])
    with pytest.raises(SystemExit, match="not a specdec source tree"):
        loop_host.main()
    monkeypatch.setattr(sys, "argv", [*argv, "--before", str(root), "--json", str(out)])
    loop_host.main()
    res = json.loads(out.read_text())
    assert set(res["host_us_per_request_round"]) == {"target-only", "target-only (before)", "peagle-chain-auto", "peagle-chain-auto (before)"}
    assert res["warm_python"] and res["before"] == str(root)
    over = res["over_target_only_us_per_request_round"]
    assert set(over) == {"peagle-chain-auto", "peagle-chain-auto (before)"}
    host = res["host_us_per_request_round"]
    assert over["peagle-chain-auto (before)"]["runs"] == [host["peagle-chain-auto (before)"]["runs"][0] - host["target-only (before)"]["runs"][0]]
    assert Path(sys.modules["specdec_before.runtime.round"].__file__).resolve() == root / "runtime" / "round.py"
