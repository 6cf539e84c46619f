"""What a lowering needs from a graph builder, and nothing more.

The builder (builder/graph.py's ``GraphBuilder``) satisfies this protocol;
lowerings are written against it, so ``plugins/`` never imports ``builder/``
and the dependency runs one way: builder -> plugins.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np


class GraphOps(Protocol):
    compute_type: int  # onnx TensorProto type of the activations
    compute_dtype: str  # its name: float32 | float16 | bfloat16

    def input(self, name: str, elem_type: int, shape: Sequence[int | str]) -> str: ...

    def output(self, name: str, elem_type: int, shape: Sequence[int | str]) -> None: ...

    def const(self, name: str, value: np.ndarray) -> str:
        """An initializer stored as given."""
        ...

    def raw_const(self, name: str, elem_type: int, dims: Sequence[int], raw: bytes) -> str:
        """An initializer of a type numpy has no dtype for (int4/uint4), from its packed bytes."""
        ...

    def weight(self, name: str, value: np.ndarray) -> str:
        """A float32 weight stored in the engine dtype; returns a value in the compute dtype."""
        ...

    def op(self, op_type: str, inputs: Sequence[str], name: str, num_outputs: int = 1, outputs: Sequence[str] | None = None, domain: str = "",
           **attrs): ...
