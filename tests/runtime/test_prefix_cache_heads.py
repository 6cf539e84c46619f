"""Prefix caching with drafters the target's own prefill feeds: Medusa (its heads on the last prompt row) and EAGLE (the
target's features of every prompt token, which its module catches up on: kept beside the cached rows).

A hit gives the cold engine's output and log-probabilities, chain and tree, greedy and sampled, alone and in a batch,
and the module is fed what a cold prefill would have fed it.
"""

from __future__ import annotations

import numpy as np
import pytest
from checkpoints import make_checkpoint, write_eagle_module
from conftest import spec_build
from engine_runs import run_until_done
from test_medusa import write_heads

from specdec.builder.build import build_engine
from specdec.formats.engine_format import eagle_module_dir, load_engine_dir
from specdec.runtime.backends.onnxruntime.cpu import OrtExecutor
from specdec.runtime.engine import Engine, SpeculationConfig
from specdec.runtime.prefix_cache import PrefixCacheConfig
from specdec.runtime.proposers.eagle import EagleProposer
from specdec.runtime.proposers.medusa import MedusaProposer
from specdec.runtime.request import AUTO, GenerationConfig
from specdec.runtime.sampling import SamplingConfig

TREE = "[[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0]]"
rng = np.random.default_rng(1)
SYSTEM = rng.integers(3, 96, 20).tolist()
A, B = SYSTEM + rng.integers(3, 96, 6).tolist(), SYSTEM + rng.integers(3, 96, 5).tolist()
OTHER = rng.integers(3, 96, 11).tolist()
SAMPLED = SamplingConfig(temperature=0.9, top_k=20, random_seed=5)


@pytest.fixture(scope="module")
def targets(tmp_path_factory):
    d = tmp_path_factory.mktemp("prefix_heads")
    ckpt = make_checkpoint(d / "base", num_hidden_layers=3, seed=0)
    write_eagle_module(ckpt, d / "module", aux_ids=[0, 2])
    build_engine(ckpt, d / "eagle", spec_build(8, speculative_decoding_mode="eagle"), say=lambda _: None, eagle_dir=d / "module")
    write_heads(ckpt, d / "heads")
    build_engine(ckpt, d / "medusa", spec_build(8, speculative_decoding_mode="medusa"), say=lambda _: None, medusa_dir=d / "heads")
    eagle = OrtExecutor(load_engine_dir(d / "eagle"), num_threads=1)
    return {"eagle": eagle, "module": OrtExecutor(load_engine_dir(eagle_module_dir(eagle.engine)), num_threads=1),
            "medusa": OrtExecutor(load_engine_dir(d / "medusa"), num_threads=1)}


def engine(targets, method, k, choices=None, on=True):
    if method == "eagle":
        target, proposer = targets["eagle"], EagleProposer(targets["eagle"], targets["module"], choices)
    else:
        target, proposer = targets["medusa"], MedusaProposer(targets["medusa"], choices)
    return Engine(target, [proposer], SpeculationConfig(method, k), prefix_caching=PrefixCacheConfig(enabled=on, block=4))


def run(eng, prompts, sampling=SamplingConfig(), n_out=10):
    cfg = GenerationConfig(max_output_len=n_out, sampling=sampling, logprobs=2)
    ids = [eng.add_request(p, cfg, seed_stream=i) for i, p in enumerate(prompts)]
    done = run_until_done(eng)
    return [done[i] for i in ids]


CASES = [("eagle", 3, None, SamplingConfig()), ("eagle", 6, TREE, SamplingConfig()), ("eagle", 3, None, SAMPLED),
         ("eagle", AUTO, None, SamplingConfig()),
         ("medusa", 3, None, SamplingConfig()), ("medusa", 6, TREE, SamplingConfig()), ("medusa", 3, None, SAMPLED)]


@pytest.mark.parametrize("method,k,choices,sampling", CASES, ids=lambda v: str(getattr(v, "temperature", v))[:12])
def test_a_hit_gives_the_cold_output(targets, method, k, choices, sampling):
    warm = engine(targets, method, k, choices)
    run(warm, [A], sampling)
    got = run(warm, [OTHER, B], sampling)  # B copies SYSTEM's rows beside a newcomer that prefills everything
    want = run(engine(targets, method, k, choices, on=False), [OTHER, B], sampling)
    assert [o.metrics.cached_tokens for o in got] == [0, len(SYSTEM)]
    for g, w in zip(got, want, strict=True):
        assert g.output_ids == w.output_ids and g.logprobs == w.logprobs


@pytest.mark.parametrize("method", ["eagle", "medusa"])
def test_a_conversations_turns_and_samples_of_one_prompt(targets, method):
    """Turn 2 reuses turn 1's prompt and answer (the features of its answer's tokens too, for EAGLE); three samples of
    one prompt share its rows."""
    warm, cold = engine(targets, method, 3), engine(targets, method, 3, on=False)
    prompt = A
    for turn in range(2):
        (got,) = run(warm, [prompt])
        (want,) = run(cold, [prompt])
        assert got.output_ids == want.output_ids and got.logprobs == want.logprobs
        assert got.metrics.cached_tokens == (0 if turn == 0 else len(prompt) - 4)
        prompt = prompt + got.output_ids + [7, 8, 9]
    got, want = run(warm, [B] * 3, SAMPLED), run(cold, [B] * 3, SAMPLED)
    for g, w in zip(got, want, strict=True):
        assert g.output_ids == w.output_ids and g.logprobs == w.logprobs


def test_the_eagle_module_is_fed_what_a_cold_prefill_feeds_it(targets):
    """The module's pending pairs after a hit: the same features (bits) and tokens as after a cold prefill."""
    pending = {}
    for on in (True, False):
        eng = engine(targets, "eagle", AUTO, on=on)  # auto: the prompt's pairs wait until the request first drafts
        run(eng, [A], n_out=3)
        rid = eng.add_request(B, GenerationConfig(max_output_len=3))
        eng.step()
        got = eng.proposers["eagle"].pending[rid]
        pending[on] = (got.features.copy(), list(got.tokens))
        assert eng.requests[rid].metrics.cached_tokens == (len(SYSTEM) if on else 0)
    np.testing.assert_array_equal(pending[True][0], pending[False][0])
    assert pending[True][1] == pending[False][1]
