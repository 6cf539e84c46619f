"""The tensorrt backend.

CPU tests check what is decidable without a GPU: the optimization profiles,
the static-capacity network TensorRT parses (run here by ONNX Runtime), the
profile-choice, row-compaction and memory rules (host compatibility: tests/runtime/test_trt_host.py), and the
clear refusals on a host without TensorRT. Tests marked ``gpu`` build real
TensorRT engines and are skipped (with a reason) where ``import tensorrt``
fails; nothing here stands in for TensorRT.
"""

import importlib
import importlib.util
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import pytest
from checkpoints import make_checkpoint
from conftest import spec_build

from specdec.builder.backends.tensorrt import build_tensorrt_engine, generation_width, profile_shapes, static_kv_onnx, tensorrt_available
from specdec.builder.build import build_engine
from specdec.formats.engine_format import EngineDir, ModelConfig, load_engine_dir
from specdec.formats.errors import BuildConfigError, DeviceError, EngineError, RequestError
from specdec.formats.kv_layout import kv_cache_bytes
from specdec.formats.tensorrt_plan import ENGINE_FILE, GENERATION_PROFILE
from specdec.runtime.backends.onnxruntime.cpu import OrtExecutor
from specdec.runtime.backends.tensorrt.executor import TrtExecutor, check_memory, choose_profile

HAS_TRT = importlib.util.find_spec("tensorrt") is not None
MODEL = ModelConfig(
    architecture="LlamaForCausalLM", vocab_size=96, hidden_size=64, intermediate_size=128, num_layers=3, num_heads=4,
    num_kv_heads=2, head_dim=16, rms_norm_eps=1e-6, rope_theta=10000.0, rope_scaling=None, max_position_embeddings=256,
    tie_word_embeddings=True, qkv_bias=False, qk_norm=False,
)


# -- optimization profiles -----------------------------------------------------------
def test_profile_shapes_target():
    ctx, gen = profile_shapes(spec_build(4), MODEL)  # batch 4, input 48, seq 96, draft 4 -> capacity 101
    assert ctx["input_ids"] == ctx["position_ids"] == ((1, 1), (4, 24), (4, 48))
    assert ctx["logits_index"] == ((1, 1), (4, 1), (4, 48))
    assert gen["input_ids"] == gen["position_ids"] == gen["logits_index"] == ((1, 1), (4, 5), (4, 5))
    for p in (ctx, gen):
        assert len(p) == 3 + 2 * MODEL.num_layers
        assert p["past_value.2"] == ((1, 2, 101, 16), (4, 2, 101, 16), (4, 2, 101, 16))


def test_profile_shapes_draft_engine_takes_two_tokens():
    build = spec_build(0, max_batch_size=1, max_input_len=10, max_seq_len=20)
    assert generation_width(build) == 2  # the draft's catch-up step feeds 2 pending tokens
    ctx, gen = profile_shapes(build, MODEL)
    assert gen["input_ids"] == ((1, 1), (1, 1), (1, 2))
    assert ctx["input_ids"] == ((1, 1), (1, 5), (1, 10))
    assert gen["past_key.0"] == ((1, 2, 21, 16),) * 3


@pytest.mark.parametrize("kw", [dict(max_draft_len=0), dict(max_draft_len=8), dict(max_batch_size=1, max_input_len=1, max_seq_len=2)])
def test_profile_shapes_are_ordered_and_consistent(kw):
    for p in profile_shapes(spec_build(**kw), MODEL):
        for lo, opt, hi in p.values():
            assert all(1 <= a <= b <= c for a, b, c in zip(lo, opt, hi, strict=True))
        assert len({opt[0] for _, opt, _ in p.values()}) == 1  # one batch size at opt across inputs


@pytest.fixture(scope="module")
def onnx_engine(tmp_path_factory) -> EngineDir:
    d = tmp_path_factory.mktemp("trt_cpu")
    ckpt = make_checkpoint(d / "ckpt", "LlamaForCausalLM", tie_word_embeddings=True)
    build_engine(ckpt, d / "engine", spec_build(4, lowering="portable"), say=lambda _: None)
    return load_engine_dir(d / "engine")


def test_profiles_cover_exactly_the_network_inputs(onnx_engine):
    graph = onnx.load(str(onnx_engine.network_path), load_external_data=False).graph
    names = {i.name for i in graph.input}
    for p in profile_shapes(onnx_engine.config.build, onnx_engine.config.model):
        assert set(p) == names


def test_static_kv_network_computes_the_same(onnx_engine):
    """The proto TensorRT parses (static cache axis) is the ONNX Runtime network, unchanged in value."""
    import onnxruntime as ort

    build, model = onnx_engine.config.build, onnx_engine.config.model
    data = static_kv_onnx(onnx_engine.network_path, build.kv_capacity)
    proto = onnx.load_from_string(data)
    for v in [*proto.graph.input, *proto.graph.output]:
        dims = [d.dim_value or d.dim_param for d in v.type.tensor_type.shape.dim]
        if v.name.startswith(("past_", "present_")):
            assert dims == ["batch", model.num_kv_heads, build.kv_capacity, model.head_dim]
        elif v.name == "input_ids":
            assert dims == ["batch", "num_tokens"]
    opts = ort.SessionOptions()
    opts.add_session_config_entry("session.model_external_initializers_file_folder_path", str(onnx_engine.path))
    patched = ort.InferenceSession(data, opts, providers=["CPUExecutionProvider"])
    plain = ort.InferenceSession(str(onnx_engine.network_path), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    feeds = {"input_ids": rng.integers(3, 96, (2, 7)), "position_ids": np.tile(np.arange(7), (2, 1)), "logits_index": np.array([[6], [3]])}
    shape = (2, model.num_kv_heads, build.kv_capacity, model.head_dim)
    feeds.update({i.name: np.zeros(shape, np.float32) for i in plain.get_inputs() if i.name.startswith("past_")})
    np.testing.assert_array_equal(patched.run(["logits"], feeds)[0], plain.run(["logits"], feeds)[0])


# -- rules the executor applies --------------------------------------------------------
def test_choose_profile():
    assert choose_profile(1, 1, gen_max=5, ctx_max=48) == GENERATION_PROFILE
    assert choose_profile(5, 5, gen_max=5, ctx_max=48) == GENERATION_PROFILE
    assert choose_profile(6, 1, gen_max=5, ctx_max=48) == 0
    assert choose_profile(3, 1, gen_max=2, ctx_max=3) == 0
    with pytest.raises(RequestError, match="max_input_len=3"):
        choose_profile(4, 4, gen_max=2, ctx_max=3)


def test_check_memory_reports_mib(onnx_engine):
    kv = kv_cache_bytes(onnx_engine.config.model, onnx_engine.config.build.max_batch_size, onnx_engine.config.build.kv_capacity)
    assert kv == 2 * 2 * 4 * 2 * 101 * 16 * 4  # K+V x layers x batch x kv_heads x capacity x head_dim x fp32
    check_memory([onnx_engine], [0], free={0: kv})
    check_memory([onnx_engine, onnx_engine], [0, 1], free={0: kv, 1: kv})  # one engine per GPU fits
    with pytest.raises(DeviceError,
                       match=r"GPU 1 has 0.2 MiB free but the engines placed on it need 0.4 MiB .*KV cache 0.2 MiB \(max_batch_size=4 x "
                             r"kv_capacity=101\) \+ plan 0.0 MiB"):
        check_memory([onnx_engine, onnx_engine], [1, 1], free={1: kv})


# -- a host without TensorRT gets told what to install ----------------------------------
@pytest.mark.skipif(HAS_TRT, reason="this host has the tensorrt module")
def test_tensorrt_unavailable_names_the_extra(onnx_engine, tmp_path):
    ok, why = tensorrt_available()
    assert not ok and "`tensorrt` Python module" in why and 'pip install "specdec[tensorrt]"' in why
    with pytest.raises(BuildConfigError, match=r"specdec\[tensorrt\]"):
        build_tensorrt_engine(onnx_engine.network_path, tmp_path, onnx_engine.config.build, onnx_engine.config.model, None, False)
    assert not (tmp_path / ENGINE_FILE).exists()
    with pytest.raises(EngineError, match="records no TensorRT build metadata"):  # an ONNX Runtime engine is not a plan
        TrtExecutor(onnx_engine)


def test_tensorrt_says_plainly_it_never_ran(monkeypatch):
    """Its modules' docstrings, the refusal on a host without TensorRT, auto's note and the warning of a build that uses
    it all say that this backend has never built or run an engine on a GPU here."""
    import specdec.builder.backends.tensorrt as trt_builder
    import specdec.runtime.backends.tensorrt as trt_runtime
    from specdec.builder.backends import resolve_backend
    from specdec.hardware import tensorrt as host
    from specdec.runtime.backends.tensorrt import executor

    assert all("never" in m.__doc__.lower() for m in (trt_builder, trt_runtime, executor, host))
    monkeypatch.setattr(trt_builder, "tensorrt_available", lambda: (False, "no tensorrt module."))
    with pytest.raises(BuildConfigError, match=r"no tensorrt module\. The tensorrt backend has never built or run an engine on a GPU here"):
        resolve_backend("tensorrt")
    monkeypatch.setattr(trt_builder, "tensorrt_available", lambda: (True, ""))
    said: list[str] = []
    assert resolve_backend("tensorrt", said.append) == "tensorrt" and resolve_backend("auto", said.append) == "onnxruntime"
    assert said[0].startswith("warning: the tensorrt backend has never built or run an engine on a GPU here") and "untested" in said[0]
    assert said[1] == "backend: auto -> onnxruntime (TensorRT can build here: pass --backend tensorrt to use it (never built or run on a GPU here))"


# TensorRT's builder API as builder/backends/tensorrt.py and trt_onnx.py (the parsing and profiles it shares with the
# tensorrt_rtx backend) call it: source name -> API kind -> the module's class
BUILDER_ROOTS = {"trt": "module", "builder": "Builder", "network": "INetworkDefinition", "network.get_input()": "ITensor",
                 "parser": "OnnxParser", "e": "ParserError", "config": "IBuilderConfig", "profile": "IOptimizationProfile",
                 "config.get_timing_cache()": "ITimingCache"}


@pytest.mark.parametrize("module", ["tensorrt", "tensorrt_rtx"])
def test_builder_calls_exist_in_a_real_tensorrt_builder_api(module):
    """Every TensorRT name the tensorrt backend's build calls exists in a real TensorRT builder module.

    The full ``tensorrt`` builder does not install on these GPU-less hosts (it is checked where it does). NVIDIA's
    TensorRT for RTX builder, ``tensorrt_rtx``, installs anywhere (``pip install tensorrt-rtx-cu13``, which the
    tensorrt_rtx backend's build extra brings): it is a TensorRT builder API of its own release line with the same
    class, method and flag names. With 1.7.1 every name called here exists in it, none differs. trt_onnx.py's calls
    also run for real in tests/builder/test_tensorrt_rtx.py's builds; tensorrt.py's own (the builder flags, the timing
    cache, the version-compatible plugins) are checked by name only: that a call with these names builds a working
    plan on a GPU is what the gpu tests below would show."""
    from api_names import resolve, used_attributes

    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} is not installed" + (" (it needs a GPU host)" if module == "tensorrt" else " (pip install tensorrt-rtx-cu13)"))
    trt = importlib.import_module(module)
    backends = Path(__file__).resolve().parents[2] / "builder" / "backends"
    found = [used_attributes(backends / name, BUILDER_ROOTS) for name in ("tensorrt.py", "trt_onnx.py")]
    used = {kind: found[0][kind] | found[1][kind] for kind in found[0]}
    assert {("build_serialized_network",), ("create_network",)} <= used["Builder"] and ("parse",) in used["OnnxParser"]  # the walker sees the calls
    assert ("BuilderFlag", "VERSION_COMPATIBLE") in used["module"] and ("serialize",) in used["ITimingCache"]
    missing = []
    for kind, chains in used.items():
        cls = trt if kind == "module" else getattr(trt, kind)
        for chain in chains:
            call = next((i for i, name in enumerate(chain) if name.endswith("()")), None)
            if call is not None:  # a call's result: checked under the root that names that call (BUILDER_ROOTS)
                root = next(r for r, k in BUILDER_ROOTS.items() if k == kind)
                assert f"{root}.{'.'.join(chain[: call + 1])}" in BUILDER_ROOTS, f"{root}.{'.'.join(chain)}: name its result's class"
                continue
            if not resolve(cls, chain):
                missing.append(f"{kind}.{'.'.join(chain)}")
    assert not missing, f"{module} {trt.__version__} lacks {sorted(missing)}"


# -- GPU: real TensorRT engines ----------------------------------------------------------
def make_trt_engine(ckpt: Path, out: Path, build) -> EngineDir:
    """The ONNX engine (for the ONNX Runtime reference) and the TensorRT engine, from one checkpoint."""
    build_engine(ckpt, out.with_name(out.name + "-onnx"), build, say=lambda _: None)
    build_engine(ckpt, out, replace(build, backend="tensorrt"), say=lambda _: None, trt_timing_cache=out.parent / "timing.cache")
    return load_engine_dir(out)


@pytest.fixture(scope="module")
def gpu_pair(tmp_path_factory):
    d = tmp_path_factory.mktemp("trt_gpu")
    target = make_checkpoint(d / "target", num_hidden_layers=2, seed=0)
    draft = make_checkpoint(d / "draft", num_hidden_layers=1, hidden_size=32, intermediate_size=64, seed=0)
    t, dr = make_trt_engine(target, d / "t", spec_build(4, lowering="portable")), make_trt_engine(draft, d / "d", spec_build(0, lowering="portable"))
    return {"trt_target": TrtExecutor(t), "trt_draft": TrtExecutor(dr), "ort_target": OrtExecutor(load_engine_dir(d / "t-onnx"), num_threads=1),
            "ort_draft": OrtExecutor(load_engine_dir(d / "d-onnx"), num_threads=1), "target_dir": t}


@pytest.mark.gpu
def test_trt_logits_match_onnxruntime(gpu_pair):
    trt, ort = gpu_pair["trt_target"], gpu_pair["ort_target"]
    rng = np.random.default_rng(0)
    prompts = [rng.integers(3, 96, n).tolist() for n in (5, 11, 8)]
    steps = [rng.integers(3, 96, n).tolist() for n in (3, 1, 5)]
    tc, oc = trt.new_cache(3), ort.new_cache(3)
    for tokens, all_logits in ((prompts, False), (steps, True), ([[7], [8, 9], [10]], True)):
        np.testing.assert_allclose(trt.forward(tc, tokens, all_logits).logits.copy(), ort.forward(oc, tokens, all_logits).logits, atol=1e-3, rtol=0)
    for ex, cache in ((trt, tc), (ort, oc)):  # reject drafts, then slot 1's request leaves: slot 2 moves into it
        cache.rollback(0, int(cache.lengths[0]) - 2)
        ex.copy_slot(cache, 2, 1)
    np.testing.assert_allclose(trt.forward(tc, [[30, 31], [32]], True).logits.copy(), ort.forward(oc, [[30, 31], [32]], True).logits, atol=1e-3,
                               rtol=0)
    np.testing.assert_array_equal(tc.lengths, oc.lengths)


@pytest.mark.gpu
def test_trt_superseded_cache_is_refused(gpu_pair):
    ex = gpu_pair["trt_target"]
    old = ex.new_cache(1)
    ex.new_cache(1)
    with pytest.raises(RequestError, match="supersedes"):
        ex.forward(old, [[1, 2, 3]], all_logits=False)


@pytest.mark.gpu
def test_trt_check_memory_on_the_gpu(gpu_pair):
    check_memory([gpu_pair["target_dir"]], [0])  # cudaMemGetInfo: a tiny engine fits


@pytest.mark.gpu
@pytest.mark.parametrize("draft_len", [1, 4])
def test_trt_draft_target_greedy_equals_target_only(gpu_pair, draft_len):
    from specdec.runtime.orchestrator import GenerationConfig, Orchestrator
    from specdec.runtime.proposers.draft_model import DraftModelProposer

    prompts = [[5, 6, 7, 8, 9, 10], [11, 12, 13], [20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30]]
    cfg = GenerationConfig(max_output_len=32)
    base, _ = Orchestrator(gpu_pair["trt_target"]).generate(prompts, cfg)
    proposer = DraftModelProposer(gpu_pair["trt_draft"])
    spec, m = Orchestrator(gpu_pair["trt_target"], proposer, draft_len).generate(prompts, cfg)
    assert [o.output_ids for o in spec] == [o.output_ids for o in base]
    assert m.drafted > 0
    ort, _ = Orchestrator(gpu_pair["ort_target"]).generate(prompts, cfg)  # and the same tokens as ONNX Runtime
    assert [o.output_ids for o in base] == [o.output_ids for o in ort]


@pytest.mark.gpu
@pytest.mark.parametrize(("runtime", "exclude_lean"), [("tensorrt_dispatch", False), ("tensorrt_lean", False), ("tensorrt_lean", True)])
def test_version_compatible_plan_runs_on_the_small_runtimes(tmp_path, runtime, exclude_lean):
    """What a shipped host runs: a --trt_version_compatible plan under tensorrt-dispatch / tensorrt-lean."""
    if importlib.util.find_spec(runtime) is None:
        pytest.skip(f"{runtime} is not installed (pip install -e '.[{runtime.replace('_', '-')}]')")
    import tensorrt

    if runtime == "tensorrt_lean" and importlib.import_module(runtime).__version__ != tensorrt.__version__:
        pytest.skip("the lean runtime runs only plans of its own version; install tensorrt-lean of the same version as tensorrt")
    ckpt = make_checkpoint(tmp_path / "ckpt", num_hidden_layers=2, seed=1)
    build = spec_build(4, lowering="portable")
    build_engine(ckpt, tmp_path / "onnx", build, say=lambda _: None)
    build_engine(ckpt, tmp_path / "vc", replace(build, backend="tensorrt"), say=lambda _: None,
                 trt_version_compatible=True, trt_exclude_lean_runtime=exclude_lean)
    engine = load_engine_dir(tmp_path / "vc")
    assert engine.config.extra["tensorrt"]["version_compatible"] and engine.config.extra["tensorrt"]["exclude_lean_runtime"] == exclude_lean
    # In a child process that never imports the full tensorrt, as on a shipped host.
    script = (
        "import sys, numpy as np\n"
        "from specdec.formats.engine_format import load_engine_dir\nfrom specdec.runtime.backends.tensorrt.executor import TrtExecutor\n"
        f"ex = TrtExecutor(load_engine_dir({str(tmp_path / 'vc')!r}))\nassert ex._trt.__name__ == {runtime!r}, ex._trt.__name__\n"
        "assert 'tensorrt' not in sys.modules\nc = ex.new_cache(2)\n"
        "a = ex.forward(c, [[5, 6, 7, 8], [9, 10]], False).logits.copy()\nb = ex.forward(c, [[11, 12, 13], [14]], True).logits.copy()\n"
        f"np.save({str(tmp_path / 'a.npy')!r}, a)\nnp.save({str(tmp_path / 'b.npy')!r}, b)\n"
    )
    env = {**os.environ, "SPECDEC_TENSORRT_RUNTIME": runtime}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    ort = OrtExecutor(load_engine_dir(tmp_path / "onnx"), num_threads=1)
    oc = ort.new_cache(2)
    np.testing.assert_allclose(np.load(tmp_path / "a.npy"), ort.forward(oc, [[5, 6, 7, 8], [9, 10]], False).logits, atol=1e-3, rtol=0)
    np.testing.assert_allclose(np.load(tmp_path / "b.npy"), ort.forward(oc, [[11, 12, 13], [14]], True).logits, atol=1e-3, rtol=0)
