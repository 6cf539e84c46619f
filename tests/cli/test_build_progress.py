"""specdec-build's progress where stderr is not a terminal (a log, CI, a pipe): plain lines, none for a short build."""

import subprocess
import sys
from pathlib import Path

from specdec.cli.build import _LogProgress

DEMO = Path(__file__).resolve().parents[2] / "examples" / "demo-pair"


def test_a_long_build_says_where_it_is_and_a_short_one_says_nothing(capsys):
    quiet = _LogProgress("building e")  # the first line comes after 5 s: a build of a second prints none
    quiet("layer 0", 1, 10)
    assert capsys.readouterr().err == ""
    now = _LogProgress("building e", after=0.0, every=3600.0)
    now("layer 3", 4, 10)
    now("layer 4", 5, 10)  # within `every` of the last line: nothing more
    err = capsys.readouterr().err
    assert err.startswith("building e: layer 3 (4/10 steps, ") and err.count("\n") == 1 and "\r" not in err


def test_python_m_specdec_cli_build_runs(tmp_path):
    """gpu_session.sh and bench_gpu.py build with `python -m specdec.cli.build`: the module runs as a script too."""
    r = subprocess.run([sys.executable, "-m", "specdec.cli.build", "--checkpoint_dir", str(DEMO / "draft"), "--output_dir", str(tmp_path / "e"),
                        "--max_seq_len", "64"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "built " in r.stdout and "\r" not in r.stdout + r.stderr
