"""The install commands the docs print take the CPU build of torch on a machine whose pip sees only the public index.

From PyPI alone, torch is the CUDA build on Linux x86-64 (several GB of NVIDIA
libraries, GPU or not). So every printed `pip install` that brings torch, by
name or through an extra that holds it (hf, train, dev), must come after a
`pip install torch==X --index-url https://download.pytorch.org/whl/cpu` in the
same command, and the README's test command must be what CI runs.
"""

from __future__ import annotations

import re
import shlex
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CPU_INDEX = "https://download.pytorch.org/whl/cpu"
PAGES = ["README.md", "benchmarks/README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md"))]
# pages whose installs are for a GPU host, where torch's CUDA build is the one to have
GPU_PAGES = {"docs/gpu.md", "docs/tensorrt.md"}
PIP_OPTIONS_WITH_VALUE = {"--index-url", "-i", "--extra-index-url", "-c", "--constraint", "-r", "--requirement", "--target", "-t", "-f",
                          "--find-links"}


def extras_with_torch() -> set[str]:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]

    def holds(name: str, seen: frozenset = frozenset()) -> bool:
        for req in extras[name]:
            if re.match(r"torch\b", req):
                return True
            own = re.match(r"specdec\[([\w,\- ]+)\]", req)
            if own and any(e.strip() not in seen and holds(e.strip(), seen | {name}) for e in own.group(1).split(",")):
                return True
        return False

    return {name for name in extras if holds(name)}


def shell_commands(page: str) -> list[str]:
    """Each line of the page's bash/console blocks (backslash continuations joined, console prompts removed), and
    each `inline code` span of its prose, that runs pip install."""
    out, block, pending = [], None, ""
    for line in (ROOT / page).read_text().splitlines():
        if line.startswith("```"):
            block = line[3:].strip() if block is None else None
            continue
        if block is None:
            out += re.findall(r"`([^`]*pip install[^`]*)`", line)
            continue
        if block in ("bash", "console", "sh"):
            text = line[2:] if block == "console" and line.startswith("$ ") else line if block != "console" else ""
            pending += text.rstrip("\\").rstrip() + " " if text.rstrip().endswith("\\") else text
            if not text.rstrip().endswith("\\"):
                out.append(pending)
                pending = ""
    return [c for c in out if "pip install" in c]


def pip_installs(command: str) -> list[list[str]]:
    """The argument lists of each `pip install` in a command chained with && or ;."""
    installs = []
    for part in re.split(r"&&|;", command.split(" #")[0]):
        words = shlex.split(part)
        for i, w in enumerate(words[:-1]):
            if w.endswith("pip") and words[i + 1] == "install":
                installs.append(words[i + 2 :])
    return installs


def requirements(args: list[str]) -> tuple[list[str], dict[str, str]]:
    reqs, opts, i = [], {}, 0
    while i < len(args):
        if args[i] in PIP_OPTIONS_WITH_VALUE:
            opts[args[i]] = args[i + 1]
            i += 2
            continue
        if not args[i].startswith("-"):
            reqs.append(args[i])
        i += 1
    return reqs, opts


def brings_torch(req: str, torch_extras: set[str]) -> bool:
    if re.match(r"torch\b", req):
        return True
    own = re.fullmatch(r"(?:specdec|\.)\[([\w,\- ]+)\]", req)
    return bool(own and {e.strip() for e in own.group(1).split(",")} & torch_extras)


def test_every_printed_install_takes_torch_from_the_cpu_index():
    torch_extras = extras_with_torch()
    assert {"hf", "train", "dev"} <= torch_extras
    checked, wrong = 0, []
    for page in PAGES:
        if page in GPU_PAGES:
            continue
        for command in shell_commands(page):
            cpu_torch = False
            for args in pip_installs(command):
                reqs, opts = requirements(args)
                if any(re.fullmatch(r"torch==[\d.]+", r) for r in reqs) and opts.get("--index-url", opts.get("-i")) == CPU_INDEX:
                    cpu_torch = True
                    checked += 1
                    continue
                if any(brings_torch(r, torch_extras) for r in reqs) and not cpu_torch:
                    wrong.append(f"{page}: {command.strip()}")
    assert not wrong, "installs that would take torch's CUDA build from PyPI:\n" + "\n".join(wrong)
    assert checked >= 2  # the README's test command and the training install at least


def test_the_readme_test_command_is_what_ci_runs():
    readme = [c for c in shell_commands("README.md") if "pytest" in c]
    ci = (ROOT / ".ci" / "run").read_text().strip().splitlines()[-1]
    assert readme == [ci]
    assert f"torch==2.13.0 --index-url {CPU_INDEX}" in ci


def test_floors_pin_every_direct_dependency_and_known_movers_have_ceilings():
    """.ci/floors installs what .ci/floors.py prints: every direct dependency of specdec[dev], at its floor's release."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, str(ROOT / ".ci" / "floors.py")], capture_output=True, text=True, check=True).stdout
    pins = dict(line.split("==") for line in out.split())
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = ("build", "hf", "bench", "serve", "train", "lmeval", "docs", "gguf", "tensorrt-dispatch", "tensorrt-lean", "tensorrt-rtx-build",
              "dev")
    direct = [r for r in project["dependencies"] + [r for e in extras for r in project["optional-dependencies"][e]] if not r.startswith("specdec[")]
    wanted: dict[str, tuple[tuple[int, ...], str]] = {}  # a package two extras name: the higher floor, which both allow
    for req in direct:
        name = re.match(r"[A-Za-z0-9_.\-]+", req).group(0).lower().replace("_", "-")
        exact, floor = re.search(r"==\s*([\d.]+)", req), re.search(r">=\s*([\d.]+)", req)
        version = exact.group(1) if exact else f"{floor.group(1)}.*"
        key = tuple(int(p) for p in re.findall(r"\d+", version))
        if name not in wanted or key > wanted[name][0]:
            wanted[name] = (key, version)
    for name, (_, version) in wanted.items():
        assert pins[name] == version, (name, pins.get(name))
    assert pins["transformers"] == "5.24.*"  # hf's floor is 5.3, gguf's 5.24
    optional = project["optional-dependencies"]
    ceilings = {re.match(r"[\w\-]+", r).group(0): r for r in project["dependencies"] + optional["hf"] + optional["gpu"]}
    for name in ("onnxruntime", "tokenizers", "transformers", "onnxruntime-gpu"):  # APIs specdec calls that moved between releases
        assert "<" in ceilings[name], ceilings[name]
