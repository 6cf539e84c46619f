"""config.json against the network's own inputs and outputs, at load (both ONNX Runtime executors).

An engine's config.json is not covered by its hashes (it holds them); an engine built by this specdec also holds
build_stamp.json, which is (formats/engine_format.py: check_build_stamp). For every engine, the graph itself says
what config.json must agree with: one past_key.i input per layer, the KV cache's layout and static dimensions,
the logits' width, a tree_mask input for tree attention, the extra inputs and outputs of its speculative mode.
A config.json that disagrees is refused in one line naming the field and both values, before a request can fail
mid-decode with an ONNX Runtime error.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ....formats.engine_format import CONFIG_FILE, EngineDir, extra_io
from ....formats.errors import EngineError


def check_network_io(engine: EngineDir, inputs: Sequence[Any], outputs: Sequence[Any]) -> None:
    """``inputs``/``outputs``: the session's NodeArgs (name, shape with ints for static and strings for symbolic dims)."""
    m, b = engine.config.model, engine.config.build
    ins, outs = {i.name: list(i.shape) for i in inputs}, {o.name: list(o.shape) for o in outputs}

    def refuse(field: str, said: Any, found: Any, where: str) -> None:
        raise EngineError(f"{engine.path / CONFIG_FILE} says {field}={said}, but the network has {found} ({where}): config.json does not match "
                          "the network it came with (edited after the build?). Restore it, or rebuild the engine with specdec-build.")

    layers = sum(1 for n in ins if n.startswith("past_key."))
    if layers != m.num_layers:
        refuse("model.num_layers", m.num_layers, layers, "its past_key.i inputs")
    kv = ins.get("past_key.0", [])
    layout = {3: "bsh", 4: "bnsh"}.get(len(kv))
    if layout != b.kv_layout:
        refuse("build.kv_layout", repr(b.kv_layout), repr(layout) if layout else f"a rank-{len(kv)} cache", "past_key.0's shape")
    static = [d for d in kv[1:] if isinstance(d, int)]  # bsh: [heads * head_dim]; bnsh: [heads, head_dim]
    want = [m.num_kv_heads * m.head_dim] if layout == "bsh" else [m.num_kv_heads, m.head_dim]
    if static and static != want:
        what = "num_kv_heads x head_dim" if layout == "bsh" else "num_kv_heads, head_dim"
        refuse(f"model.{what.replace(' x ', '*').replace(', ', ',')}", want, static, f"past_key.0's shape {kv}")
    width = (outs.get("logits") or [None])[-1]
    if isinstance(width, int) and width != m.vocab_size:
        refuse("model.vocab_size", m.vocab_size, f"{width} logits per token", "its logits output")
    if ("tree_mask" in ins) != b.tree_attention:
        refuse("build.tree_attention", str(b.tree_attention).lower(), "a tree_mask input" if "tree_mask" in ins else "no tree_mask input",
               "its inputs")
    extra_in, extra_out = extra_io(m, b)
    for tensors, present, kind in ((extra_in, ins, "input"), (extra_out, outs, "output")):
        for t in tensors:
            if t.name not in present:
                refuse("build.speculative_decoding_mode", repr(b.speculative_decoding_mode), f"no {t.name} {kind}", "its inputs and outputs")
            tail = [d for d in present[t.name][2:]]
            if all(isinstance(d, int) for d in tail) and tail != list(t.tail):
                refuse(f"the {t.name} shape", list(t.tail), tail, f"its {t.name} {kind}")
    known = {"medusa_logits", "eagle_hidden", "hidden_out", "hidden_states"}
    unexpected = sorted((set(ins) | set(outs)) & known - {t.name for t in (*extra_in, *extra_out)})
    if unexpected:
        refuse("build.speculative_decoding_mode", repr(b.speculative_decoding_mode), f"a {unexpected[0]} tensor", "its inputs and outputs")
