"""The torch backend on a GPU (marked cuda(backend="torch"): a host with an NVIDIA GPU, torch with CUDA and Triton;
skipped elsewhere). The demo pair and its Medusa heads, EAGLE module and P-EAGLE module built with --backend torch in
bfloat16, and an int4 weight-only target.

Exactness is against the same engine's own target-only decoding: every speculative output must equal it at batch
1, 4, 16 and 64, for draft-target, n-gram, suffix decoding (tree and chain), Medusa, EAGLE and P-EAGLE (chain and
tree), int4 included. What makes that hold: a verification step gives the bits of one-token steps (tested directly), because
every kernel computes a row the same way whatever the call's rows (kernels/gemm.py, kernels/attention.py). CUDA
graphs replayed after rollback, copy_slot and compact_slot give the logits of a run without graphs, bit for bit.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import spec_build

from specdec.builder.build import build_engine
from specdec.formats.engine_format import eagle_module_dir, load_engine_dir

DEMO = Path(__file__).resolve().parents[2] / "examples" / "demo-pair"
TREE = "[[0],[1],[2],[0,0],[0,1],[1,0],[0,0,0],[0,0,1]]"
TEXTS = [
    "def fibonacci(n):\n    ",
    "import os\n\ndef list_files(path):\n    result = []\n    for name in os.listdir(path):\n",
    "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, item):\n",
    "def read_lines(filename):\n    with open(filename) as f:\n",
]
BATCHES = [1, 4, 16, 64]
pytestmark = pytest.mark.cuda(backend="torch")


def executor(path, **kw):
    from specdec.runtime.backends.torch.executor import TorchExecutor

    return TorchExecutor(load_engine_dir(path), "cuda:0", **kw)


@pytest.fixture(scope="module")
def gpu(tmp_path_factory):
    from specdec.formats.tokenizer import Tokenizer

    d = tmp_path_factory.mktemp("torch_cuda")
    limits = dict(max_batch_size=64, max_input_len=128, max_seq_len=256, dtype="bfloat16", backend="torch")
    quiet = dict(say=lambda _: None)
    build_engine(DEMO / "target", d / "eagle", spec_build(8, speculative_decoding_mode="eagle", **limits), eagle_dir=DEMO / "heads" / "eagle",
                 **quiet)
    build_engine(DEMO / "target", d / "medusa", spec_build(8, speculative_decoding_mode="medusa", **limits), medusa_dir=DEMO / "heads" / "medusa",
                 **quiet)
    build_engine(DEMO / "target", d / "int4", spec_build(4, quantization="int4_wo", **limits), **quiet)
    build_engine(DEMO / "draft", d / "draft", spec_build(0, **limits), **quiet)
    build_engine(DEMO / "target", d / "peagle", spec_build(8, speculative_decoding_mode="peagle", **limits),
                 peagle_dir=DEMO / "heads" / "peagle", **quiet)
    ex = {name: executor(d / name) for name in ("eagle", "medusa", "int4", "draft", "peagle")}
    ex["module"] = executor(eagle_module_dir(ex["eagle"].engine))
    ex["peagle_module"] = executor(eagle_module_dir(ex["peagle"].engine))
    tok = Tokenizer(DEMO / "target")
    # 64 prompts of 6..30 tokens; every fourth repeats itself (n-gram's case)
    prompts = [tok.encode(TEXTS[i % 4])[: 6 + (i * 7) % 25] for i in range(64)]
    prompts = [p * 2 if i % 4 == 3 else p for i, p in enumerate(prompts)]
    return {"ex": ex, "prompts": prompts, "dir": d}


def generate(target, prompts, proposer=None, draft_len=0, max_output_len=32):
    from specdec.runtime.orchestrator import Orchestrator
    from specdec.runtime.request import GenerationConfig

    outs, metrics = Orchestrator(target, proposer, draft_len).generate(prompts, GenerationConfig(max_output_len=max_output_len))
    return [o.output_ids for o in outs], metrics


def test_the_engines_run_the_gpu_path(gpu):
    for name, ex in gpu["ex"].items():
        assert (ex.device, ex.kernels, ex.dense, ex.cuda_graphs) == ("cuda:0", "triton", "stable", True), name
        assert ex.build.dtype == "bfloat16"


@pytest.mark.parametrize("batch", BATCHES)
def test_every_method_equals_target_only(gpu, batch):
    from specdec.runtime.proposers.draft_model import DraftModelProposer
    from specdec.runtime.proposers.eagle import EagleProposer
    from specdec.runtime.proposers.medusa import MedusaProposer
    from specdec.runtime.proposers.ngram import NGramProposer
    from specdec.runtime.proposers.suffix import SuffixConfig, SuffixProposer

    ex, prompts = gpu["ex"], gpu["prompts"][:batch]
    target, medusa, draft, module = ex["eagle"], ex["medusa"], ex["draft"], ex["module"]
    want, _ = generate(target, prompts)
    cases = {
        "draft-target k=4": (lambda: DraftModelProposer(draft), 4),
        "draft-target k=2": (lambda: DraftModelProposer(draft), 2),
        "draft-target auto": (lambda: DraftModelProposer(draft), "auto"),
        "n-gram": (lambda: NGramProposer(4, 3), 4),
        "EAGLE chain": (lambda: EagleProposer(target, module), 4),
        "EAGLE tree": (lambda: EagleProposer(target, module, TREE), len(json.loads(TREE))),
        "EAGLE auto": (lambda: EagleProposer(target, module, TREE), "auto"),
    }
    for name, (make, k) in cases.items():
        got, metrics = generate(target, prompts, make(), k)
        assert got == want, f"{name}, batch {batch}"
        assert metrics.drafted > 0 or k == "auto", name
    for trees in (True, False):  # suffix decoding's trees (each round its own shape), then a pass drafting from the first's answers
        proposer = SuffixProposer(SuffixConfig(), trees=trees)
        for rerun in range(2):
            got, metrics = generate(target, prompts, proposer, SuffixConfig().max_draft_len)
            assert got == want, f"suffix {'tree' if trees else 'chain'} pass {rerun + 1}, batch {batch}"
    medusa_want, _ = generate(medusa, prompts)
    for choices, k in ((None, 3), (TREE, len(json.loads(TREE)))):
        got, _ = generate(medusa, prompts, MedusaProposer(medusa, choices), k)
        assert got == medusa_want, f"Medusa {'tree' if choices else 'chain'}, batch {batch}"


@pytest.mark.parametrize("batch", BATCHES)
def test_peagle_equals_its_own_target_only(gpu, batch):
    """P-EAGLE on the torch engines (a block of drafts per module call): chains, a tree and auto, the peagle target's own
    target-only output."""
    from specdec.runtime.proposers.peagle import PEagleProposer

    ex, prompts = gpu["ex"], gpu["prompts"][:batch]
    target, module = ex["peagle"], ex["peagle_module"]
    want, _ = generate(target, prompts)
    for name, choices, k in (("chain k=4", None, 4), ("chain k=8", None, 8), ("tree", TREE, len(json.loads(TREE))), ("auto", TREE, "auto")):
        got, metrics = generate(target, prompts, PEagleProposer(target, module, choices), k)
        assert got == want, f"P-EAGLE {name}, batch {batch}"
        assert metrics.drafted > 0 or k == "auto", name


def test_peagle_module_graphs_give_the_eager_logits(gpu):
    """The P-EAGLE module's calls (a ragged catch-up, then rounds of real pairs and placeholders up to 2 * max_draft_len wide,
    the placeholders dropped after each) with and without CUDA graphs: the same logits, bit for bit; the widest replayed."""
    path, prompts = eagle_module_dir(gpu["ex"]["peagle"].engine), gpu["prompts"][:5]
    rounds, rng = (1, 9, 3, 9), np.random.default_rng(0)
    widths = [max(map(len, prompts)), *(pairs + 7 for pairs in rounds)]  # 16 wide at 9 pairs: 2 * max_draft_len
    hidden = [rng.standard_normal((5, w, gpu["ex"]["peagle"].model.hidden_size)).astype(np.float32) for w in widths]
    outs, caches = [], []
    for ex in (executor(path, cuda_graphs=True), executor(path, cuda_graphs=False)):
        v, cache = ex.vocab_size, ex.new_cache(5)
        got = [ex.forward(cache, prompts, all_logits=False, extra_inputs={"hidden_states": hidden[0]}).logits.copy()]
        for pairs, h in zip(rounds, hidden[1:], strict=True):
            start = cache.lengths.copy()
            block = [[20 + r] * pairs + [v + j for j in range(7)] for r in range(5)]
            got.append(ex.forward(cache, block, all_logits=True, extra_inputs={"hidden_states": h}).logits.copy())
            cache.lengths[:] = start + pairs
        outs.append(got)
        caches.append(cache)
    assert (5, 16, 16, False) in caches[0].graphs and not caches[1].graphs
    for i, (a, b) in enumerate(zip(*outs, strict=True)):
        np.testing.assert_array_equal(a, b, err_msg=f"call {i}")


@pytest.mark.parametrize("batch", BATCHES)
def test_int4_speculation_equals_its_own_target_only(gpu, batch):
    from specdec.runtime.proposers.draft_model import DraftModelProposer
    from specdec.runtime.proposers.ngram import NGramProposer

    ex, prompts = gpu["ex"], gpu["prompts"][:batch]
    want, _ = generate(ex["int4"], prompts)
    for make, k in ((lambda: DraftModelProposer(ex["draft"]), 4), (lambda: NGramProposer(4, 3), 4),
                    (lambda: DraftModelProposer(ex["draft"]), "auto")):
        got, metrics = generate(ex["int4"], prompts, make(), k)
        assert got == want, (k, batch)


@pytest.mark.parametrize("name", ["eagle", "int4"])
def test_a_verification_step_gives_the_one_token_steps_logits(gpu, name):
    """k+1 tokens in one call and k+1 one-token calls: the same logits, bit for bit, at batch 1, 4 and 64."""
    ex, prompts = gpu["ex"][name], gpu["prompts"]
    for batch in (1, 4, 64):
        toks = [[11 + r % 7, 12, 13, 14, 15] for r in range(batch)]
        one, seq = ex.new_cache(batch), ex.new_cache(batch)
        ex.forward(one, prompts[:batch], all_logits=False)
        ex.forward(seq, prompts[:batch], all_logits=False)
        wide = ex.forward(one, toks, all_logits=True).logits.copy()
        narrow = np.stack([ex.forward(seq, [[t[j]] for t in toks], all_logits=True).logits[:, 0].copy() for j in range(5)], axis=1)
        np.testing.assert_array_equal(wide, narrow, err_msg=f"{name} batch {batch}")


def test_graph_replay_after_rollback_copy_and_compaction(gpu):
    """The same calls with and without CUDA graphs (trees, compaction, copy_slot, a rollback, a padded bucket: 5 rows replay
    the 5-row graph, 9 rows the 16-row one): the same logits, bit for bit."""
    path = gpu["dir"] / "eagle"
    graphs, plain = executor(path, cuda_graphs=True), executor(path, cuda_graphs=False)
    prompts = gpu["prompts"][:9]
    parents = np.array([-1, 0, 0, 1, 2, 3])  # root, two children, a grandchild under each, one more level
    outs, captured = [], []
    for ex in (graphs, plain):
        got = []
        for rows in (5, 9):
            cache = ex.new_cache(rows)
            captured.append(cache.graphs)
            ex.forward(cache, prompts[:rows], all_logits=False)
            for step in range(4):
                start = cache.lengths.copy()
                got.append(ex.forward(cache, [[20 + step + j for j in range(6)]] * rows, all_logits=True, parents=[parents] * rows).logits.copy())
                for row in range(rows):
                    ex.compact_slot(cache, row, int(start[row]), [0, 2, 4] if row % 2 else [0, 1, 3, 5])  # non-contiguous paths
                got.append(ex.forward(cache, [[7 + r] for r in range(rows)], all_logits=True).logits.copy())
                got.append(ex.forward(cache, [[8, 9, 10]] * rows, all_logits=True).logits.copy())
                cache.rollback(0, int(cache.lengths[0]) - 2)  # drafts rejected
                if step == 1:
                    ex.copy_slot(cache, rows - 1, 0)
        outs.append(got)
    assert all(captured[:2]) and not any(captured[2:])  # graphs captured on the first executor's caches only
    assert {key[0] for key in captured[1]} == {16}  # 9 rows replayed the 16-row bucket
    for i, (a, b) in enumerate(zip(*outs, strict=True)):
        np.testing.assert_array_equal(a, b, err_msg=f"call {i}")


def test_a_float32_engine_on_the_gpu_decodes_what_the_cpu_decodes(gpu, tmp_path):
    from specdec.runtime.backends.torch.executor import TorchExecutor

    build_engine(DEMO / "target", tmp_path / "f32", spec_build(4, max_batch_size=4, max_input_len=128, max_seq_len=256, backend="torch",
                                                               dtype="float32"), say=lambda _: None)
    prompts = gpu["prompts"][:4]
    on_gpu, _ = generate(executor(tmp_path / "f32"), prompts)
    on_cpu, _ = generate(TorchExecutor(load_engine_dir(tmp_path / "f32"), "cpu"), prompts)
    assert on_gpu == on_cpu


@pytest.mark.parametrize("dense", ["cublas", "fixed"])
def test_the_cublas_and_one_tile_dense_paths_compute_the_same_model(gpu, dense):
    """SPECDEC_TORCH_DENSE=cublas (dense layers on torch's matmul) and =fixed (every layer on the one 16 x 32 tile), for
    comparing speed: the per-shape tiles' logits within bfloat16 rounding."""
    path, prompts = gpu["dir"] / "eagle", gpu["prompts"][:4]
    outs = []
    for ex in (executor(path, dense=dense), gpu["ex"]["eagle"]):
        cache = ex.new_cache(4)
        outs.append(ex.forward(cache, prompts, all_logits=False).logits.copy())
    scale = np.abs(outs[1]).max()
    assert np.abs(outs[0] - outs[1]).max() < 0.05 * scale
    assert (outs[0].argmax(-1) == outs[1].argmax(-1)).mean() >= 0.75


@pytest.mark.parametrize("name", ["eagle", "int4"])
def test_split_sums_left_to_the_norm_give_the_bits_of_their_own_kernel(gpu, name):
    """The demo target's down_proj splits its reduction: "stable" adds its partials in the next add_rmsnorm, "unfused" in a
    kernel of their own first. A prefill and a verification step give the same logits, bit for bit, graphs and all."""
    from specdec.runtime.backends.torch.kernels import gemm

    assert gemm.tile_for(256, 768).split > 1 and gemm.tile_for(256, 768, 4).split > 1  # the demo's down_proj, dense and int4
    outs = []
    for ex in (executor(gpu["dir"] / name, dense="unfused"), gpu["ex"][name]):
        cache = ex.new_cache(4)
        first = ex.forward(cache, gpu["prompts"][:4], all_logits=False).logits.copy()
        outs.append((first, ex.forward(cache, [[5, 6, 7]] * 4, all_logits=True).logits.copy()))
    assert np.array_equal(outs[0][0], outs[1][0]) and np.array_equal(outs[0][1], outs[1][1])


@pytest.mark.parametrize("name", ["eagle", "int4"])
def test_small_calls_on_the_16_row_tile_give_the_shape_tiles_bits(gpu, name, monkeypatch):
    """Calls of at most 16 rows run the demo target's unsplit dense layers on the 16-row tile where it gave the shape
    tile's bits at first use; "shape" keeps every call on the shape tile. A prefill (more than 16 rows), a one-token step
    (4 rows) and a verification (12 rows) give the same logits either way, and across the boundary a 5-token
    verification of 4 requests (20 rows: the shape tile) gives its first token the one-token step's logits. The 16-row
    tile is taken wherever its check agreed (an int4 target's dense layers: its LM head)."""
    from specdec.runtime.backends.torch.kernels import gemm

    taken = []
    launch = gemm._launch
    monkeypatch.setattr(gemm, "_launch", lambda run, M, N, K, dtype, device, tile, kind, unsummed: taken.append((kind[0], N, K, tile)) or launch(
        run, M, N, K, dtype, device, tile, kind, unsummed))
    outs = []
    for ex in (executor(gpu["dir"] / name, dense="shape"), executor(gpu["dir"] / name)):
        cache = ex.new_cache(4)
        first = ex.forward(cache, gpu["prompts"][:4], all_logits=False).logits.copy()
        step = ex.forward(cache, [[5]] * 4, all_logits=True).logits.copy()
        outs.append((first, step, ex.forward(cache, [[6, 7, 8]] * 4, all_logits=True).logits.copy()))
        wide = ex.new_cache(4)
        ex.forward(wide, gpu["prompts"][:4], all_logits=False)
        verified = ex.forward(wide, [[5, 6, 7, 8, 9]] * 4, all_logits=True).logits
        assert np.array_equal(verified[:, :1], step)
    assert all(np.array_equal(a, b) for a, b in zip(outs[0], outs[1], strict=True))
    small = [t for kind, _, _, t in taken if kind == "dense" and t.block_m == gemm.SMALL_ROWS and t.num_stages == 5]
    shapes = {(N, K) for kind, N, K, _ in taken if kind == "dense"}
    agreed = [ok for key, ok in gemm._SMALL_AGREES.items() if key[4:6] in shapes]  # key: (*kind, dtype, N, K, ...)
    assert agreed and bool(small) == any(agreed), gemm._SMALL_AGREES


def test_kernels_address_calls_past_two_to_the_31_elements():
    """A long prefill's rows times a layer's width pass 2**31 (Llama-3-8B's gate|up, 28672 wide, at 75k tokens): the
    kernels' offsets are int64, so the last rows are computed and stored where they belong (4.3 GB of bfloat16 here)."""
    import torch

    from specdec.runtime.backends.torch.kernels.gemm import linear
    from specdec.runtime.backends.torch.kernels.silu import silu_mul, silu_mul_ref

    rows, width = 75_000, 28_672  # rows * width = 2.15e9 > 2**31
    gen = torch.Generator("cuda").manual_seed(0)
    gate_up = torch.randn(rows, width, device="cuda", dtype=torch.bfloat16, generator=gen)
    tail = slice(rows - 3, rows)
    torch.testing.assert_close(silu_mul(gate_up)[tail], silu_mul_ref(gate_up[tail]))  # a wrapped offset reads another row
    del gate_up
    x = torch.randn(rows, 64, device="cuda", dtype=torch.bfloat16, generator=gen)
    weight = torch.randn(width, 64, device="cuda", dtype=torch.bfloat16, generator=gen)
    assert torch.equal(linear(x, weight)[tail], linear(x[tail], weight))  # a row's bits do not depend on the call's rows


def test_load_engine_times_step_costs_on_the_gpu_by_default(gpu):
    """On a GPU executor with a drafter loaded, load_engine times every (batch size, width) at load (--measure_step_costs
    auto): auto starts from this GPU's costs and the graphs are captured before the first request."""
    from specdec.runtime.loading import load_engine

    engine = load_engine(gpu["dir"] / "int4", gpu["dir"] / "draft", device="cuda", draft_len="auto")
    assert engine.step_costs_note and engine.auto.verify[1].measured and engine.auto.verify[64].measured
    off = load_engine(gpu["dir"] / "int4", gpu["dir"] / "draft", device="cuda", draft_len="auto", measure_step_costs=False)
    assert off.step_costs_note is None and not any(line.measured for line in off.auto.verify)


@pytest.mark.parametrize("method", ["none", "draft", "eagle", "medusa", "peagle"])
def test_a_prefix_cache_hit_gives_the_cold_output_alone_in_a_batch_and_as_samples(gpu, method):
    """Prefix caching on the CUDA executor (issue 40): a 40-token system prompt served alone, then to a batch of 7 that
    hits its rows, then as 3 samples of one prompt: outputs and log-probabilities equal a cold engine's, greedy and
    sampled, for target-only, draft-target, EAGLE, Medusa and P-EAGLE (the module's cache reuses its prefix too)."""
    from engine_runs import run_plan

    from specdec.runtime.proposers.draft_model import DraftModelProposer
    from specdec.runtime.proposers.eagle import EagleProposer
    from specdec.runtime.proposers.medusa import MedusaProposer
    from specdec.runtime.proposers.peagle import PEagleProposer
    from specdec.runtime.sampling import SamplingConfig

    ex, rng = gpu["ex"], np.random.default_rng(3)
    system = rng.integers(10, 4000, 40).tolist()
    prompts = [system + rng.integers(10, 4000, n).tolist() for n in (3, 9, 17, 5, 30, 2, 11, 8)]
    plan = [[prompts[0]], prompts[1:], [prompts[0][:-1] + [77]] * 3]
    target, make = {"none": (ex["eagle"], list), "draft": (ex["eagle"], lambda: [DraftModelProposer(ex["draft"])]),
                    "eagle": (ex["eagle"], lambda: [EagleProposer(ex["eagle"], ex["module"])]),
                    "medusa": (ex["medusa"], lambda: [MedusaProposer(ex["medusa"])]),
                    "peagle": (ex["peagle"], lambda: [PEagleProposer(ex["peagle"], ex["peagle_module"])])}[method]
    for sampling in (None, SamplingConfig(temperature=0.8, top_k=40, random_seed=2)):
        warm, cold = (run_plan(target, make(), method, on, plan, sampling) for on in (True, False))
        for w_batch, c_batch in zip(warm, cold, strict=True):
            for w, c in zip(w_batch, c_batch, strict=True):
                assert w.output_ids == c.output_ids and w.logprobs == c.logprobs, (method, sampling)
        assert all(o.metrics.cached_tokens >= len(system) for o in warm[1]), method
        assert all(o.metrics.cached_tokens == 0 for batch in cold for o in batch)
