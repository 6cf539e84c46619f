"""What the fuzz tests share: seeded settings, strategies for values at the edges, and the property they check.

The property, for every input surface (docs/input-surfaces.md): a correct result, or one clean error
line (our SpecdecError hierarchy, or click's usage error) and a non-zero exit; never a traceback, never a
partial output file or directory, never a hang.

CI runs every fuzz test with a fixed budget and derandomized Hypothesis (the same examples every run).
SPECDEC_FUZZ_SCALE=10 multiplies every budget (the release check): ``SPECDEC_FUZZ_SCALE=10 pytest -m fuzz``.
A helper module, not a conftest.py (tests/conftest.py is imported by name; a second one would shadow it).
"""

from __future__ import annotations

import copy
import json
import os
import re
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from hypothesis import HealthCheck, settings, strategies as st

FUZZ_SCALE = int(os.environ.get("SPECDEC_FUZZ_SCALE", "1"))
HANG_SECONDS = 120  # far past any answer these inputs need; only a hang gets near it


def fuzz_settings(max_examples: int) -> settings:
    """``max_examples`` in CI (times SPECDEC_FUZZ_SCALE), the same examples on every run."""
    return settings(max_examples=max_examples * FUZZ_SCALE, derandomize=True, database=None, deadline=None, print_blob=False,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.filter_too_much])


class Hang(BaseException):
    """Raised into a call that ran past HANG_SECONDS. A BaseException: no ``except Exception`` (nor the CLIs'
    OSError handler: TimeoutError is an OSError) can swallow it."""


@contextmanager
def no_hang(seconds: float = HANG_SECONDS, what: object = "") -> Iterator[None]:
    """Fail (AssertionError, naming ``what``: Hypothesis then shrinks and reports the example) if the body runs
    past ``seconds``."""
    def fire(_signum, _frame):
        raise Hang(f"no answer within {seconds} s")

    previous = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    except Hang as hang:
        raise AssertionError(f"{hang}: {what}") from None
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


# ------------------------------------------------------------------------------------------- values

# Integers that break arithmetic downstream: C int / long / unsigned long boundaries, and past them.
EDGE_INTS = [0, 1, -1, 2, 255, 256, 2**15, 2**31 - 1, 2**31, 2**32, 2**53 + 1, 2**63 - 1, 2**63, 2**64, -(2**31), -(2**63) - 1, 10**30, 10**400]
# Floats that make a division, an exp or a softmax degenerate.
EDGE_FLOATS = [0.0, -0.0, 5e-324, 2.2250738585072014e-308, 1e-300, 1e-38, 1e-12, 9.99e-6, 1e-5, 1.0000001e-5, 1e-3, 0.5, 1.0, 1.0000001,
               2.0, 1e30, 3.4e38, 1e308, float("inf"), float("-inf"), float("nan")]


def edge_ints() -> st.SearchStrategy[int]:
    return st.one_of(st.sampled_from(EDGE_INTS), st.integers(-3, 300), st.integers())


def edge_floats() -> st.SearchStrategy[float]:
    return st.one_of(st.sampled_from(EDGE_FLOATS), st.floats(allow_nan=True, allow_infinity=True, allow_subnormal=True))


def any_text(max_size: int = 40) -> st.SearchStrategy[str]:
    """Any string Python can hold: lone surrogates (what a JSON "\\ud800" or a non-UTF-8 argv decodes to), controls, NULs."""
    return st.text(st.characters(codec=None, exclude_categories=()), max_size=max_size)


def number_text() -> st.SearchStrategy[str]:
    """What a user may type where a number is wanted: numbers at the edges, and near-numbers."""
    return st.one_of(edge_ints().map(str), edge_floats().map(repr), st.sampled_from(["nan", "inf", "-inf", "1e999", "0x10", "1_000", " 7 ", "",
                                                                                    "٣", "4.", ".5", "-0", "+3", "1e-400"]))


def mostly(values: st.SearchStrategy) -> st.SearchStrategy[str]:
    """A flag's value as typed: mostly one it takes (so a command goes on to meet its other flags), sometimes a
    number at the edges."""
    return st.one_of(*[values.map(str)] * 4, number_text())


def argv(flags: dict[str, object]) -> list[str]:
    """{"max_seq_len": 64} -> ["--max_seq_len", "64"]."""
    return [x for name, value in flags.items() for x in (f"--{name}", str(value))]


def json_scalars() -> st.SearchStrategy[Any]:
    return st.one_of(st.none(), st.booleans(), edge_ints(), edge_floats(), any_text(12))


def _containers(inner: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(st.lists(inner, max_size=4), st.dictionaries(any_text(8), inner, max_size=4))


def json_values(max_leaves: int = 12) -> st.SearchStrategy[Any]:
    return st.recursive(json_scalars(), _containers, max_leaves=max_leaves)


def deeply_nested(open_: str = "[", close: str = "]") -> st.SearchStrategy[str]:
    """Nesting past any parser's recursion limit, and just under it."""
    return st.sampled_from([10, 100, 999, 1000, 5000, 100_000]).map(lambda n: open_ * n + close * n)


def dumps(value: Any) -> str:
    """JSON as Python writes it for any value we generate: NaN/Infinity allowed, lone surrogates escaped (valid JSON,
    but not a valid Unicode scalar sequence once decoded)."""
    return json.dumps(value, ensure_ascii=True, allow_nan=True)


# ------------------------------------------------------------------------------------------- mutations


def _paths(value: Any, prefix: tuple = ()) -> list[tuple]:
    """Every key path into nested dicts and lists, the root's children first."""
    out: list[tuple] = []
    if isinstance(value, dict):
        items = value.items()
    elif isinstance(value, list):
        items = enumerate(value)
    else:
        return out
    for key, child in items:
        out.append(prefix + (key,))
        out += _paths(child, prefix + (key,))
    return out


# What a mutation puts in a field's place: null, a value of any type, an empty or deeply nested container.
REPLACEMENTS = st.one_of(st.just(None), json_scalars(), json_values(6), st.just([]), st.just({}), st.sampled_from([[[[[0]]]], {"a": {"b": {}}}]))


@st.composite
def mutated(draw, valid: dict, max_mutations: int = 3) -> dict:
    """A copy of a valid config with 1..max_mutations edits at any depth: a field deleted, set to null, to a
    value of another type, to a number at the edges, or buried in deep nesting."""
    paths = _paths(valid)
    config = json.loads(json.dumps(valid))
    for _ in range(draw(st.integers(1, max_mutations))):
        path = draw(st.sampled_from(paths))
        parent = config
        try:
            for key in path[:-1]:
                parent = parent[key]
            parent[path[-1]]
        except (KeyError, IndexError, TypeError):
            continue  # an earlier edit removed or replaced that path
        if not isinstance(parent, (dict, list)):
            continue  # replaced by a string, which indexes too
        if draw(st.booleans()) and isinstance(parent, dict):
            del parent[path[-1]]
        else:
            # a copy: the strategies' constants ([[[[0]]]], {}) must not be edited in place by a later edit (they would change for
            # every later example, or hold themselves: a circular value)
            parent[path[-1]] = copy.deepcopy(draw(REPLACEMENTS))
    return config


# ------------------------------------------------------------------------------------------- the property


def assert_clean(result, *outputs) -> None:
    """A click CliRunner result: success, or a clean refusal that leaves none of ``outputs`` (paths) behind.

    Clean: exit 1 with exactly one ``error:`` line on stderr (other lines only ``warning:``/``note:``), or
    click's usage error (exit 2, ending in one ``Error:`` line); never an exception other than SystemExit."""
    from hypothesis import event
    from hypothesis.errors import InvalidArgument

    try:  # --hypothesis-show-statistics then says how many examples ran through and how many were refused
        event(f"exit status {result.exit_code}")
    except InvalidArgument:  # not inside a Hypothesis test
        pass
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        import traceback

        raise AssertionError("a traceback:\n" + "".join(traceback.format_exception(result.exception)) + "\noutput:\n" + result.output)
    assert "Traceback" not in result.output, result.output
    if result.exit_code == 0:
        return
    err = result.stderr.splitlines()
    if result.exit_code == 2:
        assert err and err[-1].startswith("Error: "), result.stderr
        return
    assert result.exit_code == 1, (result.exit_code, result.output)
    errors = [line for line in err if line.startswith("error: ")]
    # progress lines may come before it (specdec-bench says what it measures); a log line of a library may not
    noise = [line for line in err if re.match(r"\w+(Error|Exception|Warning)\b|.*\[[EW]:onnxruntime", line)]
    assert len(errors) == 1 and err[-1] == errors[0] and not noise, f"not one clean error line:\n{result.stderr}"
    for path in outputs:
        assert not path.exists(), f"a refused run left {path} behind"
        assert not list(path.parent.glob(f".{path.name}*")), f"a refused run left a temporary of {path} behind"


def assert_one_line(err: BaseException, limit: int = 600) -> None:
    """An error message a CLI can print as one line: no line breaks, a readable length, and encodable
    (a lone surrogate in a message would make printing it fail with UnicodeEncodeError)."""
    text = str(err)
    assert text and "\n" not in text and "\r" not in text, repr(text)
    assert len(text) <= limit, f"{len(text)} characters: {text[:200]!r}..."
    text.encode("utf-8")
