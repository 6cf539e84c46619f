"""Q4Gemm's weights copied into 2 MiB pages (hardware/kernels/large_pages.c) where ONNX Runtime maps them from an engine's
weights file, as it does an engine's: the op then drops ONNX Runtime's pages of them (MADV_DONTNEED), and a node that reads
the same weights afterwards must still read the file's bytes, never zeros."""

import os
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from specdec.hardware import cpu_kernels as rk

pytestmark = pytest.mark.skipif(rk.compiler() is None or not sys.platform.startswith("linux"), reason="needs a C compiler and Linux")

# One process per mode (the op reads $SPECDEC_Q4_LARGE_PAGES at each node's first call; its count is per process). Two nodes
# take the same weights; the session runs them in order, so the second copies them after the first dropped their pages.
# Prints the nodes copied and, per mapping of the weights file, its resident kB.
SHARED_WEIGHTS = """
import ctypes, sys
import numpy as np, onnxruntime as ort
from specdec.hardware import cpu_kernels as rk
lib = ctypes.CDLL(str(rk.kernel_library()))
so = ort.SessionOptions()
so.intra_op_num_threads = 1
so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
so.register_custom_ops_library(str(rk.kernel_library()))
sess = ort.InferenceSession({model!r}, so, providers=["CPUExecutionProvider"])
x = np.load({x!r})
np.save({y!r}, np.stack([np.concatenate(sess.run(None, {{"x": x}}), axis=-1) for _ in range(3)]))
lines = open("/proc/self/smaps").read().splitlines()
rss = [int(lines[i + 1 + j].split()[1]) for i, line in enumerate(lines) if line.endswith("weights.data")
       for j in range(20) if i + 1 + j < len(lines) and lines[i + 1 + j].startswith("Rss:")]
print(lib.specdec_q4_large_page_copies(), *rss)
"""


def test_a_node_reading_weights_whose_pages_another_node_dropped_reads_the_files_bytes(tmp_path):
    sys.path.insert(0, os.path.dirname(__file__))
    from test_cpu_kernels import ck, int_weight

    p = ck.pack_q4(int_weight(1024, 256, 64, False, seed=3))
    inits = [helper.make_tensor(name, t, a.shape, a.tobytes(), raw=True)
             for name, t, a in (("w", TensorProto.UINT8, p.w), ("s", TensorProto.FLOAT, p.scales), ("z", TensorProto.INT32, p.zeros))]
    nodes = [helper.make_node(p.op, ["x", "w", "s", "z"], [f"y{i}"], domain=ck.DOMAIN, K=p.k, N=p.n, group_size=p.group) for i in range(2)]
    graph = helper.make_graph(nodes, "q", [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)],
                              [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in ("y0", "y1")], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid(ck.DOMAIN, 1)])
    model.ir_version = 10
    onnx.save_model(model, str(tmp_path / "model.onnx"), save_as_external_data=True, all_tensors_to_one_file=True,
                    location="weights.data", size_threshold=0)
    np.save(tmp_path / "x.npy", np.random.default_rng(1).standard_normal((1, 1024)).astype(np.float32))
    outputs, copied, resident = {}, {}, {}
    for mode in ("0", "force"):
        y = tmp_path / f"y_{mode}.npy"
        script = SHARED_WEIGHTS.format(model=str(tmp_path / "model.onnx"), x=str(tmp_path / "x.npy"), y=str(y))
        done = subprocess.run([sys.executable, "-c", script], check=True, capture_output=True, text=True,
                              env={**os.environ, "SPECDEC_Q4_LARGE_PAGES": mode})
        figures = [int(v) for v in done.stdout.split()]
        outputs[mode], copied[mode], resident[mode] = np.load(y), figures[0], figures[1:]
    if not resident["0"]:
        pytest.skip("this ONNX Runtime reads the weights file into its own memory: no file mapping to drop pages of")
    assert copied["0"] == 0 and copied["force"] == 2  # each node its own copy, the second made after the first dropped the pages
    assert sum(resident["0"]) > 0 and sum(resident["force"]) == 0  # ONNX Runtime's pages of the weights were dropped
    assert np.abs(outputs["0"]).max() > 0
    np.testing.assert_array_equal(outputs["force"], outputs["0"])  # both nodes, every run: the file's bytes
