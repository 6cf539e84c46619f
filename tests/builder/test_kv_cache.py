"""Ragged batches and rollback (invariant 4: rejected drafts leave no trace)."""

import numpy as np
import pytest
from conftest import OrtExecutor, load_engine_dir

ATOL = 1e-5


@pytest.fixture
def ex(llama_engine):
    """A fresh executor per test on the session's one built engine."""
    return OrtExecutor(load_engine_dir(llama_engine), num_threads=1)


def test_ragged_batch_equals_each_row_alone(ex):
    rng = np.random.default_rng(0)
    prompts = [rng.integers(3, 96, n).tolist() for n in (5, 11, 8)]
    steps = [rng.integers(3, 96, n).tolist() for n in (3, 1, 5)]  # ragged generation step

    batch = ex.new_cache(3)
    ctx = ex.forward(batch, prompts, all_logits=False).logits.copy()
    gen = ex.forward(batch, steps, all_logits=True).logits.copy()
    for row in range(3):
        alone = ex.new_cache(1)
        np.testing.assert_allclose(ex.forward(alone, [prompts[row]], all_logits=False).logits[0], ctx[row], atol=ATOL)
        n = len(steps[row])
        np.testing.assert_allclose(ex.forward(alone, [steps[row]], all_logits=True).logits[0, :n], gen[row, :n], atol=ATOL)


def test_rollback_leaves_no_trace(ex):
    prompt, drafts, accepted_then = [5, 6, 7, 8, 9], [40, 41, 42, 43], [50, 51]

    clean = ex.new_cache(1)
    ex.forward(clean, [prompt + drafts[:1]], all_logits=False)
    want = ex.forward(clean, [accepted_then], all_logits=True).logits.copy()

    dirty = ex.new_cache(1)
    ex.forward(dirty, [prompt], all_logits=False)
    ex.forward(dirty, [drafts], all_logits=True)  # write K/V for 4 drafts
    dirty.rollback(0, len(prompt) + 1)  # keep 1 of them
    got = ex.forward(dirty, [accepted_then], all_logits=True).logits
    np.testing.assert_allclose(got, want, atol=ATOL)


def test_a_moved_slot_decodes_as_before(ex):
    """Slot 1's request leaves; the last slot's request moves into it (compaction)."""
    prompts = [[3, 4, 5], [6, 7, 8, 9], [10, 11]]
    batch = ex.new_cache(3)
    ex.forward(batch, prompts, all_logits=False)
    ex.copy_slot(batch, 2, 1)
    assert batch.lengths[1] == len(prompts[2])
    got = ex.forward(batch, [[20], [21]], all_logits=True).logits.copy()
    for row, prompt, nxt in ((0, prompts[0], 20), (1, prompts[2], 21)):
        alone = ex.new_cache(1)
        ex.forward(alone, [prompt], all_logits=False)
        np.testing.assert_allclose(ex.forward(alone, [[nxt]], all_logits=True).logits[0], got[row], atol=ATOL)


def test_a_range_of_slots_runs_alone(ex):
    """A newcomer is prefilled in its own slot while the other slots keep their state."""
    batch = ex.new_cache(3)
    ex.forward(batch, [[3, 4, 5], [6, 7]], all_logits=False)  # slots 0 and 1
    before = [k[:2].copy() for k in batch.keys]
    ex.forward(batch, [[10, 11, 12, 13]], all_logits=False, first_slot=2)
    assert batch.lengths.tolist() == [3, 2, 4]
    for k, b in zip(batch.keys, before, strict=True):
        np.testing.assert_array_equal(k[:2], b)
    got = ex.forward(batch, [[20], [21], [22]], all_logits=True).logits.copy()
    for row, prompt in enumerate(([3, 4, 5], [6, 7], [10, 11, 12, 13])):
        alone = ex.new_cache(1)
        ex.forward(alone, [prompt], all_logits=False)
        np.testing.assert_allclose(ex.forward(alone, [[20 + row]], all_logits=True).logits[0], got[row], atol=ATOL)


def test_a_new_cache_is_never_confused_with_a_freed_one(ex):
    """Regression: binding keyed on id(cache) reused a freed cache's id, so ONNX Runtime
    wrote K/V into freed memory instead of the new cache."""
    for _ in range(50):
        cache = ex.new_cache(1)
        ex.forward(cache, [[9, 9, 9, 9]], all_logits=False)
        del cache  # freed at once: the next KVCache often gets its id
        fresh = ex.new_cache(1)
        ex.forward(fresh, [[5, 6, 7]], all_logits=False)
        assert np.abs(fresh.keys[0]).sum() > 0, "the step did not write into the new cache"
