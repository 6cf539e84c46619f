"""RotaryCachedAttention with a tree_mask (a tree engine's verification step, hardware/kernels/ort_attention.c): each token
attends to the cache before the call and to the call's tokens its mask row names, its ancestors in path order. A tree
token's output is the same bits as that token's in a chain once its path is accepted: on every kernel, for paths that skip
sibling rows, batched rows with different trees; against a float64 reference; a causal mask the same bits as no mask; a
mask that hides a token from itself or has the wrong shape refused in one line."""

import os
import subprocess
import sys

import numpy as np
import onnxruntime as ort
import pytest
from test_rotary_cached_attention import fused_model, rotate, session, tables
from tree_paths import path_to

from specdec.hardware import cpu_kernels as rk
from specdec.runtime.backends.base import fill_tree

pytestmark = pytest.mark.skipif(rk.compiler() is None, reason="needs a C compiler")

CAPACITY = 168  # room for a cache of 150 before a tree: the value pass crosses its 64-slot blocks with tree tokens in them
# parents of each row's tree (-1: a child of the cache's last token); paths that skip one sibling row, two then one, and a
# second root, as suffix decoding's and EAGLE's trees do
TREES = [[-1, 0, 0, 1, 1, 2, 3, 3, 6], [-1, -1, 0, 1, 2, 0, 5, 4, 3]]


def tree_model(heads: int, kv_heads: int) -> bytes:
    """One packed RotaryCachedAttention node with the tree_mask input (plugins/ort_cpu.py's tree engines)."""
    return fused_model(heads, kv_heads, packed=True, tree=True)


def chain_model(heads: int, kv_heads: int) -> bytes:
    """The same node without tree_mask: a chain engine's."""
    return fused_model(heads, kv_heads, packed=True)


def run_in_place(model: bytes, feeds: dict, key: np.ndarray, value: np.ndarray) -> np.ndarray:
    """y of one run whose caches are key and value (in place of feeds' past_k and past_v), present bound to them as the
    runtime binds it: the run writes them in place."""
    sess = session(model)
    b = sess.io_binding()
    b.bind_output("y")
    for name, arr in feeds.items():
        if name not in ("past_k", "past_v"):
            b.bind_cpu_input(name, arr)
    for kind, arr in (("k", key), ("v", value)):
        ov = ort.OrtValue.ortvalue_from_numpy(arr)
        b.bind_ortvalue_input(f"past_{kind}", ov)
        b.bind_ortvalue_output(f"present_{kind}", ov)
    sess.run_with_iobinding(b)
    return b.copy_outputs_to_cpu()[0]


def tree_problem(rng, heads: int, kv_heads: int, hd: int, lengths: list[int]) -> dict:
    """Row b: TREES[b]'s tokens after a cache of lengths[b] slots (the slots past it garbage a leak would show)."""
    batch, tokens = len(lengths), len(TREES[0])
    width = (heads + 2 * kv_heads) * hd
    qkv = rng.standard_normal((batch, tokens, width)).astype(np.float32)
    past_k = rng.standard_normal((batch, CAPACITY, kv_heads * hd)).astype(np.float32)
    past_v = rng.standard_normal((batch, CAPACITY, kv_heads * hd)).astype(np.float32)
    for b, n in enumerate(lengths):
        past_k[b, n:], past_v[b, n:] = 1e4, 1e6
    tree, pos = np.zeros((batch, tokens, tokens), bool), np.zeros((batch, tokens), np.int64)
    fill_tree(tree, np.tril(np.ones((tokens, tokens), bool)), [], pos, np.array(lengths), [np.array(t) for t in TREES[:batch]])
    return dict(q=qkv, past_k=past_k, past_v=past_v, pos=pos, tree=tree)


def tree_outputs(heads: int, kv_heads: int, hd: int, lengths: list[int], seed: int = 0, threads: int = 1):
    """(the tree step's outputs [B, S, heads hd], each node's output fed as a chain along its path [B, S, heads hd], the
    tree step's caches): the chain of node j is its path's tokens one call, written from the row's length on."""
    rng = np.random.default_rng(seed)
    cos, sin = tables(hd, CAPACITY)
    p = tree_problem(rng, heads, kv_heads, hd, lengths)
    tree_sess, chain_sess = session(tree_model(heads, kv_heads), threads), session(chain_model(heads, kv_heads), threads)
    y, key, value = tree_sess.run(None, dict(q=p["q"], past_k=p["past_k"], past_v=p["past_v"], pos=p["pos"], cos=cos, sin=sin,
                                             tree=p["tree"]))
    chained = np.empty_like(y)
    for b, n in enumerate(lengths):
        for j in range(len(TREES[b])):
            nodes = path_to(TREES[b], j)
            feeds = dict(q=p["q"][b:b + 1, nodes], past_k=p["past_k"][b:b + 1].copy(), past_v=p["past_v"][b:b + 1].copy(),
                         pos=(n + np.arange(len(nodes)))[None].astype(np.int64), cos=cos, sin=sin)
            chained[b, j] = chain_sess.run(None, feeds)[0][0, -1]
    return y, chained, key, p, cos, sin


@pytest.mark.parametrize("heads,kv_heads,hd", [(4, 2, 16), (8, 2, 32), (6, 6, 24), (8, 1, 64), (4, 2, 128), (2, 1, 20)])
@pytest.mark.parametrize("lengths", [[0, 5], [17, 3], [63, 1], [150, 130]])
def test_a_tree_token_is_the_bits_of_its_path_as_a_chain(heads, kv_heads, hd, lengths):
    """Every node of two different trees in one call (paths that skip one sibling row, two then one, a second root):
    its output equals, bit for bit, that of its path fed as a chain; its key is written at the row's length + its index,
    rotated at its depth."""
    y, chained, key, p, cos, sin = tree_outputs(heads, kv_heads, hd, lengths, seed=hd)
    np.testing.assert_array_equal(y, chained)
    packed_k = p["q"][..., heads * hd:(heads + kv_heads) * hd]
    want_k = rotate(packed_k, p["pos"], cos, sin, kv_heads)
    for b, n in enumerate(lengths):
        np.testing.assert_allclose(key[b, n:n + len(TREES[b])], want_k[b], rtol=1e-6, atol=1e-6)


def tree_reference(p: dict, heads: int, kv_heads: int, cos, sin, lengths: list[int]) -> np.ndarray:
    """float64: each node over the cache before the call and its ancestors and itself."""
    b_, s_, width = p["q"].shape
    hd = width // (heads + 2 * kv_heads)
    q = rotate(p["q"][..., :heads * hd], p["pos"], cos, sin, heads)
    k = rotate(p["q"][..., heads * hd:(heads + kv_heads) * hd], p["pos"], cos, sin, kv_heads)
    v = p["q"][..., (heads + kv_heads) * hd:].astype(np.float64)
    out = np.zeros((b_, s_, heads * hd))
    for b, n in enumerate(lengths):
        for j in range(s_):
            seen = p["tree"][b, j]
            keys = np.concatenate([p["past_k"][b, :n], k[b, seen]]).astype(np.float64)
            values = np.concatenate([p["past_v"][b, :n], v[b, seen]]).astype(np.float64)
            for h in range(heads):
                g = h // (heads // kv_heads)
                scores = keys[:, g * hd:(g + 1) * hd] @ q[b, j, h * hd:(h + 1) * hd] / np.sqrt(hd)
                w = np.exp(scores - scores.max())
                out[b, j, h * hd:(h + 1) * hd] = w @ values[:, g * hd:(g + 1) * hd] / w.sum()
    return out


def test_tree_attention_is_attention_over_ancestors():
    """Against float64: within float32 rounding (and the chain reference the plain op's own test checks)."""
    lengths = [9, 2]
    y, _, _, p, cos, sin = tree_outputs(4, 2, 32, lengths, seed=5, threads=2)
    np.testing.assert_allclose(y, tree_reference(p, 4, 2, cos, sin, lengths), rtol=2e-5, atol=2e-5)


def test_a_causal_mask_is_a_chain():
    """A chain step on a tree engine (the mask lower-triangular, consecutive positions): the bits of the op without a
    mask, output and caches, in place as the runtime binds them."""
    rng = np.random.default_rng(3)
    cos, sin = tables(32, CAPACITY)
    p = tree_problem(rng, 4, 2, 32, [6, 11])
    p["tree"] = np.broadcast_to(np.tril(np.ones((9, 9), bool)), (2, 9, 9)).copy()
    p["pos"] = np.array([[6], [11]]) + np.arange(9)[None]
    feeds = dict(q=p["q"], past_k=p["past_k"], past_v=p["past_v"], pos=p["pos"], cos=cos, sin=sin)
    chain = session(chain_model(4, 2)).run(None, feeds)
    tree = session(tree_model(4, 2)).run(None, {**feeds, "tree": p["tree"]})
    for a, b in zip(tree, chain, strict=True):
        np.testing.assert_array_equal(a, b)
    key = p["past_k"].copy()
    y = run_in_place(tree_model(4, 2), {**feeds, "tree": p["tree"]}, key, p["past_v"].copy())
    np.testing.assert_array_equal(y, chain[0])
    np.testing.assert_array_equal(key, chain[1])


@pytest.mark.parametrize("kernel", ["avx2", "portable"])
@pytest.mark.parametrize("heads,kv_heads,hd", [(8, 2, 64), (6, 2, 28), (12, 4, 44), (2, 1, 20)])
def test_every_kernel_gives_a_tree_the_same_bits(tmp_path, kernel, heads, kv_heads, hd):
    """SPECDEC_Q4_KERNEL=avx2 | portable: a tree step's outputs the same bits as the fastest kernel's (each equal to its
    paths as chains on that kernel), head dims that end in a masked tail of each kernel's dot product among them, and a
    cache that crosses the value pass's 64-slot block."""
    if kernel == "avx2" and rk.kernel_name(rk.kernel_library()) == "AVX2":
        pytest.skip("this CPU runs the AVX2 kernel already: no faster one to compare it with")
    shape = f"{heads}, {kv_heads}, {hd}, [70, 4], seed=1"
    fast = tree_outputs(heads, kv_heads, hd, [70, 4], seed=1)[0]
    here = os.path.dirname(__file__)  # (and tests/, for tree_paths)
    script = (f"import numpy as np, sys; sys.path[:0] = [{here!r}, {os.path.dirname(here)!r}]; import test_tree_cached_attention as t; "
              f"y, chained, *_ = t.tree_outputs({shape}); assert (y == chained).all(), 'tree != chain'; "
              f"np.save({str(tmp_path / 'y.npy')!r}, y)")
    subprocess.run([sys.executable, "-c", script], check=True, env={**os.environ, "SPECDEC_Q4_KERNEL": kernel})
    np.testing.assert_array_equal(np.load(tmp_path / "y.npy"), fast)


@pytest.mark.parametrize("bad,expected", [
    ("blind", "tree_mask[b][s][s] must be true"),
    ("shape", "tree_mask must be [batch, tokens, tokens]"),
])
def test_a_bad_tree_mask_is_one_clear_error(bad, expected):
    rng = np.random.default_rng(0)
    cos, sin = tables(16, CAPACITY)
    p = tree_problem(rng, 4, 2, 16, [3, 8])
    if bad == "blind":
        p["tree"][1, 4, 4] = False
    else:
        p["tree"] = p["tree"][:, :, :-1]
    feeds = dict(q=p["q"], past_k=p["past_k"], past_v=p["past_v"], pos=p["pos"], cos=cos, sin=sin, tree=p["tree"])
    with pytest.raises(Exception, match=expected.replace("[", r"\[")):
        session(tree_model(4, 2)).run(None, feeds)
    key, value = p["past_k"].copy(), p["past_v"].copy()
    with pytest.raises(Exception, match=expected.replace("[", r"\[")):  # bound in place: refused before any write
        run_in_place(tree_model(4, 2), feeds, key, value)
    np.testing.assert_array_equal(key, p["past_k"])
    np.testing.assert_array_equal(value, p["past_v"])
