"""A small ONNX graph builder: nodes named by where they live in the model.

Node names follow ``/model/layers.3/attn/qkv_proj`` so that a profile or a
parser error points at the layer; a node's outputs are ``<name>/out<i>``.
Weights are stored in the engine's dtype and cast to the compute dtype where
the two differ: float32 for the CPU lowerings (ONNX Runtime CPU has no
fp16/bf16 MatMul; it folds those casts once, when the session is created),
the storage dtype itself for a lowering that computes in half precision.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
from onnx import TensorProto, helper, numpy_helper

OPSET = 24  # TensorScatter (24), Attention / RotaryEmbedding / RMSNormalization (23)
IR_VERSION = 12  # the IR of opset 24; onnx 1.23 would write 14, newer than ONNX Runtime 1.31 reads

_STORAGE = {"float32": TensorProto.FLOAT, "float16": TensorProto.FLOAT16, "bfloat16": TensorProto.BFLOAT16}


def float32_to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """Round float32 to bfloat16 (nearest even) and return the uint16 bits."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))
    return (rounded >> np.uint32(16)).astype(np.uint16)


class GraphBuilder:
    """Satisfies plugins/graph_api.py's GraphOps: the lowerings build through it without importing builder/."""

    def __init__(self, weight_dtype: str = "float32", compute_dtype: str = "float32"):
        if weight_dtype not in _STORAGE or compute_dtype not in _STORAGE:
            raise ValueError(f"unsupported weight/compute dtype {weight_dtype!r}/{compute_dtype!r}")
        self.weight_dtype, self.compute_dtype = weight_dtype, compute_dtype
        self.compute_type = _STORAGE[compute_dtype]  # the TensorProto type activations are in
        self.nodes: list = []
        self.initializers: list = []
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
        self.initializers.append(numpy_helper.from_array(np.asarray(value, order="C"), name))  # from_array copies; asarray keeps 0-d
        return name

    def raw_const(self, name: str, elem_type: int, dims: Sequence[int], raw: bytes) -> str:
        """An initializer of a type numpy has no dtype for (int4/uint4: two values per byte, low nibble first)."""
        self.initializers.append(helper.make_tensor(name, elem_type, list(dims), raw, raw=True))
        return name

    def weight(self, name: str, value: np.ndarray) -> str:
        """A float32 weight stored in the engine dtype; returns a value in the compute dtype."""
        value = np.ascontiguousarray(value, dtype=np.float32)
        if self.weight_dtype == "float32":
            self.const(name, value)
        elif self.weight_dtype == "float16":
            self.const(name, value.astype(np.float16))
        else:
            bits = float32_to_bf16_bits(value)
            self.initializers.append(
                helper.make_tensor(name, TensorProto.BFLOAT16, value.shape, bits.tobytes(), raw=True)
            )
        if self.weight_dtype == self.compute_dtype:
            return name
        return self.op("Cast", [name], f"{name}/cast", to=self.compute_type)

    def fp8_weight(self, name: str, bits: np.ndarray, scale: np.ndarray, block_size: int = 0) -> str:
        """float8 e4m3 weight [in, out] + scales -> a float32 value via DequantizeLinear."""
        self.initializers.append(helper.make_tensor(name, TensorProto.FLOAT8E4M3FN, bits.shape, np.ascontiguousarray(bits).tobytes(), raw=True))
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
    def op(self, op_type: str, inputs: Sequence[str], name: str, num_outputs: int = 1, outputs: Sequence[str] | None = None, domain: str = "", **attrs) -> str:
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
                return
            for node in dead:
                self.nodes.remove(node)
                self._names.discard(node.name)

    def model(self, graph_name: str, extra_opsets: dict[str, int] | None = None):
        graph = helper.make_graph(self.nodes, graph_name, self.inputs, self.outputs, self.initializers)
        opsets = [helper.make_opsetid("", OPSET)] + [helper.make_opsetid(d, v) for d, v in (extra_opsets or {}).items()]
        model = helper.make_model(graph, opset_imports=opsets, producer_name="specdec")
        model.ir_version = IR_VERSION
        return model
