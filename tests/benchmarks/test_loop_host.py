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
