"""The torch executor on a CPU (float32, the kernels' torch references) against the onnxruntime engines of the same
checkpoints: every call the loop makes (ragged prefill and verification, rows riding along, trees, copy_slot,
compact_slot, Medusa's and EAGLE's extra outputs, an EAGLE module's hidden_states), and every method's greedy output
(target-only, draft-target with the draft on either backend, n-gram, suffix trees and chains, Medusa and EAGLE chains
and trees, auto), which must be the onnxruntime engine's output and its own target-only output, alone and in a ragged
batch. The Triton kernels run the same engines under Triton's interpreter and must give the references' logits.
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from checkpoints import make_checkpoint, write_eagle_module
from conftest import spec_build
from engine_runs import generate, open_cpu_executor, run_until_done, torch_one_thread  # noqa: F401 (a fixture)
from test_medusa import write_heads

from specdec.builder.build import build_engine
from specdec.formats.engine_format import eagle_module_dir, load_engine_dir
from specdec.formats.errors import DeviceError, EngineError, RequestError
from specdec.runtime.backends import Placement, open_executor
from specdec.runtime.backends.base import Executor
from specdec.runtime.backends.torch.executor import TorchExecutor
from specdec.runtime.engine import Engine, SpeculationConfig
from specdec.runtime.proposers.draft_model import DraftModelProposer
from specdec.runtime.proposers.eagle import EagleProposer
from specdec.runtime.proposers.medusa import MedusaProposer
from specdec.runtime.proposers.ngram import NGramProposer
from specdec.runtime.proposers.suffix import SuffixConfig, SuffixProposer
from specdec.runtime.request import GenerationConfig

PROMPTS = [[5, 6, 7, 8, 9, 10, 5, 6, 7], [11, 12, 13], [20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30]]
TREE = "[[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0]]"
BACKENDS = ("onnxruntime", "torch")


pytestmark = pytest.mark.usefixtures("torch_one_thread")


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """Each engine built for both backends from the same checkpoints: an EAGLE target (it serves every method but Medusa),
    a Medusa target, a draft, an int4 target. ex[name][backend] is its executor."""
    d = tmp_path_factory.mktemp("torch_pair")
    base = make_checkpoint(d / "base", num_hidden_layers=3, seed=0)
    draft = make_checkpoint(d / "draft", num_hidden_layers=1, hidden_size=32, intermediate_size=64, seed=0)
    write_eagle_module(base, d / "module", aux_ids=[0, 2])
    write_heads(base, d / "heads", copy_lm_head=True)  # heads that draft repeats of the next token: some accepted
    quiet = dict(say=lambda _: None)
    ex: dict[str, dict] = {}
    for backend in BACKENDS:
        b = dict(backend=backend)
        build_engine(base, d / backend / "eagle", spec_build(8, speculative_decoding_mode="eagle", **b), eagle_dir=d / "module", **quiet)
        build_engine(base, d / backend / "medusa", spec_build(8, speculative_decoding_mode="medusa", **b), medusa_dir=d / "heads", **quiet)
        build_engine(draft, d / backend / "draft", spec_build(0, **b), **quiet)
        # int4: ort_cpu's MatMulNBits computes with int8 activations; the portable lowering dequantizes, as the torch engine does
        lowering = {"lowering": "portable"} if backend == "onnxruntime" else {}
        build_engine(base, d / backend / "int4", spec_build(4, quantization="int4_wo", group_size=32, **b, **lowering), **quiet)
        for name in ("eagle", "medusa", "draft", "int4"):
            ex.setdefault(name, {})[backend] = open_cpu_executor(d / backend / name, backend)
        ex.setdefault("module", {})[backend] = open_cpu_executor(eagle_module_dir(ex["eagle"][backend].engine), backend)
    return {"dir": d, "ex": ex}


def close(a: np.ndarray, b: np.ndarray, what: str) -> None:
    """float32 on both sides, summed in other orders: within 1e-4 of the outputs' scale."""
    scale = max(float(np.abs(b).max()), 1.0)
    assert a.shape == b.shape, (what, a.shape, b.shape)
    np.testing.assert_allclose(a, b, rtol=0, atol=1e-4 * scale, err_msg=what)


def test_the_torch_engines_are_torch_engines(pair):
    t = pair["ex"]["eagle"]["torch"]
    assert isinstance(t, Executor)
    b = t.build
    assert (b.backend, b.lowering, b.kv_layout, b.dtype) == ("torch", "torch", "bnsh", "float32")
    assert t.extra_outputs == {"eagle_hidden"} and pair["ex"]["medusa"]["torch"].extra_outputs == {"medusa_logits"}
    assert pair["ex"]["module"]["torch"].extra_outputs == {"hidden_out"} and t.tree_attention
    assert pair["ex"]["module"]["torch"].extra_inputs == {"hidden_states"} and t.extra_inputs == frozenset()
    assert pair["ex"]["int4"]["torch"].build.weight_only["bits"] == 4
    names = {p.name for p in (pair["dir"] / "torch" / "eagle").iterdir()}
    assert {"config.json", "model.safetensors", "layer.0.safetensors", "layer.2.safetensors", "eagle"} <= names and "model.onnx" not in names


def run_calls(ex, calls):
    """Apply ``calls`` (kind, args) on a fresh 3-slot cache; every forward's outputs, copied."""
    cache, outs = ex.new_cache(3), []
    for kind, kw in calls:
        if kind == "forward":
            out = ex.forward(cache, **kw)
            outs.append({"logits": np.array(out.logits), **{name: np.array(a) for name, a in out.extras.items()}})
        elif kind == "copy":
            ex.copy_slot(cache, *kw)
        else:
            ex.compact_slot(cache, *kw)
    return outs, cache.lengths.copy()


CALLS = [
    ("forward", dict(tokens=PROMPTS, all_logits=False)),  # a ragged prefill
    ("forward", dict(tokens=[[1, 2, 3], [4], [5, 6]], all_logits=True)),  # a ragged verification
    ("forward", dict(tokens=[[7, 8], [9, 10], [11, 12]], all_logits=True, advance=np.array([True, False, True]))),  # row 1 rides along
    ("forward", dict(tokens=[[13, 14, 15, 16], [17], [18, 19, 20, 21]], all_logits=True,
                     parents=[np.array([-1, 0, 0, 1]), None, np.array([-1, 0, 1, 0])])),  # trees beside a chain
    ("compact", (0, 13, [0, 1, 3])),  # row 0's accepted path: tokens 0, 1, 3 of the tree
    ("compact", (2, 14, [0, 3])),
    ("copy", (2, 1)),
    ("forward", dict(tokens=[[22], [23], [24]], all_logits=True)),  # decoding on the compacted and copied rows
]


@pytest.mark.parametrize("name", ["eagle", "medusa", "int4"])
def test_every_call_gives_the_onnxruntime_engines_outputs(pair, name):
    torch_out, torch_len = run_calls(pair["ex"][name]["torch"], CALLS if name != "int4" else [c for c in CALLS if "parents" not in c[1]])
    ort_out, ort_len = run_calls(pair["ex"][name]["onnxruntime"], CALLS if name != "int4" else [c for c in CALLS if "parents" not in c[1]])
    assert torch_len.tolist() == ort_len.tolist()
    for i, (a, b) in enumerate(zip(torch_out, ort_out, strict=True)):
        assert a.keys() == b.keys()
        for field in a:
            close(a[field], b[field], f"{name} call {i} {field}")


def test_an_eagle_module_call_gives_the_onnxruntime_modules_outputs(pair):
    h = np.random.default_rng(0).standard_normal((2, 4, pair["ex"]["module"]["torch"].model.hidden_size)).astype(np.float32)
    outs = {}
    for backend in BACKENDS:
        m = pair["ex"]["module"][backend]
        cache = m.new_cache(2)
        first = m.forward(cache, [[3, 4, 5, 6], [7, 8]], all_logits=False, extra_inputs={"hidden_states": h})  # a ragged catch-up
        tree = m.forward(cache, [[9, 10, 11], [12, 13, 14]], all_logits=True, extra_inputs={"hidden_states": h[:, :3]},
                         parents=[np.array([-1, -1, 0]), None])
        outs[backend] = [np.array(x) for x in (first.logits, first.extras["hidden_out"], tree.logits, tree.extras["hidden_out"])]
    for i, (a, b) in enumerate(zip(*outs.values(), strict=True)):
        close(a, b, f"module output {i}")


def methods(ex, backend):
    """name -> (target, make proposers, method, draft lengths)."""
    t, draft, module, medusa = (ex[n][backend] for n in ("eagle", "draft", "module", "medusa"))
    other = ex["draft"]["onnxruntime" if backend == "torch" else "torch"]
    return {
        "draft-target": (t, lambda: [DraftModelProposer(draft)], "draft", [2, 4, "auto"]),
        "draft-target, the draft on the other backend": (t, lambda: [DraftModelProposer(other)], "draft", [3]),
        "n-gram": (t, lambda: [NGramProposer(4, 2)], "ngram", [4, "auto"]),
        "suffix tree": (t, lambda: [SuffixProposer(SuffixConfig(), trees=True)], "suffix", [8, "auto"]),
        "suffix chain": (t, lambda: [SuffixProposer(SuffixConfig(), trees=False)], "suffix", [8]),
        "EAGLE chain": (t, lambda: [EagleProposer(t, module)], "eagle", [1, 3, "auto"]),
        "EAGLE tree": (t, lambda: [EagleProposer(t, module, TREE)], "eagle", [len(json.loads(TREE))]),
        "Medusa chain": (medusa, lambda: [MedusaProposer(medusa)], "medusa", [2]),
        "Medusa tree": (medusa, lambda: [MedusaProposer(medusa, TREE)], "medusa", [len(json.loads(TREE))]),
    }


@pytest.mark.parametrize("batch", [1, 3])
def test_every_method_gives_the_onnxruntime_engines_output(pair, batch):
    """Greedy: each method's output on the torch engines is the onnxruntime engines' and the torch target's own target-only output."""
    ex, prompts = pair["ex"], PROMPTS[:batch] if batch == 1 else PROMPTS
    for target_name in ("eagle", "medusa", "int4"):
        want = {b: generate(ex[target_name][b], [], "none", 0, prompts)[0] for b in BACKENDS}
        assert want["torch"] == want["onnxruntime"], target_name
    want = {name: generate(ex[name]["torch"], [], "none", 0, prompts)[0] for name in ("eagle", "medusa")}
    drafted = {}
    for name, (target, make, method, lengths) in methods(ex, "torch").items():
        reference = want["medusa" if method == "medusa" else "eagle"]
        for k in lengths:
            got, stats = generate(target, make(), method, k, prompts)
            assert got == reference, f"{name} k={k}, batch {batch}"
            drafted[name] = drafted.get(name, 0) + stats.drafted
    assert all(drafted.values()), drafted


def test_int4_speculation_is_exact_and_close_to_the_onnxruntime_int4_engine(pair):
    ex = pair["ex"]
    t = ex["int4"]["torch"]
    want, _ = generate(t, [], "none", 0, PROMPTS)
    for make, method, k in ((lambda: [DraftModelProposer(ex["draft"]["torch"])], "draft", 4), (lambda: [NGramProposer(4, 2)], "ngram", 4)):
        got, stats = generate(t, make(), method, k, PROMPTS)
        assert got == want and stats.drafted > 0, method
    ort, _ = generate(ex["int4"]["onnxruntime"], [], "none", 0, PROMPTS)
    assert want == ort  # the same codes and scales, dequantized in float32 by both


def test_the_triton_kernels_give_the_references_outputs(pair):
    """The GPU path's ops (ops.TritonOps) under Triton's interpreter, on the same engines: the logits of every call."""
    pytest.importorskip("triton")
    # (the interpreter runs one program at a time: the 2-layer Medusa target through every kind of call, the int4 one through two)
    for name, calls in (("medusa", CALLS), ("int4", CALLS[1:2])):
        engine = pair["ex"][name]["torch"].engine
        triton_ex = TorchExecutor(engine, "cpu", kernels="triton", warm_up=False)
        got, got_len = run_calls(triton_ex, calls)
        want, want_len = run_calls(pair["ex"][name]["torch"], calls)
        assert got_len.tolist() == want_len.tolist()
        for i, (a, b) in enumerate(zip(got, want, strict=True)):
            for field in a:
                close(a[field], b[field], f"{name} call {i} {field}")


def test_split_layers_summed_in_the_next_norm_give_the_bits_of_their_own_sum(pair, monkeypatch):
    """With every layer's reduction split (tile_for patched: the tiny engines' layers are too narrow to split), "stable"
    leaves o_proj's and down_proj's sums to the next add_rmsnorm, "unfused" runs them as kernels of their own: the
    same bits in every output of every call, the EAGLE target's features over its aux layers (layers 0 and 2) too."""
    pytest.importorskip("triton")
    from specdec.runtime.backends.torch.kernels import gemm, norm

    monkeypatch.setattr(gemm, "tile_for", lambda N, K, bits=0: gemm._split(gemm.Tile(16, 32, 16), 2, K))
    fused = []
    add_rmsnorm = norm.add_rmsnorm
    monkeypatch.setattr(norm, "add_rmsnorm", lambda x, delta, *a: fused.append(isinstance(delta, gemm.Partials)) or add_rmsnorm(x, delta, *a))
    for name, calls in (("eagle", CALLS[1:2]), ("int4", CALLS[1:2])):
        engine = pair["ex"][name]["torch"].engine
        outs = {}
        for dense in ("stable", "unfused"):
            fused.clear()
            outs[dense], _ = run_calls(TorchExecutor(engine, "cpu", kernels="triton", dense=dense, warm_up=False), calls)
            layers = engine.config.model.num_layers
            # every o_proj, and every down_proj but the last layer's: an aux layer's output is the residual its next norm makes
            assert sum(fused) == (2 * layers - 1 if dense == "stable" else 0), (name, dense)
        for a, b in zip(outs["stable"], outs["unfused"], strict=True):
            for field in a:
                assert np.array_equal(a[field], b[field]), (name, field)


def test_open_executor_runs_a_torch_engine_on_the_cpu(pair):
    ex = open_executor(pair["ex"]["draft"]["torch"].engine, Placement("cpu"))
    assert type(ex).__name__ == "TorchExecutor" and ex.device == "cpu"


def test_refusals_say_why_in_one_line(pair, tmp_path, monkeypatch):
    d = pair["dir"]
    build_engine(d / "draft", tmp_path / "bf16", spec_build(0, backend="torch", dtype="bfloat16"), say=lambda _: None)
    with pytest.raises(EngineError, match="on a CPU the torch backend runs float32 engines only"):
        TorchExecutor(load_engine_dir(tmp_path / "bf16"), "cpu")
    ort_engine = pair["ex"]["draft"]["onnxruntime"].engine
    with pytest.raises(EngineError, match="is a onnxruntime engine; the torch executor runs engines built with --backend torch"):
        TorchExecutor(ort_engine, "cpu")
    t = pair["ex"]["draft"]["torch"]
    with pytest.raises(RequestError, match="not made by the torch executor"):
        t.forward(pair["ex"]["draft"]["onnxruntime"].new_cache(1), [[1]], all_logits=False)
    with pytest.raises(EngineError, match="takes no hidden_states input"):
        t.forward(t.new_cache(1), [[1]], all_logits=False, extra_inputs={"hidden_states": np.zeros((1, 1, t.model.hidden_size), np.float32)})
    with pytest.raises(EngineError, match=r"takes an extra input hidden_states \[1, 1, 64\] on every call"):
        pair["ex"]["module"]["torch"].forward(pair["ex"]["module"]["torch"].new_cache(1), [[1]], all_logits=False)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(EngineError, match="Triton kernels on a CPU run only under its interpreter"):
        TorchExecutor(t.engine, "cpu", kernels="triton")
    import torch

    if not torch.cuda.is_available():
        with pytest.raises(DeviceError, match="sees no CUDA GPU"):
            TorchExecutor(t.engine, "cuda:0")


def test_a_torch_engine_on_a_host_without_torch_is_refused_in_one_line(pair):
    code = (
        "import sys; sys.modules['torch'] = None\n"  # import torch then fails, as on a host without it
        "from specdec.runtime import load_engine\n"
        "from specdec.formats.errors import EngineError\n"
        "try:\n"
        f"    load_engine({str(pair['ex']['draft']['torch'].engine.path)!r}, device='cpu')\n"
        "except EngineError as err:\n"
        "    print(err)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "needs torch, which is not installed" in out.stdout and len(out.stdout.strip().splitlines()) == 1


def test_auto_starts_from_step_costs_measured_on_the_executor(pair):
    """Engine.measure_step_costs times every (batch size, width) on the engine's own cache before any request and gives
    draft_len=auto those lines; the cache is empty again, and auto's output is still target-only's."""
    t, draft = pair["ex"]["eagle"]["torch"], pair["ex"]["draft"]["torch"]
    engine = Engine(t, [DraftModelProposer(draft)], SpeculationConfig("draft", "auto"))
    costs = engine.measure_step_costs()
    assert sorted({rows for rows, _ in costs}) == [1, 2, 4] and sorted({w for _, w in costs}) == list(range(1, 10))
    assert engine.cache.lengths.tolist() == [0, 0, 0, 0]
    assert all(engine.auto.verify[rows].measured for rows in (1, 2, 4)) and not engine.auto.verify[3].measured
    one_row = [costs[(1, w)] for w in range(1, 10)]
    assert min(one_row) * 0.5 <= engine.auto.verify_cost(1, 5) <= max(one_row) * 2  # priced from the measured line, in seconds
    # the draft's one-token steps at the batch sizes its cache holds, and its catch-up feeds, from before the first round
    slots = engine.proposers["draft"].cache.num_slots
    assert sorted(rows for method, rows in engine.auto.draft_s if method == "draft") == [b for b in (1, 2, 4) if b <= slots]
    assert all(0 < engine.auto.draft_s[("draft", rows)] < 1 for rows in (1,))
    assert engine.auto.catch_up_s["draft"].measured and engine.auto.catch_up_cost("draft", 32) > 0
    assert engine.proposers["draft"].cache.lengths.tolist() == [0] * slots and "the draft's steps and catch-ups" in engine.step_costs_note
    ids = [engine.add_request(p, GenerationConfig(max_output_len=20)) for p in PROMPTS]
    done = run_until_done(engine)
    assert [done[i].output_ids for i in ids] == generate(t, [], "none", 0, PROMPTS)[0]
    with pytest.raises(RequestError, match="before adding requests"):
        engine.add_request(PROMPTS[0], GenerationConfig(max_output_len=2))
        engine.measure_step_costs()
    fresh = Engine(t, [], SpeculationConfig("none", 0))
    with pytest.raises(RequestError, match="leaves no room for a context"):  # a width the engine's length cannot hold
        fresh.measure_step_costs(widths=[t.build.max_seq_len])


def test_prefix_caching_on_the_torch_executor_gives_the_cold_output(pair):
    """new_prefix_pool and copy_prefix (runtime/prefix_cache.py): later prompts sharing a 32-token system prompt hit the
    earlier ones' rows and decode what they decode cold, for target-only, draft-target, EAGLE and Medusa."""
    from specdec.runtime.prefix_cache import PrefixCacheConfig

    ex = {name: pair["ex"][name]["torch"] for name in ("eagle", "medusa", "draft", "module")}
    rng = np.random.default_rng(3)
    system = rng.integers(4, 96, 32).tolist()
    plan = [[system + [5, 6, 7]], [system + rng.integers(4, 96, n).tolist() for n in (3, 9, 2)]]
    t = ex["eagle"]
    pool = t.new_prefix_pool(3)
    cache = t.new_cache(2)
    t.forward(cache, [system[:30], system[:20]], all_logits=False)
    t.copy_prefix(cache, 0, pool, 2, 25)
    t.copy_prefix(pool, 2, cache, 1, 12)
    assert pool.lengths[2] == 25 and cache.lengths[1] == 12
    assert torch_equal(pool.kv[:, :, 2, :, :25], cache.kv[:, :, 0, :, :25]) and torch_equal(cache.kv[:, :, 1, :, :12], cache.kv[:, :, 0, :, :12])
    cases = {"none": (t, []), "draft": (t, [DraftModelProposer(ex["draft"])]), "eagle": (t, [EagleProposer(t, ex["module"])]),
             "medusa": (ex["medusa"], [MedusaProposer(ex["medusa"])])}
    for method, (target, proposers) in cases.items():
        outs = {}
        for on in (True, False):
            engine = Engine(target, proposers, SpeculationConfig(method, 3 if method != "none" else 0), prefix_caching=PrefixCacheConfig(enabled=on))
            got = []
            for batch in plan:
                ids = [engine.add_request(p, GenerationConfig(max_output_len=16)) for p in batch]
                done = run_until_done(engine)
                got.append([done[i] for i in ids])
            outs[on] = got
        assert [[o.output_ids for o in b] for b in outs[True]] == [[o.output_ids for o in b] for b in outs[False]], method
        assert all(o.metrics.cached_tokens >= len(system) for o in outs[True][1]), method


def torch_equal(a, b) -> bool:
    import torch

    return bool(torch.equal(a, b))


@pytest.mark.parametrize("backend", ["torch", "onnxruntime"])
def test_clear_slot_zeroes_one_slot_and_its_length(pair, backend):
    """clear_slot (after a request ended on non-finite logits, runtime/scheduler.py): that slot's K/V all zero, its
    length 0; the neighbour's rows untouched."""
    t = pair["ex"]["draft"][backend]
    cache = t.new_cache(2)
    t.forward(cache, [[5, 6, 7, 8], [9, 10, 11]], all_logits=False)
    slabs = (lambda: [cache.kv.cpu().numpy()[:, :, s] for s in (0, 1)]) if backend == "torch" else \
        (lambda: [np.stack([b[s] for b in (*cache.keys, *cache.values)]) for s in (0, 1)])
    before = slabs()
    assert np.abs(before[0]).sum() > 0
    t.clear_slot(cache, 0)
    after = slabs()
    assert cache.lengths.tolist() == [0, 3] and not after[0].any() and np.array_equal(after[1], before[1])


def test_a_cache_that_cannot_be_allocated_is_one_line_and_the_prefix_cache_steps_aside(pair):
    """Found in review: the torch executor's allocation failures escaped as torch's own exception. A cache is refused in
    one EngineError with its size; a prefix pool that does not fit turns prefix caching off (said once) unless it was
    asked for."""
    from specdec.formats.errors import EngineError
    from specdec.runtime.prefix_cache import PrefixCacheConfig, open_prefix_cache

    t = pair["ex"]["draft"]["torch"]
    with pytest.raises(EngineError, match=r"cannot be allocated on cpu: lower max_seq_len") as err:
        t.new_prefix_pool(10**9)
    assert "\n" not in str(err.value)
    cache = t.new_cache(1)
    pool, why = open_prefix_cache(t, cache, PrefixCacheConfig(slots=10**9))
    assert pool is None and "cannot be allocated" in why
    with pytest.raises(EngineError):
        open_prefix_cache(t, cache, PrefixCacheConfig(enabled=True, slots=10**9))


def test_auto_on_a_host_without_a_gpu_says_where_a_torch_engine_runs(pair, tmp_path):
    """--device auto means a GPU for torch engines; with none, the error says --device cpu for a float32 engine, and to rebuild
    one of another dtype first (the CPU executor takes float32 only)."""
    import torch

    from specdec.formats.errors import DeviceError
    from specdec.runtime.devices import placement

    if torch.cuda.is_available():
        pytest.skip("a GPU host: auto finds one")
    with pytest.raises(DeviceError, match="a float32 torch engine runs on the CPU too: pass --device cpu"):
        placement([0], pair["ex"]["draft"]["torch"].engine, "target")
    draft = make_checkpoint(tmp_path / "ckpt", num_hidden_layers=1, hidden_size=32, intermediate_size=64, seed=0)
    build_engine(draft, tmp_path / "half", spec_build(0, backend="torch", dtype="float16"), say=lambda _: None)
    with pytest.raises(DeviceError, match="in float32 only: rebuild it with --dtype float32, then --device cpu"):
        placement([0], load_engine_dir(tmp_path / "half"), "target")
