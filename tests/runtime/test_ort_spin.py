"""$SPECDEC_ORT_SPIN: how ONNX Runtime's CPU worker threads wait (runtime/backends/onnxruntime/cpu.py: session_options)."""

import numpy as np
import pytest

from specdec.formats.engine_format import load_engine_dir
from specdec.formats.errors import EngineError
from specdec.runtime.backends.onnxruntime.cpu import SPIN_POLICIES, OrtExecutor, session_options


def test_each_policy_sets_its_session_entries(monkeypatch):
    for policy, entries in SPIN_POLICIES.items():
        monkeypatch.setenv("SPECDEC_ORT_SPIN", policy)
        opts = session_options(2)
        assert all(opts.get_session_config_entry(key) == value for key, value in entries.items())
    monkeypatch.delenv("SPECDEC_ORT_SPIN")
    assert session_options(2).get_session_config_entry("session.force_spinning_stop") == "1"  # the default: stop


def test_every_policy_computes_the_same_logits_and_a_bad_one_is_one_line(monkeypatch, llama_engine):
    logits = []
    for policy in SPIN_POLICIES:
        monkeypatch.setenv("SPECDEC_ORT_SPIN", policy)
        ex = OrtExecutor(load_engine_dir(llama_engine), num_threads=2)
        cache = ex.new_cache(1)
        logits.append(ex.forward(cache, [[5, 6, 7, 8]], all_logits=True).logits.copy())
    assert all(np.array_equal(logits[0], x) for x in logits[1:])
    monkeypatch.setenv("SPECDEC_ORT_SPIN", "sometimes")
    with pytest.raises(EngineError, match=r"SPECDEC_ORT_SPIN='sometimes': expected one of stop, on, off\."):
        OrtExecutor(load_engine_dir(llama_engine), num_threads=2)
