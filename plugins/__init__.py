"""Per-backend lowerings of the hot layers (attention with in-place KV update).

``portable`` is made of standard ONNX ops only (TensorScatter + RotaryEmbedding
+ Attention): ONNX Runtime runs it on any CPU and TensorRT's ONNX parser maps
it onto its native KV-cache and attention layers. Every other lowering is
tested against it.
"""

from __future__ import annotations

from .attention import AttentionLowering, PortableAttention

LOWERINGS: dict[str, type[AttentionLowering]] = {
    "portable": PortableAttention,
}


def get_lowering(name: str) -> type[AttentionLowering]:
    try:
        return LOWERINGS[name]
    except KeyError:
        raise ValueError(f"unknown attention lowering {name!r}; known: {', '.join(LOWERINGS)}") from None
