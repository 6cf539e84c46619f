"""A small ONNX graph builder: nodes named by where they live in the model.

Node names follow ``/model/layers.3/attn/qkv_proj`` so that a profile or a
parser error points at the layer; a node's outputs are ``<name>/out<i>``.
Weights are stored in the engine's dtype and cast to the compute dtype where
the two differ: float32 for the CPU lowerings (ONNX Runtime CPU has no
fp16/bf16 MatMul; it folds those casts once, when the session is created),
the storage dtype itself for a lowering that computes in half precision.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper

from ..plugins.arrays import c_order

OPSET = 24  # TensorScatter (24), Attention / RotaryEmbedding / RMSNormalization (23)
IR_VERSION = 12  # the IR of opset 24; onnx 1.23 would write 14, newer than ONNX Runtime 1.31 reads

_STORAGE = {"float32": TensorProto.FLOAT, "float16": TensorProto.FLOAT16, "bfloat16": TensorProto.BFLOAT16}


def float32_to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """Round float32 to bfloat16 (nearest even) and return the uint16 bits, in C order.

    ml_dtypes' cast: one pass in C, the same bits as the shift-and-round in numpy it replaced (7x slower,
    a third of an 8B model's build)."""
    import ml_dtypes  # the build extra

    return c_order(np.asarray(x, dtype=np.float32).astype(ml_dtypes.bfloat16)).view(np.uint16)


class GraphBuilder:
    """Satisfies plugins/graph_api.py's GraphOps: the lowerings build through it without importing builder/."""

    def __init__(self, weight_dtype: str = "float32", compute_dtype: str = "float32"):
        if weight_dtype not in _STORAGE or compute_dtype not in _STORAGE:
            raise ValueError(f"unsupported weight/compute dtype {weight_dtype!r}/{compute_dtype!r}")
        self.weight_dtype, self.compute_dtype = weight_dtype, compute_dtype
        self.compute_type = _STORAGE[compute_dtype]  # the TensorProto type activations are in
        self.nodes: list = []
        # Initializers are written straight into the model that model() returns: a list of TensorProtos handed to
        # make_graph / make_model would be copied twice more (an 8B model's 14 GB of weights, and its build's peak memory)
        self._model = onnx.ModelProto()
        self.initializers = self._model.graph.initializer
        self.inputs: list = []
        self.outputs: list = []
        self._names: set[str] = set()

    # -- values ---------------------------------------------------------------
    def input(self, name: str, elem_type: int, shape: Sequence[int | str]) -> str:
        self.inputs.append(helper.make_tensor_value_info(name, elem_type, list(shape)))
        return name

    def output(self, name: str, elem_type: int, shape: Sequence[int | str]) -> None:
        self.outputs.append(helper.make_tensor_value_info(name, elem_type, list(shape)))

    def const(self, name: str, value: np.ndarray) -> str:
        """An initializer stored as given (indices, shapes, float32 tables)."""
        value = np.asarray(value)  # asarray keeps 0-d
        return self.raw_const(name, helper.np_dtype_to_tensor_dtype(value.dtype), value.shape, c_order(value).tobytes())

    def raw_const(self, name: str, elem_type: int, dims: Sequence[int], raw: bytes) -> str:
        """An initializer from its raw little-endian bytes (also of types numpy has no dtype for: int4/uint4, two values
        per byte, low nibble first; bfloat16)."""
        t = self.initializers.add()
        t.name, t.data_type = name, elem_type
        t.dims.extend(int(d) for d in dims)
        t.raw_data = raw
        return name

    def weight(self, name: str, value: np.ndarray) -> str:
        """A float32 weight stored in the engine dtype; returns a value in the compute dtype.

        A transposed view is cast first and transposed in the (narrower) storage dtype."""
        value = np.asarray(value, dtype=np.float32)
        if self.weight_dtype == "float32":
            self.const(name, c_order(value))
        elif self.weight_dtype == "float16":
            self.const(name, c_order(value.astype(np.float16)))
        else:
            self.raw_const(name, TensorProto.BFLOAT16, value.shape, float32_to_bf16_bits(value).tobytes())
        if self.weight_dtype == self.compute_dtype:
            return name
        return self.op("Cast", [name], f"{name}/cast", to=self.compute_type)

    def fp8_weight(self, name: str, bits: np.ndarray, scale: np.ndarray, block_size: int = 0) -> str:
        """float8 e4m3 weight [in, out] + scales -> a float32 value via DequantizeLinear."""
        self.raw_const(name, TensorProto.FLOAT8E4M3FN, bits.shape, np.ascontiguousarray(bits).tobytes())
        s = self.const(f"{name}_scale", scale.astype(np.float32))
        if block_size:
            return self.op("DequantizeLinear", [name, s], f"{name}/dequant", axis=0, block_size=block_size)
        return self.op("DequantizeLinear", [name, s], f"{name}/dequant", axis=1)

    def fp8_activation(self, name: str, x: str, scale: str) -> str:
        """Quantize-dequantize an activation through float8 e4m3 (what an FP8 GEMM reads)."""
        zero = helper.make_tensor(f"{name}/zero_point", TensorProto.FLOAT8E4M3FN, [], [0.0])
        self.initializers.append(zero)
        q = self.op("QuantizeLinear", [x, scale, zero.name], f"{name}/quant")
        return self.op("DequantizeLinear", [q, scale, zero.name], f"{name}/dequant")

    # -- nodes ----------------------------------------------------------------
    def op(self, op_type: str, inputs: Sequence[str], name: str, num_outputs: int = 1, outputs: Sequence[str] | None = None, domain: str = "",
           **attrs) -> str:
        if name in self._names:
            raise ValueError(f"duplicate node name {name}")
        self._names.add(name)
        outs = list(outputs) if outputs else [f"{name}/out{i}" for i in range(num_outputs)]
        self.nodes.append(helper.make_node(op_type, list(inputs), outs, name=name, domain=domain or None, **attrs))
        return outs[0] if len(outs) == 1 else outs  # type: ignore[return-value]

    def bypass(self, value: str, replacement: str) -> None:
        """Drop the node that makes ``value``: its readers read ``replacement`` instead; nodes left with no reader
        (and making no graph output) go too. For a rewrite decided after the nodes were made."""
        for node in self.nodes:
            for i, name in enumerate(node.input):
                if name == value:
                    node.input[i] = replacement
        keep = {o.name for o in self.outputs}
        while True:
            read = keep | {name for node in self.nodes for name in node.input}
            dead = [node for node in self.nodes if not any(o in read for o in node.output if o)]
            if not dead:
                break
            for node in dead:
                self.nodes.remove(node)
                self._names.discard(node.name)
        # and the constants only they read (ONNX Runtime warns of every unused initializer at load)
        unread = [i for i, t in enumerate(self.initializers) if t.name not in read]
        for i in reversed(unread):
            del self.initializers[i]

    def model(self, graph_name: str, extra_opsets: dict[str, int] | None = None):
        """The ModelProto (what helper.make_graph / make_model would give, without copying the initializers)."""
        model, graph = self._model, self._model.graph
        graph.name = graph_name
        graph.node.extend(self.nodes)
        graph.input.extend(self.inputs)
        graph.output.extend(self.outputs)
        model.opset_import.extend([helper.make_opsetid("", OPSET)] + [helper.make_opsetid(d, v) for d, v in (extra_opsets or {}).items()])
        model.producer_name = "specdec"
        model.ir_version = IR_VERSION
        return model
