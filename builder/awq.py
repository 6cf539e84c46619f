"""Activation-aware weight scaling (AWQ, Lin et al. 2023) for build-time int4.

A few input channels of a linear layer carry much larger activations than the
rest; round-to-nearest spends the same grid on every channel, so the error on
those channels dominates the layer's output error. Scaling the weight's rows
by ``s`` before quantizing and the input by ``1 / s`` leaves the float layer
unchanged,

    y = x @ W = (x / s) @ (s[:, None] * W),

and gives the salient rows a finer share of their group's grid. The network
quantizes ``W' = s[:, None] * W`` with RTN and computes ``(x / s) @ deq(W')``
(builder/network.py folds ``1 / s`` into the preceding norm where it can).

How ``s`` is chosen, per linear layer:

* Calibration text runs through the float32 network under ONNX Runtime, with
  every linear layer's input exposed as an extra output (as
  builder/calibration.py does for static FP8). For each layer we keep the mean
  of ``|x|`` per input channel and the Gram matrix ``G = X^T X`` over every
  calibration token (not a subsample: ``G`` is ``[in, in]`` however many tokens
  there are).
* Candidates ``s = x_mean ** alpha`` for alpha in 0, 0.05, ..., 1, and
  ``s = x_mean ** alpha / w_mean ** (1 - alpha)`` (AutoAWQ's "duo scaling";
  ``w_mean`` is the mean over output columns of ``|w|`` relative to its
  group's largest), each normalised by ``sqrt(max * min)`` so they sit around
  1; alpha = 0 without ``w_mean`` is ``s = 1``, plain RTN. On the demo pair
  (int4, group 128) the duo candidates won most layers and bought about four
  times the held-out perplexity that activation-only scales did.
* Loss: the layer's own output error on the calibration inputs,
  ``|| X W - (X / s) deq(Q(s W)) ||^2 = sum(E * (G @ E))`` with
  ``E = W - deq(Q(s W)) / s[:, None]``: exact, and cheaper than multiplying
  the activations once ``tokens > in``. The best alpha wins; because alpha = 0
  is a candidate, the result never has a larger calibration loss than RTN.

What this is not, compared with AutoAWQ's search:

* AutoAWQ scores a candidate by the output of the whole block the layer feeds
  (the attention module for q/k/v, the MLP for gate/up), rerunning it in torch;
  we score each linear layer's own output. A layer-local loss ignores how the
  error propagates through attention and SiLU, but needs no torch and no
  re-execution of the network per candidate.
* Layers are searched independently on the float network's activations;
  AutoAWQ searches block by block on the inputs of the already-scaled
  (not yet quantized) model. With a layer-local loss the two coincide: scaling
  is function-preserving in float.
* AutoAWQ searches one grid, duo scaling or activation-only; we search both
  (42 candidates instead of 20): the layer-local loss is cheap.

Weight clipping (AutoAWQ's ``auto_clip``), in ``awq_search`` only: after the
scales, each (group, output column) of ``W' = s W`` may shrink its range to
``r`` times the largest magnitude, r in 1, 0.95, ..., 0.55, before rounding: a
coarser reach for a finer grid. Each group's r is chosen per column on the
group's own share of the output error, ``e^T G_gg e`` over its rows, as
AutoAWQ scores each group's partial output alone. (Choosing groups in turn
with the other groups' errors in the cross terms of ``G`` cut the calibration
loss further, 28-36% below no clipping against 22-30%, but held-out perplexity
less: 16.431 against 16.399 on the demo pair, int4 group 128.) r = 1 is a
candidate, so no group's own error term rises. Unlike AutoAWQ, which leaves
q_proj and k_proj unclipped (their errors meet in the q.k product, which a
layer-local loss does not see), this clips the fused q|k|v like every other
projection; the perplexity figures below are measured that way. It
changes the weight, not only the scales, so the network takes it through
``AwqLayer.quantize`` (``awq_input_scales`` returns the scales alone).

Measured on the demo pair (int4, group 128, held-out perplexity; float32 16.228,
benchmarks/precision.py): symmetric RTN 16.511, scales 16.441, scales + clipping
16.407; asymmetric RTN 16.384, scales 16.467 (worse, although each layer's
output error on held-out text fell by 4% on average: the layer-local loss is a
proxy, and a 4% change of it is within what it does not predict), scales +
clipping 16.350 (clipping cut held-out layer errors by 20%).
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from onnx.external_data_helper import load_external_data_for_tensor, uses_external_data

from .calibration import context_feeds
from .weight_only import IntWeight, quantize_rtn

ALPHAS = tuple(np.round(np.linspace(0.0, 1.0, 21), 2))  # 0 (= RTN), 0.05, ..., 1
GRAM_BUDGET_BYTES = 2 << 30  # Gram matrices held at once; more layers than fit -> more calibration passes
_TINY = 1e-6  # relative floor of x_mean: a channel that never fires must not get s = 0
CLIP_RATIOS = tuple(round(1.0 - i / 20, 2) for i in range(10))  # 1 (no clipping), 0.95, ..., 0.55, as AutoAWQ's auto_clip


@dataclass
class InputStats:
    """Running statistics of one linear layer's input over the calibration tokens."""

    abs_sum: np.ndarray  # [in] float64: sum over tokens of |x|
    gram: np.ndarray  # [in, in] float64: X^T X
    tokens: int = 0

    @classmethod
    def empty(cls, in_features: int) -> InputStats:
        return cls(np.zeros(in_features), np.zeros((in_features, in_features)))

    def add(self, x: np.ndarray) -> None:
        """x: [..., in] activations of some tokens."""
        x = x.reshape(-1, x.shape[-1]).astype(np.float64)
        self.abs_sum += np.abs(x).sum(axis=0)
        self.gram += x.T @ x
        self.tokens += x.shape[0]

    @property
    def mean_abs(self) -> np.ndarray:
        """[in] float64"""
        return self.abs_sum / max(self.tokens, 1)


Candidate = tuple[float, bool]  # (alpha, divided by w_mean ** (1 - alpha))
RTN: Candidate = (0.0, False)  # s = 1


@dataclass
class ScaleSearch:
    """The outcome for one layer: the chosen scales and what the search saw."""

    scale: np.ndarray  # [in] float32 > 0
    choice: Candidate
    losses: dict[Candidate, float] = field(default_factory=dict)  # candidate -> calibration output error (sum of squares)

    @property
    def alpha(self) -> float:
        return self.choice[0]

    @property
    def loss(self) -> float:
        return self.losses[self.choice]

    @property
    def relative_loss(self) -> float:
        """The chosen candidate's calibration loss over RTN's: 1 means AWQ bought nothing."""
        rtn = self.losses[RTN]
        return self.loss / rtn if rtn > 0 else 1.0


def _floored(v: np.ndarray) -> np.ndarray:
    v = np.asarray(v, np.float64)
    return np.maximum(v, _TINY * max(float(np.max(v)), _TINY))


def candidate_scale(x_mean: np.ndarray, alpha: float, w_mean: np.ndarray | None = None) -> np.ndarray:
    """[in] -> [in] float32: x_mean ** alpha (/ w_mean ** (1 - alpha)), normalised so that sqrt(max * min) = 1."""
    s = _floored(x_mean) ** alpha
    if w_mean is not None:
        s = s / _floored(w_mean) ** (1.0 - alpha)
    return (s / np.sqrt(s.max() * s.min())).astype(np.float32)


def weight_mean(w_t: np.ndarray, group_size: int) -> np.ndarray:
    """[in, out] -> [in] float64: mean over output columns of |w| / (its group's max |w| in that column)."""
    n_in, n_out = w_t.shape
    g = group_size or n_in
    padded = np.zeros((-(-n_in // g) * g, n_out))
    padded[:n_in] = np.abs(w_t)
    blocks = padded.reshape(-1, g, n_out)
    rel = blocks / np.maximum(blocks.max(axis=1, keepdims=True), 1e-30)
    return rel.reshape(-1, n_out)[:n_in].mean(axis=1)


def output_error(w_t: np.ndarray, s: np.ndarray, gram: np.ndarray, bits: int, group_size: int, symmetric: bool) -> float:
    """|| X W - (X / s) deq(Q(s W)) ||^2 for inputs X with X^T X = ``gram`` [in, in]; w_t [in, out]."""
    deq = quantize_rtn(s[:, None] * w_t, bits, group_size, symmetric).dequantized()
    err = w_t.astype(np.float64) - deq.astype(np.float64) / s[:, None].astype(np.float64)  # [in, out]
    return float(np.sum(err * (gram @ err)))


def search_scale(w_t: np.ndarray, stats: InputStats, bits: int, group_size: int, symmetric: bool, alphas=ALPHAS, duo: bool = True) -> ScaleSearch:
    """Grid-search the scales of one layer (w_t [in, out] float32) on its calibration statistics."""
    x_mean = stats.mean_abs
    w_mean = weight_mean(w_t, group_size) if duo else None
    candidates = [(float(a), False) for a in alphas] + ([(float(a), True) for a in alphas if a < 1] if duo else [])
    losses, scales = {}, {}
    for c in candidates:
        scales[c] = s = candidate_scale(x_mean, c[0], w_mean if c[1] else None)
        losses[c] = output_error(w_t, s, stats.gram, bits, group_size, symmetric)
    best = min(candidates, key=lambda c: losses[c])  # first of equals: a layer that never fires keeps RTN
    return ScaleSearch(scale=scales[best], choice=best, losses=losses)


def _group_view(w_t: np.ndarray, group_size: int) -> np.ndarray:
    """[in, out] -> [groups, group_size, out] float64, zero-padded like quantize_rtn."""
    n_in, n_out = w_t.shape
    g = group_size or n_in
    padded = np.zeros((-(-n_in // g) * g, n_out))
    padded[:n_in] = w_t
    return padded.reshape(-1, g, n_out)


def clip_weight(w_t: np.ndarray, ratio: np.ndarray, group_size: int, symmetric: bool) -> np.ndarray:
    """w_t [in, out] clipped per (group, output column) to ``ratio`` [groups, out] of its range; [in, out] float32.

    symmetric: to +-ratio * max|w|; asymmetric: to ratio * [min(w, 0), max(w, 0)] (0 stays inside, as quantize_rtn needs).
    """
    blocks = _group_view(w_t, group_size)
    r = np.asarray(ratio, np.float64)[:, None, :]
    if symmetric:
        hi = np.abs(blocks).max(axis=1, keepdims=True) * r
        lo = -hi
    else:
        lo = np.minimum(blocks.min(axis=1, keepdims=True), 0.0) * r
        hi = np.maximum(blocks.max(axis=1, keepdims=True), 0.0) * r
    return np.clip(blocks, lo, hi).reshape(-1, w_t.shape[1])[: w_t.shape[0]].astype(np.float32)


def search_clip(w_t: np.ndarray, gram: np.ndarray, bits: int, group_size: int, symmetric: bool, ratios=CLIP_RATIOS) -> np.ndarray:
    """ratio [groups, out] float32: per (group, output column), the clipping that minimises that group's own share of
    the output error, e^T G_gg e over the group's rows (X^T X = ``gram`` [in, in]); ratio 1 wins ties."""
    n_in, n_out = w_t.shape
    g = group_size or n_in
    groups = -(-n_in // g)
    padded_gram = np.zeros((groups * g, groups * g))
    padded_gram[:n_in, :n_in] = gram
    blocks = np.stack([padded_gram[k * g : (k + 1) * g, k * g : (k + 1) * g] for k in range(groups)])  # [groups, g, g]
    losses = []
    for r in ratios:  # groups quantize independently: one whole-matrix rounding per ratio
        clipped = clip_weight(w_t, np.full((groups, n_out), r, np.float32), g, symmetric)
        err = _group_view(w_t - quantize_rtn(clipped, bits, g, symmetric).dequantized(), g)  # [groups, g, out]
        losses.append(np.sum(err * np.einsum("kij,kjo->kio", blocks, err), axis=1))  # [groups, out]
    best = np.argmin(np.stack(losses), axis=0)  # first of equals: ratios[0] = 1, no clipping
    return np.asarray(ratios, np.float32)[best]


@dataclass
class AwqLayer:
    """How int4_awq quantizes one linear layer: (x / scale) @ deq(Q(clip(scale[:, None] * W)))."""

    scale: np.ndarray  # [in] float32 > 0
    clip: np.ndarray | None  # [groups, out] float32 in (0, 1]: range kept per group of scale * W; None = no clipping

    def scaled_weight(self, w_t: np.ndarray, group_size: int, symmetric: bool) -> np.ndarray:
        """W' [in, out] float32: the weight that is rounded to nearest."""
        w = self.scale[:, None] * np.asarray(w_t, np.float32)
        return w if self.clip is None else clip_weight(w, self.clip, group_size, symmetric)

    def quantize(self, w_t: np.ndarray, bits: int, group_size: int, symmetric: bool) -> IntWeight:
        q = quantize_rtn(self.scaled_weight(w_t, group_size, symmetric), bits, group_size, symmetric)
        q.source = "awq"
        return q


def awq_search(float_network, taps, cache_shape, num_layers, samples, bits, group_size, symmetric, clip: bool = True,
               say=None, progress=None) -> dict[str, AwqLayer]:
    """awq_input_scales plus, with ``clip``, the per-group clipping of the scaled weights. ``progress(done, total)``: after each
    linear layer searched (the build's progress line: the search is most of an AWQ build's time)."""
    layers = {}

    def on_layer(name: str, w_t: np.ndarray, stats: InputStats, found: ScaleSearch) -> None:
        ratio = None
        if clip:
            inv = 1.0 / found.scale.astype(np.float64)
            ratio = search_clip(found.scale[:, None] * w_t, stats.gram * np.outer(inv, inv), bits, group_size, symmetric)  # inputs are x / s
        layers[name] = AwqLayer(found.scale, ratio)
        if progress:
            progress(len(layers), len(taps))

    search_network_scales(float_network, taps, cache_shape, num_layers, samples, bits, group_size, symmetric, say, on_layer)
    return layers


def awq_input_scales(
    float_network: onnx.ModelProto,
    taps: dict[str, str],
    cache_shape: tuple[int, ...],
    num_layers: int,
    samples: list[list[int]],
    bits: int,
    group_size: int,
    symmetric: bool,
    say=None,
) -> dict[str, np.ndarray]:
    """Per linear layer (``taps``: name -> the graph value it reads), the AWQ input scales s [in] float32 > 0.

    ``float_network`` is the float32 network (its initializers hold each layer's
    weight [in, out] as f"{name}.weight"); it is spent: the calibration outputs
    are added to its graph and its weights move to a temporary file.
    ``say``, if given, gets one line per layer (the chosen candidate, its calibration loss vs RTN's).
    """
    found = search_network_scales(float_network, taps, cache_shape, num_layers, samples, bits, group_size, symmetric, say)
    return {name: r.scale for name, r in found.items()}


def search_network_scales(float_network, taps, cache_shape, num_layers, samples, bits, group_size, symmetric, say=None,
                          on_layer=None) -> dict[str, ScaleSearch]:
    """awq_input_scales, keeping each layer's search (alpha, losses) for reports and tests.

    on_layer(name, w_t, stats, search), if given, runs while the layer's weight and statistics are at hand.
    """
    import onnxruntime as ort

    from .network_file import save_network

    weights = _weight_tensors(float_network, taps)
    in_features = {name: int(t.dims[0]) for name, t in weights.items()}
    for value in taps.values():
        float_network.graph.output.append(helper.make_tensor_value_info(value, TensorProto.FLOAT, None))
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    results: dict[str, ScaleSearch] = {}
    with tempfile.TemporaryDirectory(prefix="specdec-awq-") as tmp:
        # save_network moves the weights out of the proto into tmp: read them back from there below.
        sess = ort.InferenceSession(str(Path(tmp) / save_network(float_network, Path(tmp))), opts, providers=["CPUExecutionProvider"])
        for group in _tap_groups(in_features, GRAM_BUDGET_BYTES):
            stats = _collect_stats(sess, {k: taps[k] for k in group}, in_features, cache_shape, num_layers, samples)
            for name in group:
                w_t = _read_weight(weights[name], Path(tmp))
                layer_stats = stats.pop(name)
                results[name] = search_scale(w_t, layer_stats, bits, group_size, symmetric)
                if on_layer:
                    on_layer(name, w_t, layer_stats, results[name])
                if say:
                    r = results[name]
                    say(f"awq {name}: alpha={r.alpha:.2f}{' / w_mean' if r.choice[1] else ''}, calibration output error {r.relative_loss:.3f} x "
                        "RTN's")
    return results


def _weight_tensors(model: onnx.ModelProto, taps: dict[str, str]) -> dict[str, onnx.TensorProto]:
    by_name = {t.name: t for t in model.graph.initializer}
    missing = [f"{n}.weight" for n in taps if f"{n}.weight" not in by_name]
    if missing:
        raise ValueError(f"AWQ needs each tapped layer's float weight as an initializer; missing {missing[:3]}")
    return {n: by_name[f"{n}.weight"] for n in taps}


def _read_weight(tensor: onnx.TensorProto, base_dir: Path) -> np.ndarray:
    """[in, out] float32, whether the proto still holds the bytes or they were written to ``base_dir``."""
    if uses_external_data(tensor) and not tensor.HasField("raw_data"):
        t = onnx.TensorProto()
        t.CopyFrom(tensor)
        load_external_data_for_tensor(t, str(base_dir))
        t.data_location = onnx.TensorProto.DEFAULT  # the bytes are in raw_data now: onnx 1.19's to_array would reload them
        del t.external_data[:]
        tensor = t
    return numpy_helper.to_array(tensor).astype(np.float32, copy=False)


def _tap_groups(in_features: dict[str, int], budget_bytes: int) -> list[list[str]]:
    """Split the layers into calibration passes whose Gram matrices (float64) fit ``budget_bytes`` together."""
    groups: list[list[str]] = [[]]
    used = 0
    for name, n in in_features.items():
        need = n * n * 8
        if groups[-1] and used + need > budget_bytes:
            groups.append([])
            used = 0
        groups[-1].append(name)
        used += need
    return groups


def _collect_stats(sess, taps: dict[str, str], in_features: dict[str, int], cache_shape, num_layers: int,
                   samples: list[list[int]]) -> dict[str, InputStats]:
    names = list(taps)
    stats = {k: InputStats.empty(in_features[k]) for k in names}
    for feed in context_feeds(samples, cache_shape, num_layers):
        for k, x in zip(names, sess.run([taps[k] for k in names], feed), strict=True):  # x: [1, n, in]
            stats[k].add(x)
    return stats
