"""Build a small (prompt, reference) eval set for specdec-eval from held-out Python code.

Each example is one function of a source file: the prompt is its signature and
docstring (or, without a docstring, its signature and first statement), the
reference is the rest of its body. Functions are taken round-robin over the
files, in file order and then source order, so the output is deterministic
for a given Python standard library.

The sources are the demo pair's held-out files (examples/demo-pair/heldout_files.txt,
written by examples/train_demo_pair.py: standard-library paths the demo models
never trained on) when that list exists, else a fixed list of stdlib modules.

    python examples/eval/make_eval_set.py                      # -> examples/eval/heldout_functions.jsonl
    python examples/eval/make_eval_set.py --num_examples 64 textwrap.py shlex.py -o my_eval.jsonl
    specdec-eval --engine_dir engines/target --dataset examples/eval/heldout_functions.jsonl
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
import sysconfig
import textwrap
from pathlib import Path

HERE = Path(__file__).resolve().parent
HELDOUT_LIST = HERE.parent / "demo-pair" / "heldout_files.txt"
DEFAULT_OUTPUT = HERE / "heldout_functions.jsonl"
# Used when there is no held-out list: common modules, stable across Python versions.
FALLBACK_SOURCES = ("textwrap.py", "shlex.py", "fnmatch.py", "glob.py", "bisect.py", "heapq.py", "base64.py", "csv.py", "calendar.py", "difflib.py")


def split_function(lines: list[str], node: ast.FunctionDef | ast.AsyncFunctionDef, max_lines: int) -> tuple[str, str] | None:
    """(prompt, reference) of one function, or None when it does not make a good example."""
    body = node.body
    first = body[0]  # the docstring, when there is one
    if first.lineno == node.lineno or len(body) < 2:
        return None  # one-liners and single-statement bodies leave nothing to complete
    start = min([node.lineno] + [d.lineno for d in node.decorator_list]) - 1
    split = first.end_lineno  # after the docstring, or after the first statement
    end = node.end_lineno
    if end - split < 2 or end - start > max_lines:
        return None
    text = textwrap.dedent("".join(lines[start:end]))
    out = text.splitlines(keepends=True)
    prompt = "".join(out[: split - start])
    reference = "".join(out[split - start :]).rstrip("\n")
    while reference.startswith(("\n", "\r\n")):  # blank lines after the split belong to the prompt
        cut = reference.index("\n") + 1
        prompt, reference = prompt + reference[:cut], reference[cut:]
    if not reference.strip() or sum(1 for x in reference.splitlines() if x.strip()) < 2:
        return None
    return prompt, reference


def functions_of(path: Path, max_lines: int) -> list[dict]:
    source = path.read_bytes().decode("utf-8", errors="replace")
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    lines = source.splitlines(keepends=True)
    found = []
    nodes = sorted((n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))), key=lambda n: n.lineno)
    for node in nodes:
        pair = split_function(lines, node, max_lines)
        if pair:
            found.append({"prompt": pair[0], "reference": pair[1], "function": node.name, "line": node.lineno})
    return found


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="*",
                    help=f"source files, relative to --stdlib_dir or absolute [default: {HELDOUT_LIST.name} if it exists, else a fixed list]")
    ap.add_argument("--stdlib_dir", default=sysconfig.get_paths()["stdlib"],
                    help="where relative paths are looked up [default: this Python's stdlib]")
    ap.add_argument("--num_examples", type=int, default=32)
    ap.add_argument("--max_lines", type=int, default=40, help="skip functions longer than this")
    ap.add_argument("-o", "--output", default=str(DEFAULT_OUTPUT))
    args = ap.parse_args()

    if args.files:
        names, origin = args.files, "the command line"
    elif HELDOUT_LIST.is_file():
        names = [x.strip() for x in HELDOUT_LIST.read_text().splitlines() if x.strip() and not x.startswith("#")]
        origin = str(HELDOUT_LIST.relative_to(HERE.parent.parent))
    else:
        names, origin = list(FALLBACK_SOURCES), "the fixed fallback list (no heldout_files.txt)"
    stdlib = Path(args.stdlib_dir)
    per_file: list[tuple[str, list[dict]]] = []
    for name in names:
        path = Path(name) if Path(name).is_absolute() else stdlib / name
        if not path.is_file():
            print(f"skipping {name}: not found under {stdlib} (this Python version may not ship it)", file=sys.stderr)
            continue
        per_file.append((name, functions_of(path, args.max_lines)))

    examples: list[dict] = []
    depth = 0
    while len(examples) < args.num_examples and any(depth < len(fns) for _, fns in per_file):
        for name, fns in per_file:
            if depth < len(fns) and len(examples) < args.num_examples:
                f = fns[depth]
                examples.append({"prompt": f["prompt"], "reference": f["reference"], "source": f"{name}:{f['line']}", "function": f["function"]})
        depth += 1
    if not examples:
        sys.exit("no functions found: check the file list and --stdlib_dir")
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(json.dumps(e, ensure_ascii=False) + "\n" for e in examples), encoding="utf-8")
    used = sorted({e["source"].split(":")[0] for e in examples})
    print(f"wrote {len(examples)} examples from {len(used)} files (sources: {origin}; Python {sys.version.split()[0]}) to {out}")


if __name__ == "__main__":
    main()
