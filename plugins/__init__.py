"""Per-backend lowerings of the hot layers (attention with in-place KV update).

``portable`` is made of standard ONNX ops only (TensorScatter + RotaryEmbedding
+ Attention): ONNX Runtime runs it on any CPU and TensorRT's ONNX parser maps
it onto its native KV-cache and attention layers. ``ort_cpu`` is ONNX
Runtime's faster CPU form (3-D cache, fused residual + norm; about 25% less
time per decode step on a 6-layer/256 model). Both are tested against
transformers.
"""

from __future__ import annotations

from .attention import AttentionLowering, PortableAttention
from .ort_cpu import OrtCpuAttention
from .ort_cuda import OrtCudaAttention

LOWERINGS: dict[str, type[AttentionLowering]] = {cls.name: cls for cls in (PortableAttention, OrtCpuAttention, OrtCudaAttention)}


def lowering_for(build) -> type[AttentionLowering]:
    """The lowering class that builds ``build``'s network (a lowering may have variants: ort_cuda's two attentions)."""
    return get_lowering(build.lowering).variant(build)


def get_lowering(name: str) -> type[AttentionLowering]:
    try:
        return LOWERINGS[name]
    except KeyError:
        raise ValueError(f"unknown attention lowering {name!r}; known: {', '.join(LOWERINGS)}") from None
