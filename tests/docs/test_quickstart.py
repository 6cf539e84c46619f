"""The README's quickstart runs end to end: both pairs, draft-target, n-gram and EAGLE, outputs identical to target-only."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_quickstart_runs_and_shows_both_pairs(tmp_path):
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
           "SPECDEC_DEMO_OUT": str(tmp_path / "engines"), "SPECDEC_DEMO_REPEAT": "1"}  # one timing per method: the suite checks it runs
    r = subprocess.run(["bash", str(ROOT / "examples" / "quickstart.sh")], env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    assert r.stdout.count("outputs identical to target-only: yes") == 6, r.stdout[-3000:]
    assert "Traceback" not in r.stderr and "\r" not in r.stdout + r.stderr
    table = r.stdout[r.stdout.rindex("Speedup over target-only"):]
    for pair in (r"demo pair \(5\.8M target\)", r"enlarged pair \(131M target\)"):  # three speedups per pair: draft-target, n-gram, EAGLE
        assert re.search(pair + r"(\s+\d+\.\d\dx \(\d+\.\d\d-\d+\.\d\d\)){3}", table), table
    assert "outputs differ" not in table
