"""benchmarks/prompts.py: the benchmark prompts, short (a function's start) and long (--file_context: its file before it)."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import prompts  # noqa: E402
from llama_cli import context_size  # noqa: E402

from specdec.formats.tokenizer import Tokenizer  # noqa: E402

DEMO = ROOT / "examples" / "demo-pair" / "target"


def test_short_prompts_are_a_functions_first_tokens():
    tok = Tokenizer(DEMO)
    fns = [fn for fn, _ in prompts._functions_in_files(2)[::3][:2]]
    got = prompts.code_prompts(DEMO, 2, 40)
    assert got == [tok.encode(fn)[:40] for fn in fns]
    assert prompts._functions(2) == [fn for fn, _ in prompts._functions_in_files(2)]


def test_file_context_prompts_reach_the_length_and_end_in_the_function():
    tok = Tokenizer(DEMO)
    (fn, before), *_ = prompts._functions_in_files(1)[::3][:1]
    assert before  # the function is not the file's first line
    n = min(600, len(tok.encode(before)) + 32)
    ordinary = prompts.code_prompts(DEMO, 1, n, file_context=True)[0]
    assert len(ordinary) == n and ordinary[-32:] == tok.encode(fn)[:32]
    copy = prompts.code_prompts(DEMO, 1, n, copy_heavy=True, file_context=True)[0]
    tail = tok.encode(f"{fn}\n\n\n# The same function again, unchanged:\n{fn.splitlines()[0]}\n")
    assert len(copy) <= n and copy[-20:] == tail[-20:]
    both, subsets = prompts.workloads(DEMO, 1, n, file_context=True)
    assert both == [ordinary, copy] and subsets == {"ordinary": [0], "copy-heavy": [1], "all": [0, 1]}


def test_llama_cpp_gets_room_for_a_long_prompt():
    assert context_size(100, 64) == 1024  # what the short-prompt figures ran with
    assert context_size(1500, 64) >= 1564
