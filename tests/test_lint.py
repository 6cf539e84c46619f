"""The tree passes ruff with pyproject.toml's configuration ([tool.ruff]), so CI's test command checks lint too."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(not (ROOT / "pyproject.toml").is_file(), reason="the tests run without the source tree beside them: nothing to lint")
def test_ruff_reports_nothing():
    # --no-cache: the check writes nothing into the tree
    r = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "--output-format", "concise", "."],
                       cwd=ROOT, capture_output=True, text=True)
    assert "No module named ruff" not in r.stderr, "ruff is not installed: pip install '.[dev]' (the dev extra pins it)"
    assert r.returncode == 0, f"ruff check . reported (fix them, `python -m ruff check --fix .` for the safe ones):\n{r.stdout}{r.stderr}"
