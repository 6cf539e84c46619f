"""benchmarks/host.py: the machine record every CPU figure carries, and the bytes a step reads (its floor)."""

import importlib.util
import sys
from pathlib import Path

import onnx
import pytest
from onnx import numpy_helper

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
_spec = importlib.util.spec_from_file_location("host", ROOT / "benchmarks" / "host.py")
host = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(host)


def test_the_record_names_the_cpu_its_caches_and_isa():
    rec = host.host_record(bandwidth=False)
    assert rec["cpu_model"] and rec["cores"] >= 1
    assert rec["caches"] and all(c["bytes"] > 0 and c["level"] in (1, 2, 3, 4) for c in rec["caches"])
    assert set(rec["isa"]) <= set(host.ISA_FLAGS)
    assert len(rec["load_average"]) == 3
    assert rec["cpu_model"] in host.describe(rec)



def test_the_core_is_named_from_the_family_and_model_numbers():
    """A guest's model name is often just "AMD EPYC": the family and model numbers say which core (and kernels) it is."""
    assert host.core_name("AuthenticAMD", "25", "1") == "Zen 3"  # EPYC 7003 (Milan): AVX2, no AVX-512
    assert host.core_name("AuthenticAMD", "25", "17") == "Zen 4"  # EPYC 9004 (Genoa): AVX-512 VNNI
    assert host.core_name("GenuineIntel", "6", "143") == "Sapphire Rapids"
    assert host.core_name("AuthenticAMD", "6", "143") is None and host.core_name("GenuineIntel", None, "1") is None
    rec = {**host.host_record(bandwidth=False), "core": "Zen 3", "family_model": "family 25 model 1"}
    assert "(Zen 3, family 25 model 1)" in host.describe(rec)


def test_read_bandwidth_measures_every_thread_count():
    bw = host.read_bandwidth(threads=[1, 2], passes=3, buffer_bytes=16 << 20)
    assert bw["buffer_bytes"] == 16 << 20 and set(bw["by_threads"]) <= {1, 2} and 1 in bw["by_threads"]
    for v in bw["by_threads"].values():  # anything from a slow laptop to an HBM part, and the best pass is the best
        assert 0.1 < v["best_gb_s"] < 10_000 and v["median_gb_s"] <= v["best_gb_s"] + 1e-9
        assert 0.1 < v["cpu_best_gb_s"] < 10_000


def test_step_bytes_counts_every_weight_but_the_gathered_embedding(tmp_path):
    from checkpoints import make_checkpoint
    from conftest import cli_build

    ckpt = make_checkpoint(tmp_path / "ckpt", num_hidden_layers=1, hidden_size=64, intermediate_size=128, tie_word_embeddings=False)
    r = cli_build(ckpt, tmp_path / "e")
    assert r.exit_code == 0, r.output
    model = onnx.load(str(tmp_path / "e" / "model.onnx"))
    gathered = {n.input[0] for n in model.graph.node if n.op_type == "Gather"}
    sizes = {i.name: numpy_helper.to_array(i).nbytes for i in model.graph.initializer}
    embedding = [name for name in gathered if name in sizes and sizes[name] >= 64 * 100]  # [vocab, hidden]
    assert len(embedding) == 1
    assert host.step_bytes(tmp_path / "e") == pytest.approx(sum(sizes.values()) - sizes[embedding[0]], abs=0)
    assert host.step_bytes(tmp_path / "e") < (tmp_path / "e" / "model.onnx.data").stat().st_size


def test_stream_reader_samples_again_and_again_from_one_build():
    with host.StreamReader(buffer_bytes=16 << 20) as reader:
        if reader.exe is None:
            pytest.skip("no C compiler: the reader has nothing to run")
        first, second = reader.sample(1), reader.sample(1, passes=1)
        for wall, cpu in (first, second):
            assert 0.1 < wall < 10_000 and 0.1 < cpu < 10_000
        exe = reader.exe
    assert not exe.exists()  # the build is gone with the reader
