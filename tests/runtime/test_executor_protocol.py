"""Every registered executor implements the whole Executor protocol (runtime/backends/base.py): each method the loop
and the proposers call, with the protocol's parameters, and each attribute. The CUDA and TensorRT executors cannot
run here, so their classes are read, not opened; the CPU executor is also opened and checked at run time."""

from __future__ import annotations

import ast
import importlib
import inspect
import textwrap
import typing

import numpy as np
import pytest

from specdec.formats.engine_format import BuildConfig, ModelConfig, extra_io
from specdec.formats.errors import EngineError
from specdec.runtime.backends import _REGISTRY
from specdec.runtime.backends.base import Backend, Executor, StepOutput, compact_chain
from specdec.runtime.kv_cache import KVCache

PROTOCOL_METHODS = sorted(n for n, v in vars(Executor).items() if inspect.isfunction(v) and not n.startswith("_"))
PROTOCOL_ATTRIBUTES = sorted(typing.get_type_hints(Executor))


def executor_class(module) -> type:
    """The class a backend module's make_executor returns (its return annotation, resolved in the module)."""
    return typing.get_type_hints(module.make_executor)["return"]


def assigned_attributes(cls: type) -> set[str]:
    """Attributes a class sets: in its body, or ``self.x = ...`` (also ``self.a, self.b = ...``) in its methods."""
    names = {n for n in vars(cls) if not n.startswith("__")} | set(getattr(cls, "__annotations__", {}))
    for node in ast.walk(ast.parse(textwrap.dedent(inspect.getsource(cls)))):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        for t in targets:
            for el in t.elts if isinstance(t, ast.Tuple) else [t]:
                if isinstance(el, ast.Attribute) and isinstance(el.value, ast.Name) and el.value.id == "self":
                    names.add(el.attr)
    return names


def parameters(fn) -> list[tuple[str, object, object]]:
    """(name, kind, default) of each parameter: what a caller relies on (annotations aside)."""
    return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]


@pytest.mark.parametrize("key", sorted(_REGISTRY), ids="-".join)
def test_every_registered_executor_implements_the_whole_protocol(key):
    module = importlib.import_module(_REGISTRY[key])  # a backend's runtime is imported lazily: any host imports these
    for name in ("make_executor", "device_count", "check_placement"):
        assert parameters(getattr(module, name)) == parameters(getattr(Backend, name))[1:], (key, name)  # [1:]: self
    cls = executor_class(module)
    for name in PROTOCOL_METHODS:
        assert callable(getattr(cls, name, None)), f"{cls.__name__} has no {name}()"
        assert parameters(getattr(cls, name)) == parameters(getattr(Executor, name)), f"{cls.__name__}.{name} differs from the protocol"
    missing = set(PROTOCOL_ATTRIBUTES) - assigned_attributes(cls)
    assert not missing, f"{cls.__name__} never sets {sorted(missing)}"


def test_the_protocol_has_every_call_the_loop_makes():
    """compact_slot (after a tree step) and forward(extra_inputs=) (an EAGLE module's hidden_states) are the protocol's,
    not one executor's."""
    assert {"new_cache", "forward", "copy_slot", "compact_slot"} <= set(PROTOCOL_METHODS)
    assert "extra_inputs" in inspect.signature(Executor.forward).parameters and "parents" in inspect.signature(Executor.forward).parameters
    assert {"tree_attention", "extra_outputs", "extra_inputs"} <= set(PROTOCOL_ATTRIBUTES)


def test_the_cpu_executor_is_an_executor_at_run_time(llama_engine):
    from specdec.formats.engine_format import load_engine_dir
    from specdec.runtime.backends.onnxruntime.cpu import OrtExecutor

    ex = OrtExecutor(load_engine_dir(llama_engine), num_threads=1)
    assert isinstance(ex, Executor)
    out = ex.forward(ex.new_cache(1), [[3, 4, 5]], all_logits=True)
    assert isinstance(out, StepOutput) and out.logits.shape == (1, 3, ex.vocab_size)
    assert dict(out.extras) == {} and ex.extra_outputs == frozenset() and ex.extra_inputs == frozenset()
    with pytest.raises(EngineError, match="no hidden_states input"):  # a plain engine refuses an EAGLE module's input
        ex.forward(ex.new_cache(1), [[3]], all_logits=False, extra_inputs={"hidden_states": np.zeros((1, 1, ex.model.hidden_size), np.float32)})



def test_the_cpu_executors_decode_calls_compute_what_plan_step_plans(llama_engine):
    """The CPU executor plans the calls a round and a draft model make (lists or an array of ids, every row advancing)
    in Python ints and writes its buffers through memoryviews; the same calls with ``advance`` set take plan_step. Both
    give the same logits and lengths, ragged rows and prompts wider than a decode step included, and refuse the same
    call with the same error."""
    from specdec.formats.engine_format import load_engine_dir
    from specdec.formats.errors import RequestError
    from specdec.runtime.backends.onnxruntime.cpu import OrtExecutor

    ex = OrtExecutor(load_engine_dir(llama_engine), num_threads=1)
    fast, planned = ex.new_cache(4), ex.new_cache(4)
    calls = [  # (tokens, all_logits, first_slot)
        ([[3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13], [14, 15]], False, 0),  # prompts wider than a decode step, ragged
        ([[16], [17]], True, 0),
        ([[18, 19, 20], [21]], True, 0),  # a ragged verification: row 1 zero-padded
        ([[22, 23], [24, 25]], False, 0),
        (np.array([[26], [27]], np.int64), False, 0),  # a draft model's later steps feed an array
        ([[28, 29, 30]], True, 2),  # a newcomer's prompt in its own slot
        ([[31], [32], [33]], True, 0),
        ([[34]], True, 3),  # one token in one row: target-only decoding, a draft model's steps
        ([[35]], False, 0),
    ]
    for tokens, all_logits, first in calls:
        planned_in_ints = ex._plain_forward(fast, tokens, all_logits, first)  # what forward() takes for these calls
        assert planned_in_ints is not None, tokens
        a = planned_in_ints.logits.copy()
        b = ex.forward(planned, tokens, all_logits=all_logits, first_slot=first, advance=np.ones(len(tokens), bool)).logits
        assert np.array_equal(a, b) and fast.lengths.tolist() == planned.lengths.tolist(), (tokens, all_logits, first)
    assert fast.lengths.tolist() == [20, 8, 4, 1]
    room = fast.max_seq_len - int(fast.lengths[0])
    for cache, advance in ((fast, None), (planned, np.ones(1, bool))):  # past max_seq_len: plan_step's error, lengths kept
        with pytest.raises(RequestError, match="more than"):
            ex.forward(cache, [[1] * (room + 1)], all_logits=True, advance=advance)
    assert fast.lengths.tolist() == planned.lengths.tolist() == [20, 8, 4, 1]

def test_every_extra_output_a_proposer_asks_for_is_declared_by_its_targets_mode():
    """engine_format.extra_io names what an executor binds and returns in StepOutput.extras; a target's own drafter asks
    for the target's outputs by those names (Proposer.target_outputs), and the EAGLE module's input and output are the
    ones declared for its mode. The other modes have none."""
    from specdec.runtime.proposers import eagle
    from specdec.runtime.proposers.own import OWN_DRAFTERS, own_drafter

    model = ModelConfig("LlamaForCausalLM", 96, 64, 128, 2, 4, 2, 16, 1e-5, 10000.0, None, 128, True, False, False)
    for mode in OWN_DRAFTERS:
        inputs, outputs = extra_io(model, BuildConfig(speculative_decoding_mode=mode, medusa_num_heads=3))
        assert inputs == () and set(own_drafter(mode).target_outputs) == {t.name for t in outputs}, mode
    inputs, outputs = extra_io(model, BuildConfig(speculative_decoding_mode="eagle_module"))
    assert ([t.name for t in inputs], [t.name for t in outputs]) == ([eagle.HIDDEN_IN], [eagle.HIDDEN_OUT])
    assert [t.per_token for t in inputs + outputs] == [True, False]  # hidden_states: every fed token; hidden_out: the logits rows
    for mode in ("none", "draft_tokens_external"):
        assert extra_io(model, BuildConfig(speculative_decoding_mode=mode)) == ((), ())


def test_a_chain_executor_compacts_a_chain_and_refuses_a_tree_path():
    """compact_slot on an executor without tree attention: a chain's kept tokens are a rollback; a tree path is refused."""
    cache = KVCache(1, 2, 1, 16, 4, 12, storage=False)
    cache.lengths[:] = [9, 4]
    compact_chain(cache, 0, 5, [0, 1, 2], "engine X")  # fed 4 tokens at 5, kept the first 3
    assert cache.lengths.tolist() == [8, 4]
    with pytest.raises(EngineError, match="verifies chains only"):
        compact_chain(cache, 1, 0, [0, 2], "engine X")
    assert cache.lengths.tolist() == [8, 4]
