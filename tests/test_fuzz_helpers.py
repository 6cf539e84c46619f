"""The fuzz helpers themselves (tests/fuzzing.py): a mutation of a valid config is a fresh JSON value every time.

Found by the 10x run (SPECDEC_FUZZ_SCALE=10): ``mutated`` put the replacement strategies' own constants
(``[[[[0]]]]``, ``{}``, ...) into a config, and a later edit of the same example reached into one and changed it:
the constant changed for every later example (the "same examples every run" promise broke) and, when the edit put
a constant inside itself, the value turned circular (``ValueError: Circular reference detected`` in ``dumps``).
"""

from __future__ import annotations

import json
from collections import deque

import pytest
from fuzzing import dumps, fuzz_settings, mutated
from hypothesis import given

VALID = {"a": [0, 0], "b": {"c": [1]}}  # short paths into lists and dicts: edits reach into what earlier edits put there
drawn: deque[tuple[object, str]] = deque(maxlen=50)  # the examples just before, and their JSON when drawn


def _containers(value: object) -> list[object]:
    if isinstance(value, dict):
        return [value] + [c for v in value.values() for c in _containers(v)]
    if isinstance(value, list):
        return [value] + [c for v in value for c in _containers(v)]
    return []


@pytest.mark.fuzz
@fuzz_settings(300)
@given(mutated(VALID))
def test_a_mutation_is_a_fresh_json_value_that_later_draws_leave_alone(config):
    text = dumps(config)  # not circular
    assert json.loads(text) is not None
    inside = _containers(config)
    assert len({id(c) for c in inside}) == len(inside), "one object in two places of one example"
    for earlier, as_drawn in drawn:  # a later example's edits never reach into an earlier one (through a shared constant)
        assert dumps(earlier) == as_drawn
    drawn.append((config, text))
