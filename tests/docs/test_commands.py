"""Every command printed in README.md and docs/*.md runs as printed, in order.

Commands come from ```bash blocks (each command, backslash continuations and
heredocs included) and ```console blocks (the lines starting "$ "; the lines
after one, up to the next, are what it printed: an "error:" line there means
the command is documented to fail, and a following `echo $?` gives its exit
status; `$ cat FILE` of a file the page never writes creates it from what the page
shows). A ```python block runs as it is, unless the console block after it runs
it as `$ python name.py`: then it is saved under that name first. The pages run
in the order a reader meets them: the README, the specdec-build page (it builds
the tiny pair the reference pages use), then the site's nav (mkdocs.yml), in one
scratch directory that links the repository's examples/ and benchmarks/ and
holds demo-engines/ built as the quickstart builds them (the quickstart itself
runs in test_quickstart). Absolute /tmp/docs-* paths are the docs' own: they run
as printed.

Kept out, each with its reason: a block right after an HTML comment
"<!-- docs-test: skip (reason) -->", and the commands in SKIP below (files
this test's owner does not edit, and commands that are not ours to run).

To keep the suite short, a few sizes are capped (CAPS): the same commands,
fewer tokens; REWRITES leaves the Hugging Face peers out for the same reason.
The release check runs them exactly as printed, in a fresh clone after the
quickstart:

    SPECDEC_DOCS_UNCAPPED=1 SPECDEC_DOCS_CWD=$PWD .venv/bin/python -m pytest -q tests/docs/test_commands.py
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
SETUP_PAGE = "docs/cli-build.md"  # builds the tiny pair (/tmp/docs-ckpt, /tmp/docs-engine, ...) the reference pages use


def _nav(items) -> list[str]:
    out: list[str] = []
    for item in items:
        value = next(iter(item.values())) if isinstance(item, dict) else item
        out += _nav(value) if isinstance(value, list) else [f"docs/{value}"]
    return out


DOCS = ["README.md", SETUP_PAGE, *[p for p in _nav(yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"]) if p != SETUP_PAGE]]

# (file, command prefix) -> why it is not run here
SKIP = {
    ("README.md", "python3 -m venv .venv"): "installs: .ci/run runs the test command from a fresh clone; test_quickstart runs the quickstart",
    ("docs/tensorrt.md", ""): "needs an NVIDIA GPU and TensorRT (the gpu-marked tests cover what runs there)",
    ("docs/serving.md", "pip install"): "installs: the dev extra, which the suite runs in, holds serve",
    ("docs/coming-from-tensorrt-llm.md", "python3 examples/"): "TensorRT-LLM's own commands, shown for the mapping",
    ("docs/coming-from-tensorrt-llm.md", "trtllm-"): "TensorRT-LLM's own commands, shown for the mapping",
    ("docs/coming-from-tensorrt-llm.md", "python benchmarks/cpp/"): "TensorRT-LLM's own commands, shown for the mapping",
    ("docs/serving-operations.md",
     "python benchmarks/bench_serving.py --target"): "a load test of several minutes (its figures are on the benchmarks page)",
}
# file -> (line, why): commands from that line on are not run
SKIP_FROM: dict[str, tuple[int, str]] = {}  # doc -> (first line left out, why)
# flag -> the most the suite asks for
CAPS = {"--max_output_len": 16, "--num_requests": 4, "--output_mean": 16, "--input_mean": 32}
# Hugging Face peers load torch models for a minute or more: the suite leaves them out here (tests/cli/test_bench_eval.py
# runs them). onnxruntime-genai stays in --compare, and is skipped with its note, as for a new user without it.
REWRITES = [(re.compile(r"--compare\b(?!_)"), "--compare --compare_peers ortgenai"), (re.compile(r"^specdec-eval\b"), "specdec-eval --no_test_hf")]


@dataclass
class Command:
    line: int
    text: str
    expect: int | None  # exit status; None: any non-zero (an "error:" was printed)
    lang: str
    printed: tuple[str, ...] = ()  # what a console block shows it printed


def extract(path: Path) -> list[Command]:
    lines = path.read_text().splitlines()
    out: list[Command] = []
    i, skip_next = 0, False
    while i < len(lines):
        line = lines[i]
        if re.match(r"\s*<!-- docs-test: skip \(.+\) -->", line):
            skip_next = True
        m = re.match(r"^```(\w*)\s*$", line)
        if not m:
            i += 1
            continue
        lang, start = m.group(1), i + 1
        end = next(j for j in range(start, len(lines)) if lines[j].startswith("```"))
        body = lines[start:end]
        if not skip_next:
            if lang == "bash":
                out += _bash(body, start + 1)
            elif lang == "console":
                out += _console(body, start + 1)
            elif lang == "python":  # run as it is, or saved for a `python name.py` that follows (below)
                out.append(Command(start + 1, "\n".join(body), 0, "snippet"))
        skip_next = False
        i = end + 1
    for n, cmd in enumerate(out):  # a snippet no `$ python name.py` runs next is run as it is
        after = out[n + 1] if n + 1 < len(out) else None
        if cmd.lang == "snippet" and not (after and re.match(r"python3? \w+\.py\b", after.text)):
            cmd.lang = "python"
    return out


def _bash(body: list[str], first: int) -> list[Command]:
    cmds, buf, at, heredoc = [], [], 0, None
    for n, line in enumerate(body):
        if not buf:
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            at = first + n
        buf.append(line)
        if heredoc is None and (m := re.search(r"<<-?\s*'?(\w+)'?", line)):
            heredoc = m.group(1)
            continue
        if heredoc is not None:
            if line.strip() != heredoc:
                continue
            heredoc = None
        elif line.endswith("\\"):
            continue
        cmds.append(Command(at, "\n".join(buf), 0, "bash"))
        buf = []
    return cmds


def _console(body: list[str], first: int) -> list[Command]:
    cmds: list[Command] = []
    n = 0
    while n < len(body):
        if not body[n].startswith("$ "):
            n += 1
            continue
        at, text = first + n, [body[n][2:]]
        loop = re.match(r"(for|while) ", text[0]) and not re.search(r"\bdone\b", text[0])
        while (text[-1].endswith("\\") or loop) and n + 1 < len(body):  # continuations, and a loop's body up to its `done`
            n += 1
            text.append(body[n])
            loop = loop and body[n].strip() != "done"
        n += 1
        printed = []
        while n < len(body) and not body[n].startswith("$ "):
            printed.append(body[n])
            n += 1
        command = "\n".join(text)
        if command.strip() == "echo $?":
            if cmds and printed and printed[0].strip().isdigit():
                cmds[-1].expect = int(printed[0].strip())
            continue
        failed = any(p.startswith(("error:", "Error:")) for p in printed)
        cmds.append(Command(at, command, None if failed else 0, "bash", tuple(printed)))
    return cmds


UNCAPPED = os.environ.get("SPECDEC_DOCS_UNCAPPED") == "1"  # the release check: every command exactly as printed


def capped(text: str) -> str:
    if UNCAPPED:
        return text

    def cap(m: re.Match) -> str:
        flag, value = m.group(1), int(m.group(2))
        return f"{flag} {min(value, CAPS[flag])}"

    if not text.startswith("specdec-eval"):  # an accuracy check scores against references of a given length: its sizes stay
        text = re.sub(r"(" + "|".join(map(re.escape, CAPS)) + r")[ =](\d+)\b", cap, text)
    for pattern, replacement in REWRITES:
        text = pattern.sub(replacement, text)
    return text


def skip_reason(doc: str, cmd: Command) -> str | None:
    if doc in SKIP_FROM and cmd.line >= SKIP_FROM[doc][0]:
        return SKIP_FROM[doc][1]
    for (file, prefix), why in SKIP.items():
        if file == doc and cmd.text.lstrip().startswith(prefix):
            return why
    return None


@pytest.fixture(scope="module")
def scratch(tmp_path_factory) -> Path:
    """A working directory like a fresh clone's after the quickstart: examples/, benchmarks/, demo-engines/.

    SPECDEC_DOCS_CWD=DIR runs in DIR instead, as it is (a fresh clone after the quickstart)."""
    if os.environ.get("SPECDEC_DOCS_CWD"):
        return Path(os.environ["SPECDEC_DOCS_CWD"])
    d = tmp_path_factory.mktemp("docs-commands")
    for name in ("examples", "benchmarks"):
        (d / name).symlink_to(ROOT / name)
    env = _env()
    eagle = ["--speculative_decoding_mode", "eagle", "--eagle_dir", "examples/demo-pair/heads/eagle", "--max_draft_len", "8"]
    for name, source, extra in (("target", "target", ["--speculative_decoding_mode", "draft_tokens_external", "--max_draft_len", "8"]),
                                ("draft", "draft", []), ("eagle", "target", eagle)):  # examples/quickstart.sh's three
        subprocess.run([str(BIN / "specdec-build"), "--checkpoint_dir", f"examples/demo-pair/{source}", "--output_dir", f"demo-engines/{name}",
                        "--max_seq_len", "1024", "--max_batch_size", "4", *extra], cwd=d, env=env, check=True, capture_output=True)
    return d


def _env() -> dict[str, str]:
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", "PYTHONWARNINGS": "ignore"}
    env.pop("SPECDEC_PEERS_PYTHON", None)  # as a new user has it: onnxruntime-genai absent, skipped with a note
    return env


def test_extract_reads_bash_console_and_heredocs(tmp_path):
    md = tmp_path / "x.md"
    md.write_text(
        "```bash\n# a comment\nspecdec-run --engine_dir e \\\n    --max_output_len 64\npython - <<'EOF'\nprint(1)\nEOF\n```\n"
        "```console\n$ specdec-run --bad\nerror: bad\n$ echo $?\n2\n$ ls\nfile\n```\n"
        "<!-- docs-test: skip (an example) -->\n```bash\nnot run\n```\n"
    )
    cmds = extract(md)
    assert [c.text for c in cmds] == ["specdec-run --engine_dir e \\\n    --max_output_len 64", "python - <<'EOF'\nprint(1)\nEOF",
                                      "specdec-run --bad", "ls"]
    assert [c.expect for c in cmds] == [0, 0, 2, 0]
    if not UNCAPPED:
        assert capped(cmds[0].text).endswith("--max_output_len 16")


SERVER = "specdec-serve "  # a command that runs until stopped: started in the background, stopped before the next one


def _start_server(text: str, cwd: Path) -> subprocess.Popen:
    """Start a documented server and wait until it is ready (GET /health answers 200: the port answers 503 "loading" before), up to a minute."""
    log = open(cwd / "server.log", "w")  # a file, not a pipe: a full pipe would stall the server
    proc = subprocess.Popen(["bash", "-c", "exec " + text], cwd=cwd, env=_env(), stdout=log, stderr=subprocess.STDOUT, text=True)
    log.close()
    m = re.search(r"--port[ =](\d+)", text)
    port = int(m.group(1)) if m else 8000
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    return proc
        except OSError:  # not listening yet, or 503 while the engines load (HTTPError is an OSError)
            time.sleep(0.5)
    _stop(proc)
    raise AssertionError(f"{text} did not start listening on port {port}:\n{(cwd / 'server.log').read_text()[-1500:]}")


def _stop(proc: subprocess.Popen | None) -> None:
    if proc is not None and proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.mark.slow
@pytest.mark.parametrize("doc", DOCS)
def test_documented_commands_run_as_printed(doc, scratch):
    cmds = extract(ROOT / doc)
    failures: list[str] = []
    server = None
    snippet = None
    try:
        for cmd in cmds:
            if cmd.lang == "snippet":
                snippet = cmd.text
                continue
            if skip_reason(doc, cmd):
                continue
            if (m := re.match(r"python3? (\w+\.py)\b", cmd.text)) and snippet is not None and not (scratch / m.group(1)).exists():
                (scratch / m.group(1)).write_text(snippet)  # the reader saves the snippet above under the name the page runs
            if (m := re.fullmatch(r"cat (\S+)", cmd.text)) and cmd.printed and not (scratch / m.group(1)).exists():
                (scratch / m.group(1)).write_text("\n".join(cmd.printed) + "\n")  # a file the page shows the reader has
            if cmd.text.startswith(SERVER):
                _stop(server)
                server = _start_server(cmd.text, scratch)
                continue
            _run(doc, cmd, scratch, failures)
    finally:
        _stop(server)
    assert not failures, "\n\n".join(failures)


def _run(doc: str, cmd: Command, scratch: Path, failures: list[str]) -> None:
    if cmd.lang == "python":
        args = [sys.executable, "-c", cmd.text]
    else:
        args = ["bash", "-c", "set -o pipefail; " + capped(cmd.text) if "| head" not in cmd.text else capped(cmd.text)]
    r = subprocess.run(args, cwd=scratch, env=_env(), capture_output=True, text=True, timeout=600)
    ok = r.returncode != 0 if cmd.expect is None else r.returncode == cmd.expect
    if not ok and cmd.expect == 0 and re.search(r"^error: --output_dir \S+ exists and is not empty; pass --force", r.stderr, re.M):
        ok = True  # an engine a page builds in /tmp, left by an earlier run of this test: as printed, it builds once
    if not ok:
        failures.append(f"{doc}:{cmd.line}: exit {r.returncode} (expected {'non-zero' if cmd.expect is None else cmd.expect})\n"
                        f"$ {cmd.text}\n{(r.stdout + r.stderr)[-1500:]}")
    if "Traceback (most recent call last)" in r.stderr and cmd.lang != "python":
        failures.append(f"{doc}:{cmd.line}: a traceback\n$ {cmd.text}\n{r.stderr[-1500:]}")
