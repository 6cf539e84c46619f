"""Prefix caching on the GPU (marked cuda: a host with an NVIDIA GPU and onnxruntime-gpu; skipped elsewhere).

The CUDA executor's prefix pool is a device cache of its own; ``copy_prefix`` moves rows between it and the running
cache with 2-D copies. Checked: the copies move exactly the rows asked for (bsh and bnsh layouts, cache to pool, pool
to cache, slot to slot), and a hit gives the cold engine's output and log-probabilities with the demo pair built
with ort_cuda's masked attention in float32 (rows_consistent: the K/V of a decoding step are a prefill's bits) and
in bfloat16, for target-only, draft-target, EAGLE and Medusa, alone, in a batch of 8, and as n samples of one prompt.
"""

from pathlib import Path

import numpy as np
import pytest
from conftest import spec_build

from specdec.builder.build import build_engine
from specdec.formats.engine_format import eagle_module_dir, load_engine_dir

DEMO = Path(__file__).resolve().parents[2] / "examples" / "demo-pair"
pytestmark = pytest.mark.cuda
rng = np.random.default_rng(3)
SYSTEM = rng.integers(10, 4000, 40).tolist()
PROMPTS = [SYSTEM + rng.integers(10, 4000, n).tolist() for n in (3, 9, 17, 5, 30, 2, 11, 8)]


@pytest.fixture(scope="module", params=["float32", "bfloat16"])
def gpu(request, tmp_path_factory):
    from specdec.runtime.backends.onnxruntime.cuda import CudaExecutor

    d = tmp_path_factory.mktemp(f"cuda_prefix_{request.param}")
    limits = dict(max_batch_size=8, max_input_len=128, max_seq_len=256, dtype=request.param, lowering="ort_cuda", cuda_attention="masked")
    quiet = dict(say=lambda _: None)
    build_engine(DEMO / "target", d / "target", spec_build(4, **limits), **quiet)
    build_engine(DEMO / "target", d / "eagle", spec_build(8, speculative_decoding_mode="eagle", **limits), eagle_dir=DEMO / "heads" / "eagle",
                 **quiet)
    build_engine(DEMO / "target", d / "medusa", spec_build(8, speculative_decoding_mode="medusa", **limits), medusa_dir=DEMO / "heads" / "medusa",
                 **quiet)
    build_engine(DEMO / "draft", d / "draft", spec_build(0, **{**limits, "cuda_attention": "auto"}), **quiet)
    ex = {name: CudaExecutor(load_engine_dir(d / name), 0) for name in ("target", "eagle", "medusa", "draft")}
    ex["module"] = CudaExecutor(load_engine_dir(eagle_module_dir(ex["eagle"].engine)), 0)
    return ex


def run(ex, method, on, prompts, sampling=None, n_out=24):
    from engine_runs import run_plan

    from specdec.runtime.proposers.draft_model import DraftModelProposer
    from specdec.runtime.proposers.eagle import EagleProposer
    from specdec.runtime.proposers.medusa import MedusaProposer

    target, proposers = ex["target"], []
    if method == "draft":
        proposers = [DraftModelProposer(ex["draft"])]
    elif method == "eagle":
        target, proposers = ex["eagle"], [EagleProposer(ex["eagle"], ex["module"])]
    elif method == "medusa":
        target, proposers = ex["medusa"], [MedusaProposer(ex["medusa"])]
    return run_plan(target, proposers, method, on, prompts, sampling, n_out)  # the later batches hit the earlier ones' rows


def test_copy_prefix_moves_exactly_the_rows_asked_for(gpu):
    import onnxruntime as ort

    for name in ("target", "draft"):  # masked attention: bsh; the GQA draft: bnsh
        ex = gpu[name]
        cache, pool = ex.new_cache(2), ex.new_prefix_pool(3)
        ex.forward(cache, [PROMPTS[0][:30], PROMPTS[1][:20]], all_logits=False)
        ex.copy_prefix(cache, 0, pool, 2, 25)
        ex.copy_prefix(pool, 2, cache, 1, 12)
        assert pool.lengths[2] == 25 and cache.lengths[1] == 12
        def host(c, ex=ex):
            return np.asarray(ort.OrtValue.numpy(c.slab)).reshape(2 * ex.model.num_layers, c.num_slots, *ex.slot_shape)

        c, p = host(cache), host(pool)
        rows = (lambda a, n: a[..., :n, :]) if ex.build.kv_layout == "bnsh" else (lambda a, n: a[:, :n])  # noqa: E731
        for part in range(2 * ex.model.num_layers):
            np.testing.assert_array_equal(rows(p[part, 2], 25), rows(c[part, 0], 25))
            np.testing.assert_array_equal(rows(c[part, 1], 12), rows(c[part, 0], 12))


@pytest.mark.parametrize("method", ["none", "draft", "eagle", "medusa"])
def test_a_hit_gives_the_cold_output_alone_in_a_batch_and_as_samples(gpu, method):
    from specdec.runtime.sampling import SamplingConfig

    plan = [[PROMPTS[0]], PROMPTS[1:], [PROMPTS[0][:-1] + [77]] * 3]  # alone, then a batch of 7 that hits, then 3 samples
    for sampling in (None, SamplingConfig(temperature=0.8, top_k=40, random_seed=2)):
        warm, cold = run(gpu, method, True, plan, sampling), run(gpu, method, False, plan, sampling)
        for w_batch, c_batch in zip(warm, cold, strict=True):
            for w, c in zip(w_batch, c_batch, strict=True):
                assert w.output_ids == c.output_ids and w.logprobs == c.logprobs
        assert all(o.metrics.cached_tokens >= len(SYSTEM) for o in warm[1])
