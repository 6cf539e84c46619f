"""The n-gram pool on literal token sequences (TensorRT-LLM's NGram algorithm)."""

from specdec.runtime.proposers.ngram import NGramPool


def pool(seq, k=4, n=2, **kw) -> NGramPool:
    p = NGramPool(max_draft_len=k, max_matching_ngram_size=n, **kw)
    p.extend(seq)
    return p


def test_longest_pattern_with_full_continuation():
    # tail [3, 4] occurred before, followed by 4 tokens: all 4 are drafted
    assert pool([1, 2, 3, 4, 5, 6, 7, 8, 9, 3, 4]).draft() == [5, 6, 7, 8]


def test_shorter_continuation_near_the_end():
    # the earlier [3, 4] is followed by only 3 tokens (5, then the tail itself)
    assert pool([3, 4, 5, 3, 4]).draft() == [5, 3, 4]


def test_falls_back_to_a_one_token_pattern():
    # [9, 4] never occurred; [4] did, followed by 7 8
    assert pool([4, 7, 8, 1, 9, 4]).draft() == [7, 8, 1, 9]


def test_no_match_drafts_nothing():
    assert pool([1, 2, 3, 4, 5]).draft() == []


def test_limit_caps_the_draft():
    assert pool([1, 2, 3, 4, 5, 6, 7, 8, 9, 3, 4]).draft(limit=2) == [5, 6]


def test_oldest_and_newest_occurrence():
    seq = [1, 2, 10, 11, 1, 2, 20, 21, 1, 2]
    assert pool(seq).draft() == [20, 21, 1, 2]  # default: keep all, newest
    assert pool(seq, is_use_oldest=True).draft() == [10, 11, 1, 2]  # keep all, oldest (TensorRT-LLM's default)
    assert pool(seq, is_keep_all=False).draft() == [20, 21, 1, 2]  # keep only the newest
    assert pool(seq, is_keep_all=False, is_use_oldest=True).draft() == [20, 21, 1, 2]  # only one kept: the newest


def test_minimum_pattern_length():
    seq = [4, 7, 8, 1, 9, 4]  # only the 1-token pattern [4] matches
    assert pool(seq).draft() == [7, 8, 1, 9]
    assert pool(seq, min_matching_ngram_size=2).draft() == []


def test_longer_pattern_wins_over_shorter():
    # [2] alone first followed 5, but [1, 2] matches the tail and was followed by 7
    assert pool([2, 5, 1, 2, 7, 9, 1, 2], k=2).draft() == [7, 9]


def test_incremental_update_equals_full_rebuild():
    seq = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3, 2, 3, 8, 4, 6, 2, 6, 4, 3, 3, 8, 3, 2, 7, 9, 5]
    grown = NGramPool(5, 3)
    for lo in range(0, len(seq), 3):
        grown.extend(seq[lo : lo + 3])
        full = pool(seq[: lo + 3], k=5, n=3)
        assert grown.pool == full.pool
        assert grown.draft() == full.draft()
