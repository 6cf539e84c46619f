"""benchmarks/bench_steps.py: several processes' rounds pooled, a labelled build paired with its engine's own, and each later
engine with the first."""

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
_spec = importlib.util.spec_from_file_location("bench_steps", ROOT / "benchmarks" / "bench_steps.py")
bench_steps = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench_steps)


def process(this: list[float], main: list[float]) -> dict:
    """measure()'s result for engine E and E [main] at width 1, with these CPU ms per round."""
    return bench_steps.with_spreads({"E": {1: {"cpu_ms_by_round": this, "wall_ms_by_round": this}},
                                     "E [main]": {1: {"cpu_ms_by_round": main, "wall_ms_by_round": main}}})


def test_the_processes_rounds_are_pooled_and_each_round_keeps_its_process():
    merged = bench_steps.merge_processes([process([2.0, 4.0], [4.0, 4.0]), process([3.0], [2.0])])
    e = merged["E"][1]
    assert e["cpu_ms_by_round"] == [2.0, 4.0, 3.0] and e["process_by_round"] == [0, 0, 1]
    assert e["cpu_ms"] == {"median": 3.0, "min": 2.0, "max": 4.0} and e["wall_ms"] == e["cpu_ms"]


def test_a_labelled_build_is_paired_round_by_round_and_per_process():
    merged = bench_steps.merge_processes([process([2.0, 4.0], [4.0, 4.0]), process([3.0], [2.0])])
    (name, r), = bench_steps.paired(merged, [1]).items()
    assert name == "E / E [main], width 1"
    assert (r["median"], r["min"], r["max"]) == (1.0, 0.5, 1.5)  # this / main: 0.5, 1.0, 1.5
    assert r["by_process"] == [0.75, 1.5]  # a process's own median: its bias shows


def test_one_process_has_one_median_and_no_pair_without_its_engine():
    one = process([2.0, 2.0], [1.0, 1.0])
    assert bench_steps.paired(one, [1])["E / E [main], width 1"]["by_process"] == [2.0]
    alone = {"F [main]": one["E [main]"]}
    assert bench_steps.paired(alone, [1]) == {}


def test_each_later_engine_is_paired_with_the_first():
    """Two builds of one checkpoint (--engine old --engine new): new / old per round (under 1: the new one is faster), each
    process's median; a labelled run pairs with its own engine only."""
    def engines(old: list[float], new: list[float]) -> dict:
        return bench_steps.with_spreads({f"/x/{n}": {1: {"cpu_ms_by_round": v, "wall_ms_by_round": v}} for n, v in (("old", old), ("new", new))})

    merged = bench_steps.merge_processes([engines([4.0, 2.0], [2.0, 2.0]), engines([2.0], [3.0])])
    (name, r), = bench_steps.paired(merged, [1]).items()
    assert name == "new / old, width 1"
    assert (r["median"], r["min"], r["max"]) == (1.0, 0.5, 1.5) and r["by_process"] == [0.75, 1.5]
    labelled = {**merged, "/x/new [main]": merged["/x/new"]}
    assert set(bench_steps.paired(labelled, [1])) == {"new / old, width 1", "new / new [main], width 1"}


def test_processes_and_rounds_must_be_at_least_one(capsys):
    for flag in ("--processes", "--rounds"):
        with pytest.raises(SystemExit) as e:
            bench_steps.main(["--engine", "x", flag, "0"])
        assert e.value.code == 2 and "must be at least 1" in capsys.readouterr().err


def test_each_turn_makes_the_sessions_and_their_caches_in_another_order(tmp_path, monkeypatch):
    engines = [tmp_path / "a", tmp_path / "b"]
    events = []

    def open_executor(path, threads, library=None, earlier=False):
        events.append(("open", path.name, library))
        return (path.name, library)

    monkeypatch.setattr(bench_steps, "cpu_kernels", lambda engine: "specdec")  # both built with --cpu_kernels specdec
    monkeypatch.setattr(bench_steps, "open_executor", open_executor)
    monkeypatch.setattr(bench_steps, "with_context", lambda ex, context: events.append(("cache", *ex)))
    monkeypatch.setattr(bench_steps, "call", lambda ex, cache, width: None)
    lib = Path("other.so")
    out = bench_steps.measure(engines, 1, [1], 0, 2, 1, {"lib": lib}, None, None, open_turn=1)
    turned = [("b", None), ("a", lib), ("b", lib), ("a", None)]  # a, b, a [lib], b [lib] turned by one
    assert events == [("open", *x) for x in turned] + [("cache", *x) for x in turned]
    assert list(out) == [str(engines[0]), str(engines[1]), f"{engines[0]} [lib]", f"{engines[1]} [lib]"]  # reported in their own order
    assert all(len(per[1]["cpu_ms_by_round"]) == 2 for per in out.values())


def test_a_tree_makes_the_calls_of_its_width_verify_it(monkeypatch, capsys):
    """--tree: calls of its token count pass its parents to forward; other widths stay chains; a tree whose width is not
    measured, or that is not a list of parents, is refused."""
    calls = []

    class Ex:
        def forward(self, cache, tokens, all_logits, parents=None):
            calls.append((len(tokens[0]), None if parents is None else parents[0].tolist()))

    class Cache:
        lengths = [10]

    monkeypatch.setattr(bench_steps, "TREE", [-1, 0, 0])
    bench_steps.call(Ex(), Cache(), 3)
    bench_steps.call(Ex(), Cache(), 1)
    assert calls == [(3, [-1, 0, 0]), (1, None)]
    for tree, expected in (("[-1, 0, 0]", "give that width in --widths"), ("{bad", "a JSON list of parent indices")):
        with pytest.raises(SystemExit) as e:
            bench_steps.main(["--engine", "x", "--widths", "1,5", "--tree", tree])
        assert e.value.code == 2 and expected in capsys.readouterr().err
