"""Benchmark prompts made from code every machine has: the Python standard library.

Ordinary prompts are the first lines of a function; copy-heavy prompts show a
whole function and ask for it again ("repeat / edit this code"), so most of the
answer is in the prompt, which is n-gram drafting's case.
"""

from __future__ import annotations

import ast
import statistics
import sysconfig
from pathlib import Path

from specdec.formats.tokenizer import Tokenizer

# Files outside the demo pair's training data would be best; these modules are
# common and stable across Python versions.
SOURCES = ("textwrap.py", "shlex.py", "fnmatch.py", "glob.py", "bisect.py", "heapq.py", "base64.py", "csv.py", "calendar.py", "difflib.py")


HELDOUT = Path(__file__).resolve().parent.parent / "examples" / "demo-pair" / "heldout_files.txt"


def _functions(limit: int) -> list[str]:
    """Functions of 8+ lines (their source), as _functions_in_files finds them."""
    return [fn for fn, _ in _functions_in_files(limit)]


def _functions_in_files(limit: int) -> list[tuple[str, str]]:
    """(the function's source, its file's source before it) of functions of 8+ lines, from the files the demo pair never
    trained on when that list exists."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    names = HELDOUT.read_text().split() if HELDOUT.is_file() else list(SOURCES)
    found = []
    for name in names:
        if not (stdlib / name).is_file():
            continue
        src = (stdlib / name).read_text()
        try:
            tree = ast.parse(src)
        except SyntaxError:
            continue
        lines = src.splitlines(keepends=True)
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and node.end_lineno - node.lineno >= 8:
                found.append((ast.get_source_segment(src, node), "".join(lines[: node.lineno - 1])))
        if len(found) >= limit * 3:
            break
    return found


def code_prompts(engine_dir: Path, n: int, tokens: int, copy_heavy: bool = False, file_context: bool = False) -> list[list[int]]:
    """n prompts of at most ``tokens`` tokens. ``file_context``: each prompt also holds the source file before the
    function, so that it reaches ``tokens`` (long-context decoding): its last ``tokens`` tokens."""
    tok = Tokenizer(engine_dir)
    out = []
    for fn, before in _functions_in_files(n)[::3][:n]:
        if copy_heavy:
            head = fn.splitlines()[0]
            text = f"{before if file_context else ''}{fn}\n\n\n# The same function again, unchanged:\n{head}\n"
            ids = tok.encode(text)[-(tokens if file_context else 4 * tokens):]
        elif file_context:  # the file up to the function, then the function's first 32 tokens: the model goes on with it
            ids = (tok.encode(before) + tok.encode(fn)[:32])[-tokens:]
        else:
            ids = tok.encode(fn)[:tokens]
        out.append(ids)
    return out


def workloads(engine_dir: Path, n: int, tokens: int, file_context: bool = False) -> tuple[list[list[int]], dict[str, list[int]]]:
    """``n`` ordinary and ``n`` copy-heavy prompts, and the indices of each kind ("ordinary", "copy-heavy", "all")."""
    ordinary = code_prompts(engine_dir, n, tokens, file_context=file_context)
    copy = code_prompts(engine_dir, n, tokens, copy_heavy=True, file_context=file_context)
    idx = list(range(len(ordinary) + len(copy)))
    return ordinary + copy, {"ordinary": idx[: len(ordinary)], "copy-heavy": idx[len(ordinary):], "all": idx}


def spread(values: list[float]) -> dict[str, float]:
    """Median and range of figures repeated over rounds."""
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}
