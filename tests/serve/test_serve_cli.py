"""specdec-serve as a user starts it: a process, flags in TensorRT-LLM's spelling, one-line errors."""

import os
import re
import subprocess
import sys
import time

import httpx
from click.testing import CliRunner
from servers import engines

from specdec.cli.serve import main


def test_specdec_serve_starts_answers_and_stops():
    e = engines()
    cmd = [sys.executable, "-m", "specdec.cli.serve", "--engine_dir", str(e["target"]), "--draft-engine-dir", str(e["draft"]),
           "--draft_target_model_config", "[2,[0],[0],False]", "--ngram_config", "[4,2,[0]]", "--port", "0", "--api_key", "k",
           "--served_model_name", "tiny", "--num_threads", "1", "--log_level", "info", "--preallocate_kv", "on"]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        deadline, line, lines = time.time() + 60, "", []
        while time.time() < deadline and "specdec-serve:" not in line:
            line = proc.stderr.readline()
            lines.append(line)
            assert line or proc.poll() is None, "the server exited during startup"
        assert "methods: none, draft, ngram; default draft, 2 drafts" in line
        # the target's, the pool's and the draft's caches were written while it loaded
        assert any("KV caches committed at load" in x for x in lines), lines
        url = re.search(r"http://127\.0\.0\.1:\d+", line).group(0)
        key = {"Authorization": "Bearer k"}
        assert httpx.get(f"{url}/health", timeout=10).status_code == 200
        r = httpx.post(f"{url}/v1/completions", headers=key, json={"model": "tiny", "prompt": "def f", "max_tokens": 5, "temperature": 0}, timeout=30)
        assert r.status_code == 200 and r.json()["speculative"]["num_draft_tokens"] == 2
        assert httpx.post(f"{url}/v1/completions", json={"prompt": "x"}, timeout=10).status_code == 401
    finally:
        proc.terminate()
        proc.wait(20)
    assert proc.returncode in (0, -15)


def test_bad_flags_are_one_line_errors(tmp_path):
    e = engines()
    cases = [
        (["--engine_dir", str(tmp_path / "missing")], "missing"),
        (["--engine_dir", str(e["target"]), "--draft_target_model_config", "[4,[0]"], "expected [draft_len"),
        (["--engine_dir", str(e["target"]), "--ngram_config", "[9,2,[0]]"], "max_draft_len=4"),
        (["--engine_dir", str(e["target"]), "--draft_target_model_config", "[2,[0],[0],False]"], "--draft_engine_dir"),
    ]
    for args, words in cases:
        res = CliRunner().invoke(main, [*args, "--port", "0"])
        assert res.exit_code == 1, res.output
        assert res.output.startswith("error: ") and words in res.output and res.output.count("\n") == 1, res.output
