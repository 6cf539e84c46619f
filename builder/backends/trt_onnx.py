"""What both TensorRT backends do to the portable ONNX before building: shapes, parsing, profiles.

TensorRT (10/11, ``tensorrt``) and TensorRT for RTX (``tensorrt_rtx``) have the
same network-definition API under two module names, so every function here
takes the module as ``trt``. Nothing imports either at module level.

Two optimization profiles, because TensorRT times its kernels at a profile's
``opt`` shape and a single range from 1 to ``max_input_len`` tokens would tune
either for long prefills or for the 1..k+1-token decode steps that make up
nearly all of the calls. The context profile (0) spans whole prompts, the
generation profile (1) the decode widths; the executor picks per call.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from ...formats.engine_format import BuildConfig, ModelConfig
from ...formats.errors import BuildConfigError
from ...formats.tensorrt_plan import CONTEXT_PROFILE, GENERATION_PROFILE

Shape = tuple[int, ...]
CACHE_PREFIXES = ("past_key.", "past_value.", "present_key.", "present_value.")


def generation_width(build: BuildConfig) -> int:
    """Most tokens per row in a generation call: the last token + max_draft_len drafts, and at
    least 2, because the draft model's catch-up step feeds its pending 2 tokens at once."""
    return max(2, build.max_draft_len + 1)


def profile_shapes(build: BuildConfig, model: ModelConfig) -> list[dict[str, tuple[Shape, Shape, Shape]]]:
    """(min, opt, max) shape of every network input, for profile 0 (context) and 1 (generation).

    opt: a full batch in both (decoding keeps the batch full until rows
    finish); half of max_input_len for prompts; exactly max_draft_len + 1
    tokens for generation (the verify width of a target, 1 for a draft).
    Batch sizes agree across inputs at opt, as TensorRT requires. A tree
    engine's ``tree_mask`` [batch, tokens, tokens] follows ``input_ids``.
    """
    mb, ctx, gen = build.max_batch_size, build.max_input_len, generation_width(build)
    kv = (model.num_kv_heads, build.kv_capacity, model.head_dim)  # capacity is static: KVCacheUpdate needs it
    caches = [f"past_{k}.{i}" for i in range(model.num_layers) for k in ("key", "value")]

    def profile(tokens: tuple[int, int], rows: tuple[int, int]) -> dict[str, tuple[Shape, Shape, Shape]]:
        ids = ((1, 1), (mb, tokens[0]), (mb, tokens[1]))
        shapes = {"input_ids": ids, "position_ids": ids, "logits_index": ((1, 1), (mb, rows[0]), (mb, rows[1]))}
        if build.tree_attention:
            shapes["tree_mask"] = tuple((b, s, s) for b, s in ids)
        shapes.update({c: ((1, *kv), (mb, *kv), (mb, *kv)) for c in caches})
        return shapes

    by_index = {
        CONTEXT_PROFILE: profile((max(1, -(-ctx // 2)), ctx), (1, ctx)),  # prefill asks for the last row only
        GENERATION_PROFILE: profile((build.max_draft_len + 1, gen), (build.max_draft_len + 1, gen)),
    }
    return [by_index[i] for i in sorted(by_index)]


def static_kv_onnx(onnx_path: Path, capacity: int) -> bytes:
    """The network with the cache's sequence axis fixed to ``capacity``.

    TensorRT's KV-cache-update layer needs the cache to be a network input
    with a static sequence dimension; the ONNX graph leaves it symbolic
    (``kv_capacity``). Only the small graph proto is rewritten: weights stay
    in ``model.onnx.data``, found through the path given to the parser.
    """
    return static_kv_proto(onnx_path, capacity).SerializeToString()


def static_kv_proto(onnx_path: Path, capacity: int):
    """``static_kv_onnx`` as an (external-data, weightless) ModelProto."""
    import onnx

    model = onnx.load(str(onnx_path), load_external_data=False)
    for value in [*model.graph.input, *model.graph.output]:
        if value.name.startswith(CACHE_PREFIXES):
            value.type.tensor_type.shape.dim[2].dim_value = capacity  # oneof: clears dim_param
    return model


def collecting_logger(trt, say: Callable[[str], None]):
    """A trt.ILogger that shows each distinct warning once and keeps errors for the exception message."""

    class Logger(trt.ILogger):
        def __init__(self) -> None:
            trt.ILogger.__init__(self)  # documented: subclasses must call the base __init__
            self.errors: list[str] = []
            self.warned: set[str] = set()  # the builder repeats a warning per profile and per build

        def log(self, severity, msg: str) -> None:
            if severity in (trt.ILogger.Severity.INTERNAL_ERROR, trt.ILogger.Severity.ERROR):
                self.errors.append(f"  {msg}")
                say(f"TensorRT error: {msg}")
            elif severity == trt.ILogger.Severity.WARNING and msg not in self.warned:
                self.warned.add(msg)
                say(f"TensorRT warning: {msg}")

    return Logger()


def parse_portable(trt, logger, onnx_path: Path, capacity: int, flags: int = 0, product: str = "TensorRT"):
    """(builder, network, parser) with ``onnx_path`` parsed, its cache axis fixed to ``capacity``.

    Keep the parser until the engine is built: it owns the weights the network points at.
    A graph the parser refuses raises one error listing each refused node with the parser's reason.
    """
    builder = trt.Builder(logger)
    network = builder.create_network(flags)
    parser = trt.OnnxParser(network, logger)
    # parse(model, path): documented for models with external weights, like parse_from_file, but
    # takes the proto with the static cache axis.
    if not parser.parse(static_kv_onnx(onnx_path, capacity), str(onnx_path)):
        errors = [parser.get_error(i) for i in range(parser.num_errors)]
        lines = [f"  node {e.node_name() or e.node()} ({e.node_operator() or '?'}): {e.desc()}" for e in errors]
        raise BuildConfigError(f"{product} {trt.__version__}'s ONNX parser rejected "
                               f"{onnx_path}:\n" + "\n".join(lines or logger.errors or ["  (no parser error recorded)"]))
    return builder, network, parser


def add_profiles(trt, builder, config, network, build: BuildConfig, model: ModelConfig) -> list[dict[str, tuple[Shape, Shape, Shape]]]:
    """Attach the context and generation profiles to ``config``; return them (for config.json)."""
    profiles = profile_shapes(build, model)
    inputs = {network.get_input(i).name for i in range(network.num_inputs)}
    if inputs != set(profiles[0]):
        raise BuildConfigError(f"the parsed network's inputs differ from the engine ABI: {sorted(inputs ^ set(profiles[0]))}.")
    for shapes in profiles:
        profile = builder.create_optimization_profile()
        for name, (lo, opt, hi) in shapes.items():
            profile.set_shape(name, lo, opt, hi)
        if config.add_optimization_profile(profile) < 0:
            raise BuildConfigError(f"TensorRT rejected optimization profile {shapes}.")
    return profiles


def profiles_record(profiles: list[dict[str, tuple[Shape, Shape, Shape]]]) -> list[dict[str, list[list[int]]]]:
    """The profiles as config.json records them: the per-step inputs (the caches' shapes follow from the model)."""
    return [{n: [list(s) for s in mm] for n, mm in p.items() if not n.startswith("past_")} for p in profiles]
