"""The prefix index: a radix tree over token ids in blocks (runtime/prefix_index.py), literal token arrays."""

import random

import pytest

from specdec.runtime.prefix_index import PrefixIndex


def test_a_match_is_exact_to_the_token_beyond_the_last_full_block():
    index = PrefixIndex(block=4)
    index.add("a", [1, 2, 3, 4, 5, 6, 7, 8, 9, 10])  # two full blocks and a partial one
    # agrees on 9 tokens: two blocks down the tree, then one more token compared
    assert index.match([1, 2, 3, 4, 5, 6, 7, 8, 9, 99, 98]) == ("a", 9)
    # agrees on 6: one block, then two tokens of the next
    assert index.match([1, 2, 3, 4, 5, 6, 0, 0]) == ("a", 6)
    # the query is shorter than the holder: the whole query
    assert index.match([1, 2, 3, 4, 5]) == ("a", 5)


def test_less_than_a_block_is_no_match_and_short_holders_are_not_indexed():
    index = PrefixIndex(block=4)
    assert index.add("short", [1, 2, 3]) is False
    assert "short" not in index
    index.add("a", [1, 2, 3, 4, 5])
    assert index.match([1, 2, 3, 9]) == (None, 0)  # 3 tokens agree: under a block
    assert index.match([1, 2, 3]) == (None, 0)
    assert index.match([]) == (None, 0)


def test_the_longest_holder_wins_then_the_higher_rank_then_the_most_recent():
    index = PrefixIndex(block=2)
    index.add("short", [1, 2, 3, 4])
    index.add("long", [1, 2, 3, 4, 5, 6, 7])
    assert index.match([1, 2, 3, 4, 5, 6, 7, 8]) == ("long", 7)
    assert index.match([1, 2, 3, 4, 9]) in (("short", 4), ("long", 4))
    index.add("twin", [1, 2, 3, 4])
    assert index.match([1, 2, 3, 4, 9]) == ("twin", 4)  # added last: most recently used among equals
    index.touch("short")
    assert index.match([1, 2, 3, 4, 9]) == ("short", 4)
    assert index.match([1, 2, 3, 4, 9], rank=lambda k: k == "long") == ("long", 4)


def test_eligible_passes_holders_over_and_falls_back_to_a_shorter_match():
    index = PrefixIndex(block=2)
    index.add("a", [1, 2, 3, 4, 5, 6])
    index.add("b", [1, 2, 3, 4, 7, 8])
    assert index.match([1, 2, 3, 4, 5, 6], eligible=lambda k: k != "a") == ("b", 4)
    assert index.match([1, 2, 3, 4, 5, 6], eligible=lambda k: False) == (None, 0)


def test_remove_and_replace_leave_no_trace():
    index = PrefixIndex(block=2)
    index.add("a", [1, 2, 3, 4])
    index.add("a", [5, 6, 7, 8])  # a holder's tokens replaced (a pool slot that now holds another sequence)
    assert index.match([1, 2, 3, 4]) == (None, 0)
    assert index.match([5, 6, 7, 8]) == ("a", 4)
    index.remove("a")
    index.remove("a")  # twice: nothing
    assert len(index) == 0 and not index.root.children


def test_the_index_agrees_with_a_brute_force_longest_common_prefix():
    """Random sequences over a 3-token alphabet (long shared prefixes), adds and removes, against a plain scan."""
    rng = random.Random(0)
    block = 3
    index, held = PrefixIndex(block=block), {}
    for step in range(400):
        key = rng.randrange(12)
        if rng.random() < 0.25:
            index.remove(key)
            held.pop(key, None)
        else:
            tokens = [rng.randrange(3) for _ in range(rng.randrange(0, 14))]
            if index.add(key, tokens):
                held[key] = tokens
            else:
                held.pop(key, None)
        query = [rng.randrange(3) for _ in range(rng.randrange(0, 14))]

        def common(a, b):
            n = 0
            while n < min(len(a), len(b)) and a[n] == b[n]:
                n += 1
            return n

        best = max((common(t, query) for t in held.values()), default=0)
        key_found, n = index.match(query)
        assert n == (best if best >= block else 0), (step, query, held)
        if key_found is not None:
            assert common(held[key_found], query) == n


def test_a_block_must_hold_a_token():
    with pytest.raises(ValueError):
        PrefixIndex(block=0)
