"""The README's first screen is the real quickstart: its two set-up commands and its one main command are the ones the
docs' first pages print, the main command runs end to end (both pairs; draft-target, n-gram and EAGLE; outputs
identical to target-only), and what the README shows it printing has the shape of what it prints."""

import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SETUP = ["python3 -m venv .venv && source .venv/bin/activate", 'pip install ".[build]"']
MAIN = "bash examples/quickstart.sh"


def first_bash_block(page: str) -> list[str]:
    text = (ROOT / page).read_text()
    block = re.search(r"^```bash\n(.*?)^```", text, re.M | re.S)
    assert block, f"{page} has no bash block"
    return [line for line in block.group(1).splitlines() if line.strip()]


def shown_output(page: str) -> str:
    """The ```text block that follows the quickstart's command: what the page says it prints at the end."""
    text = (ROOT / page).read_text()
    block = re.search(r"^```text\n(.*?)^```", text, re.M | re.S)
    assert block, f"{page} shows no output"
    return block.group(1)


@pytest.mark.parametrize("page", ["README.md", "docs/index.md", "docs/quickstart.md"])
def test_the_first_commands_are_the_two_set_up_commands_and_the_quickstart(page):
    assert first_bash_block(page) == [*SETUP, MAIN]
    assert (ROOT / "examples" / "quickstart.sh").is_file()
    assert "build" in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]


@pytest.mark.slow
def test_quickstart_runs_and_prints_what_the_readme_shows(tmp_path):
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
           "SPECDEC_DEMO_OUT": str(tmp_path / "engines"), "SPECDEC_DEMO_REPEAT": "1"}  # one timing per method: the suite checks it runs
    r = subprocess.run(["bash", str(ROOT / "examples" / "quickstart.sh")], env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    assert r.stdout.count("outputs identical to target-only: yes") == 6, r.stdout[-3000:]
    assert "Traceback" not in r.stderr and "\r" not in r.stdout + r.stderr
    table = r.stdout[r.stdout.rindex("Speedup over target-only"):]
    row = r"(\s+\d+\.\d\dx \(\d+\.\d\d-\d+\.\d\d\)){3}"  # draft-target, n-gram, EAGLE: median (min-max)
    for pair in (r"demo pair \(5\.8M target\)", r"enlarged pair \(131M target\)"):
        assert re.search(pair + row, table), table
    assert "outputs differ" not in table
    for page in ("README.md", "docs/quickstart.md"):  # the pages show a real run's last lines: the same header and rows
        shown = shown_output(page)
        assert "Speedup over target-only" in shown and "draft-target" in shown and "EAGLE tree" in shown, page
        for pair in (r"demo pair \(5\.8M target\)", r"enlarged pair \(131M target\)"):
            assert re.search(pair + row, shown), f"{page} shows no {pair} row like the quickstart prints"
