"""Each Triton kernel of the torch executor against its torch reference, under the Triton interpreter on a CPU.

TRITON_INTERPRET=1 runs a kernel's Python source program by program with numpy: the same indexing, masks and
reduction order as on a GPU, at small shapes. Triton reads the variable when it is first imported: conftest.py sets
it on a host without a GPU (on a GPU host these tests run the compiled kernels). The weight-only GEMM's
rows are checked to be bit-identical whatever the call's row count: what keeps speculation on an int4 target exact.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton", reason="the Triton interpreter runs the kernels on a CPU (pip install triton)")

from specdec.formats.torch_layout import pack_int4  # noqa: E402
from specdec.runtime.backends.torch.kernels import attention, gemm, norm, rotary, silu  # noqa: E402

# the interpreter runs kernels on CPU tensors; a GPU host runs the same tests through the compiled kernels
DEVICE = "cpu" if os.environ.get("TRITON_INTERPRET") == "1" or not torch.cuda.is_available() else "cuda"


def rand(*shape, seed=0, dtype=torch.float32):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype).to(DEVICE)


def tensor(values, dtype=None):
    return torch.tensor(values, dtype=dtype, device=DEVICE)


@pytest.mark.parametrize("with_delta", [False, True])
@pytest.mark.parametrize("H", [64, 48])
def test_add_rmsnorm(with_delta, H):
    x, w = rand(5, H), rand(H, seed=1)
    delta = rand(5, H, seed=2) if with_delta else None
    want_norm, want_sum = norm.add_rmsnorm_ref(x, delta, w, 1e-6)
    got_norm, got_sum = norm.add_rmsnorm(x, delta, w, 1e-6)
    torch.testing.assert_close(got_sum, want_sum, rtol=0, atol=0)
    torch.testing.assert_close(got_norm, want_norm, rtol=1e-5, atol=1e-5)


def test_add_rmsnorm_reads_a_strided_view():
    both = rand(4, 2, 32)
    x = both[:, 0]  # rows 64 apart
    torch.testing.assert_close(norm.rmsnorm(x, rand(32, seed=3), 1e-5), norm.rmsnorm_ref(x, rand(32, seed=3), 1e-5), rtol=1e-5, atol=1e-5)


def test_silu_mul():
    gu = rand(3, 2 * 40)
    torch.testing.assert_close(silu.silu_mul(gu), silu.silu_mul_ref(gu), rtol=1e-5, atol=1e-6)


def cache(num_slots=3, kv_heads=2, capacity=24, head_dim=16, seed=5):
    return rand(num_slots, kv_heads, capacity, head_dim, seed=seed), rand(num_slots, kv_heads, capacity, head_dim, seed=seed + 1)


def test_rope_append_writes_the_cache_and_rotates_q():
    B, S, NH, KVH, HD = 2, 3, 4, 2, 16
    qkv = rand(B * S, (NH + 2 * KVH) * HD)  # the joined projection: q, k, v are strided views of it
    q, k, v = (t.view(B, S, -1, HD) for t in qkv.split([NH * HD, KVH * HD, KVH * HD], dim=-1))
    cos, sin = rand(24, HD // 2, seed=7), rand(24, HD // 2, seed=8)
    positions = tensor([[4, 5, 6], [9, 10, 10]])  # row 1: a tree (two tokens at depth 1)
    slots, start = tensor([2, 0]), tensor([4, 9])
    want_k, want_v = cache()
    got_k, got_v = want_k.clone(), want_v.clone()
    want_q = rotary.rope_append_ref(q, k, v, cos, sin, positions, want_k, want_v, slots, start)
    got_q = rotary.rope_append(q, k, v, cos, sin, positions, got_k, got_v, slots, start)
    torch.testing.assert_close(got_q, want_q, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(got_k, want_k, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(got_v, want_v, rtol=0, atol=0)
    untouched = cache()[0]
    assert torch.equal(got_k[1], untouched[1]) and torch.equal(got_k[2, :, :4], untouched[2, :, :4])  # only the written positions moved


def test_rotation_is_transformers_rotate_half():
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    HD, pos = 16, torch.tensor([[3, 7]])
    inv = 1.0 / (10000 ** (torch.arange(0, HD, 2).float() / HD))
    freqs = torch.arange(12).float()[:, None] * inv[None]
    x = rand(1, 2, 2, HD).cpu()  # [B, S, heads, hd]
    emb = torch.cat([freqs[pos], freqs[pos]], dim=-1)  # [1, S, hd]
    want, _ = apply_rotary_pos_emb(x.transpose(1, 2), x.transpose(1, 2), emb.cos(), emb.sin())
    torch.testing.assert_close(rotary.rotate_ref(x, freqs.cos(), freqs.sin(), pos), want.transpose(1, 2), rtol=1e-5, atol=1e-5)


def positions_of(start, S, tree=None):
    """Each call token's position: start + j in a chain, start + its depth in a tree (base.fill_tree)."""
    depth = torch.arange(S, device=start.device)[None].expand(len(start), S) if tree is None else tree.sum(-1) - 1
    return start[:, None] + depth


def a_tree(parents, S, rows):
    tree = torch.zeros(rows, S, S, dtype=torch.bool, device=DEVICE)
    for j, p in enumerate(parents):
        if p >= 0:
            tree[:, j] = tree[:, p]
        tree[:, j, j] = True
    return tree


@pytest.mark.parametrize("case", ["decode", "chain", "tree", "prefill"])
def test_attention(case):
    NH, HD = 4, 16
    ck, cv = cache(num_slots=4, capacity=80)
    if case == "decode":
        S, start, tree = 1, tensor([5, 0, 37]), None
    elif case == "chain":
        S, start, tree = 5, tensor([5, 1, 40]), None
    elif case == "prefill":
        S, start, tree = 40, tensor([0, 0, 3]), None  # several key blocks
    else:
        S, start = 6, tensor([5, 2, 33])
        tree = a_tree([-1, 0, 0, 1, 2, 3], S, 3)
        tree[1] = torch.tril(torch.ones(S, S, dtype=torch.bool, device=DEVICE))  # a chain among trees
    slots = tensor([3, 0, 1])
    q = rand(3, S, NH, HD, seed=11)
    live = int(start.max()) + S
    want = attention.attention_ref(q, ck, cv, slots, start, tree, HD ** -0.5, live)
    path = None if tree is None else attention.tree_path(tree)
    got = attention.attention(q, ck, cv, slots, start, positions_of(start, S, tree).contiguous(), path, HD ** -0.5)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_a_verified_token_gets_the_bits_of_a_one_token_step():
    """Token j of a 5-token chain and the same token fed alone after j cached ones: the same attention output, bit for bit."""
    NH, HD = 4, 16
    ck, cv = cache(num_slots=2, capacity=80)
    q = rand(1, 5, NH, HD, seed=12)
    slots, start = tensor([1]), tensor([30])
    wide = attention.attention(q, ck, cv, slots, start, positions_of(start, 5).contiguous(), None, HD ** -0.5)
    for j in range(5):
        one = attention.attention(q[:, j : j + 1].contiguous(), ck, cv, slots, start + j, (start + j)[:, None].contiguous(), None, HD ** -0.5)
        assert torch.equal(one[0, 0], wide[0, j]), j


def test_a_tree_node_gets_the_bits_of_a_one_token_step_on_its_path():
    """A tree call of 6 nodes at position 29 (their K/V in call order), and each node fed alone after its path was kept in
    contiguous positions (what compaction leaves): the same attention output, bit for bit."""
    NH, HD, S, start = 4, 16, 6, 29
    parents = [-1, 0, 0, 1, 2, 3]
    ck, cv = cache(num_slots=1, capacity=80)
    q = rand(1, S, NH, HD, seed=13)
    tree = a_tree(parents, S, 1)
    starts = tensor([start])
    wide = attention.attention(q, ck, cv, tensor([0]), starts, positions_of(starts, S, tree).contiguous(), attention.tree_path(tree), HD ** -0.5)
    for j in range(S):
        path = [i for i in range(S) if tree[0, j, i]]  # its ancestors by depth, then itself
        kept_k, kept_v = ck.clone(), cv.clone()
        kept_k[0, :, start : start + len(path)] = ck[0, :, [start + i for i in path]]
        kept_v[0, :, start : start + len(path)] = cv[0, :, [start + i for i in path]]
        at = tensor([start + len(path) - 1])
        one = attention.attention(q[:, j : j + 1].contiguous(), kept_k, kept_v, tensor([0]), at, at[:, None].contiguous(), None, HD ** -0.5)
        assert torch.equal(one[0, 0], wide[0, j]), j


def int_weight(K, N, bits, group, seed=0):
    rng = np.random.default_rng(seed)
    codes = rng.integers(0, 2**bits, size=(K, N), dtype=np.uint8)
    groups = -(-K // group)
    scales = rng.uniform(0.01, 0.1, size=(groups, N)).astype(np.float32)
    zeros = rng.integers(0, 2**bits, size=(groups, N), dtype=np.uint8)
    packed = pack_int4(codes) if bits == 4 else codes
    return (*(torch.from_numpy(a).to(DEVICE) for a in (packed, scales, zeros)), codes)


@pytest.mark.parametrize("bits, K, group", [(4, 96, 32), (4, 75, 75), (8, 70, 64)])  # 75: an odd K, per-channel
def test_int_linear(bits, K, group):
    q, s, z, codes = int_weight(K, 40, bits, group)
    ref = gemm.dequantize_ref(q, s, z, bits, group, K, torch.float32)
    want_w = (codes.astype(np.float32) - np.repeat(z.cpu().numpy(), group, 0)[:K]) * np.repeat(s.cpu().numpy(), group, 0)[:K]
    np.testing.assert_allclose(ref.cpu().numpy(), want_w, rtol=1e-6)  # the reference dequantizes as formats/torch_layout.py says
    x = rand(7, K, seed=3)
    torch.testing.assert_close(gemm.int_linear(x, q, s, z, bits, group), gemm.int_linear_ref(x, q, s, z, bits, group), rtol=1e-5, atol=1e-5)


# FIXED, tile_for's dense and int tiles at shapes that split (2 parts at K = 512), others of one, three and two parts
TILES = [gemm.FIXED, gemm.tile_for(4096, 512), gemm.tile_for(4096, 512, 4), gemm.Tile(64, 64, 64, num_stages=3),
         gemm.Tile(16, 32, 32, split=3), gemm.Tile(32, 16, 64, split=2, num_stages=2)]


@pytest.mark.parametrize("bits, group", [(4, 64), (4, 128), (8, 64), (4, 1 << 30)])  # 1 << 30: per channel (weights.PER_CHANNEL)
def test_a_chunk_within_one_group_reads_its_zeros_and_scales_once_with_the_same_bits(bits, group):
    """ONE_GROUP (the group a multiple of BLOCK_K) loads a chunk's zero and scale rows once: bit for bit the per-element
    loads' result, with K ending inside a chunk (rows past K have codes 0 but a zero point) and a split reduction."""
    K, N, M = 200, 40, 6
    q, s, z, _ = int_weight(K, N, bits, group)
    x = rand(M, K, seed=8)
    tile = gemm.Tile(16, 32, 64, split=2)
    k_per = tile.k_per_split(K)
    parts = -(-K // k_per)
    outs = []
    for one_group in (True, False):
        out = torch.zeros((parts, M, N), dtype=torch.float32, device=DEVICE)
        gemm._int_kernel[(1, 2, parts)](x, q, s, z, out, M, N, K, k_per, group, x.stride(0), out.stride(1), BITS=bits, IEEE=True, SPLIT=True,
                                         ONE_GROUP=one_group, BLOCK_M=16, BLOCK_N=32, BLOCK_K=64)
        outs.append(out)
    assert torch.equal(outs[0], outs[1])
    torch.testing.assert_close(outs[0].sum(0), gemm.int_linear_ref(x, q, s, z, bits, group), rtol=1e-4, atol=1e-4)


def test_tile_for_splits_narrow_layers_within_whole_chunks():
    """The 8B's o_proj and down_proj split in 4 parts, its qkv, gate_up and LM head not; a short reduction splits less
    (two chunks of BLOCK_K a part at least); int layers split but the LM head; a split's partials stay in PARTIAL_BYTES."""
    assert [gemm.tile_for(n, k).split for n, k in ((4096, 4096), (4096, 14336), (6144, 4096), (28672, 4096), (128256, 4096))] == [4, 4, 1, 1, 1]
    assert gemm.tile_for(4096, 512).split == 2 and gemm.tile_for(2048, 2048).split == 8 and gemm.tile_for(4096, 128).split == 1
    assert [gemm.tile_for(n, 4096, 4).split for n in (4096, 28672, 128256)] == [4, 4, 1]
    rows = gemm._chunk_rows(4, 28672, 16)
    assert rows % 16 == 0 and 4 * 4 * rows * 28672 <= gemm.PARTIAL_BYTES and gemm._chunk_rows(8, 10**9, 64) == 64


def test_dense_linear_and_a_float32_output():
    x, w = rand(9, 70), rand(33, 70, seed=1)
    torch.testing.assert_close(gemm.linear(x, w), gemm.linear_ref(x, w), rtol=1e-5, atol=1e-5)
    assert gemm.linear(x.half(), w.half(), out_dtype=torch.float32).dtype == torch.float32


@pytest.mark.parametrize("tile", TILES[1:] + [gemm.Tile(16, 16, 32, split=8)], ids=str)  # split 8 of K = 200's 7 chunks: 7 parts
def test_a_split_reduction_sums_every_part_once(tile, monkeypatch):
    """Split tiles against the reference, dense and int4, with a long call run in chunks of rows (PARTIAL_BYTES: 16 rows)
    through their partials: every k in exactly one part, every row in exactly one chunk, float32 outputs too."""
    monkeypatch.setattr(gemm, "PARTIAL_BYTES", 4 * tile.split * 40 * 16)
    x, w = rand(23, 200, seed=5), rand(40, 200, seed=6)
    torch.testing.assert_close(gemm.linear(x, w, tile=tile), gemm.linear_ref(x, w), rtol=1e-5, atol=1e-5)
    if tile.split > 1:  # the parts are added in part order: ((p0 + p1) + p2) ..., bit for bit
        k_per = tile.k_per_split(200)
        parts = [gemm.linear(x[:, k0 : k0 + k_per], w[:, k0 : k0 + k_per].contiguous(), tile=gemm.Tile(tile.block_m, tile.block_n, tile.block_k))
                 for k0 in range(0, 200, k_per)]
        in_order = parts[0]
        for part in parts[1:]:
            in_order = in_order + part
        assert torch.equal(gemm.linear(x, w, tile=tile), in_order)
    q, s, z, _ = int_weight(200, 40, 4, 64)
    got = gemm.int_linear(x, q, s, z, 4, 64, out_dtype=torch.float32, tile=tile)
    torch.testing.assert_close(got, gemm.int_linear_ref(x, q, s, z, 4, 64), rtol=1e-5, atol=1e-5)
    assert got.dtype == torch.float32


def test_a_tile_the_gpu_cannot_hold_falls_back_for_every_later_call(monkeypatch):
    """A tile whose pipeline stages exceed the GPU's shared memory (Triton's OutOfResources at its first launch) runs with 2
    stages, then as FIXED, and every later call starts from the tile that ran: a layer's tile never depends on the call."""
    class OutOfResources(Exception):  # triton.runtime.errors' name, which _launch recognises
        pass

    monkeypatch.setattr(gemm, "_SMALLER", {})
    ran = []

    def launch(out, rows, m, k_per, grid, **meta):
        ran.append(meta["num_stages"] if meta["BLOCK_M"] != 16 else "fixed")
        if meta["BLOCK_M"] != 16 and meta["num_stages"] > limit:  # FIXED always fits
            raise OutOfResources("shared memory")

    kind = ("dense", torch.float32)
    for limit, tries in ((2, [4, 2]), (1, [2, "fixed"])):
        ran.clear()
        gemm._launch(launch, 3, 8, 64, torch.float32, "cpu", gemm.Tile(64, 64, 64, num_stages=4), kind, False)
        assert ran == tries, limit
    ran.clear()
    gemm._launch(launch, 3, 8, 64, torch.float32, "cpu", gemm.Tile(64, 64, 64, num_stages=4), kind, False)
    assert ran == ["fixed"]  # straight to the tile that ran
    ran.clear()
    limit = 4  # another kernel or dtype compiles a binary of its own: the same tile is tried for it
    gemm._launch(launch, 3, 8, 64, torch.float32, "cpu", gemm.Tile(64, 64, 64, num_stages=4), ("dense", torch.bfloat16), False)
    assert ran == [4]
    ran.clear()  # unsummed: a split tile that fell back to 2 stages still leaves its sum to the caller, FIXED (no split) cannot
    limit = 2
    got = gemm._launch(launch, 3, 8, 256, torch.float32, "cpu", gemm.Tile(32, 32, 64, split=2, num_stages=4), kind, True)
    assert ran == [4, 2] and isinstance(got, gemm.Partials)
    limit = 1
    got = gemm._launch(launch, 3, 8, 256, torch.float32, "cpu", gemm.Tile(32, 16, 64, split=2, num_stages=4), kind, True)
    assert isinstance(got, torch.Tensor)
    with pytest.raises(ValueError):  # any other error is the caller's
        gemm._launch(lambda *a, **k: (_ for _ in ()).throw(ValueError("bad")), 3, 8, 64, torch.float32, "cpu", gemm.Tile(32, 32, 64), kind, False)


SPLIT = gemm.Tile(16, 32, 32, split=4)  # K = 200's 7 chunks of 32 in 4 parts (2, 2, 2, 1 chunks)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["float32", "float16"])
@pytest.mark.parametrize("bits", [0, 4])
def test_a_split_layers_partials_summed_in_the_norm_give_the_bits_of_its_output(bits, dtype, monkeypatch):
    """linear(..., unsummed=True) on a split tile returns its float32 Partials; their sum() is bit for bit the output the
    layer returns summed, and add_rmsnorm adding them itself (the residual add after o_proj / down_proj) gives the bits of
    add_rmsnorm over that output: the sum and the normalised row. In float16 the float32 sum must be rounded to the
    activation dtype before the add, as the sum kernel rounds it. A call longer than one chunk of rows comes back summed."""
    x = rand(9, 200, seed=31, dtype=dtype)
    if bits:
        q, s, z, _ = int_weight(200, 40, 4, 32)
        run = lambda rows, **kw: gemm.int_linear(rows, q, s, z, 4, 32, tile=SPLIT, **kw)  # noqa: E731
    else:
        w = rand(40, 200, seed=32, dtype=dtype)
        run = lambda rows, **kw: gemm.linear(rows, w, tile=SPLIT, **kw)  # noqa: E731
    whole = run(x)
    parts = run(x, unsummed=True)
    assert isinstance(parts, gemm.Partials) and parts.parts.shape == (4, 9, 40) and parts.shape == (9, 40)
    assert torch.equal(parts.sum(), whole) and torch.equal(gemm.summed(parts), whole) and gemm.summed(whole) is whole
    residual, weight = rand(9, 40, seed=33, dtype=dtype), rand(40, seed=34, dtype=dtype)
    want_norm, want_sum = norm.add_rmsnorm(residual, whole, weight, 1e-6)
    got_norm, got_sum = norm.add_rmsnorm(residual, parts, weight, 1e-6)
    assert torch.equal(got_sum, want_sum) and torch.equal(got_norm, want_norm)
    monkeypatch.setattr(gemm, "PARTIAL_BYTES", 4 * 4 * 40 * 16)  # 16 rows a chunk: a 23-row call is summed chunk by chunk
    long = rand(23, 200, seed=35, dtype=dtype)
    assert not isinstance(run(long, unsummed=True), gemm.Partials) and torch.equal(run(long, unsummed=True), run(long))


def test_only_the_stable_choice_leaves_a_split_layers_sum_to_the_norm():
    """TritonOps.linear(..., into_norm=True) returns Partials for a split dense layer under "stable" only; "unfused",
    "fixed" and "cublas" (torch's matmul) return the output, as do a layer with a bias (added to the output) and an
    unsplit layer. A split int4 layer leaves its sum to the norm under "cublas" too (it runs on specdec's GEMM there)."""
    from specdec.runtime.backends.torch.ops import TritonOps
    from specdec.runtime.backends.torch.weights import Linear

    x = rand(3, 512)
    split = Linear(weight=rand(64, 512, seed=1))  # tile_for(64, 512): 2 parts
    assert gemm.tile_for(64, 512).split == 2 and gemm.tile_for(64, 128).split == 1
    for choice in ("stable", "unfused", "fixed", "cublas"):
        y = TritonOps(choice).linear(x, split, into_norm=True)
        assert isinstance(y, gemm.Partials) == (choice == "stable"), choice
        torch.testing.assert_close(gemm.summed(y), gemm.linear_ref(x, split.weight), rtol=1e-5, atol=1e-5)
    ops = TritonOps("stable")
    assert isinstance(ops.linear(x, split), torch.Tensor)  # not into a norm
    assert isinstance(ops.linear(x, Linear(weight=split.weight, bias=rand(64, seed=2)), into_norm=True), torch.Tensor)
    assert isinstance(ops.linear(x[:, :128], Linear(weight=rand(64, 128, seed=3)), into_norm=True), torch.Tensor)
    q, s, z, _ = int_weight(512, 64, 4, 128)
    int4 = Linear(qweight=q, scales=s, zeros=z, bits=4, group_size=128)
    assert [isinstance(TritonOps(c).linear(x, int4, into_norm=True), gemm.Partials) for c in ("stable", "unfused", "fixed", "cublas")] == [
        True, False, False, True]


def test_partials_of_another_dtype_are_summed_before_the_norm():
    """add_rmsnorm's fused sum rounds to the residual's dtype: Partials meant for another dtype are summed to it first."""
    parts = gemm.Partials(rand(3, 4, 32, seed=36), torch.float16)
    residual, weight = rand(4, 32, seed=37), rand(32, seed=38)
    summed = parts.sum()
    assert summed.dtype == torch.float16
    want = norm.add_rmsnorm(residual, summed, weight, 1e-6)
    got = norm.add_rmsnorm(residual, parts, weight, 1e-6)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


HALF = pytest.mark.skipif(DEVICE == "cpu", reason="bfloat16 kernels run on a GPU (the interpreter computes with numpy, which has no bfloat16)")




@pytest.mark.parametrize("tile", TILES, ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, pytest.param(torch.bfloat16, marks=HALF)], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("bits", [4, 8, 0])  # 0: the dense kernel
def test_a_rows_result_does_not_depend_on_the_calls_row_count(bits, dtype, tile, monkeypatch):
    """Rows 0..M-1 of calls of M = 1, 2, 5, 17 and 33 rows (1 to 3 row tiles): each row bit-identical to the 1-row call of it,
    with a tile of one part and with the reduction split in parts (float32 partials added in part order), a split call
    of more than 16 rows run in chunks of 16 rows."""
    K, N = 512, 48  # tile_for's split tiles split K = 512 in 2 parts
    monkeypatch.setattr(gemm, "PARTIAL_BYTES", 4 * tile.split * N * 16)
    x = rand(33, K, seed=21, dtype=dtype)
    if bits:
        q, s, z, _ = int_weight(K, N, bits, 32)
        run = lambda rows: gemm.int_linear(rows, q, s, z, bits, 32, tile=tile)  # noqa: E731
    else:
        w = rand(N, K, seed=22, dtype=dtype)
        run = lambda rows: gemm.linear(rows, w, tile=tile)  # noqa: E731
    if DEVICE == "cpu" and not numpy_keeps_a_rows_bits_anywhere_in_a_block(tile.block_m, tile.block_k, tile.block_n):
        # The interpreter computes tl.dot with numpy's matmul, and this CPU's BLAS (OpenBLAS' Haswell kernels: AVX2
        # without AVX-512) sums a block's rows in orders that depend on the row's place in it. What the kernel decides,
        # whether a row's bits depend on the call's row count, is then checked with every row at its own place.
        whole = run(x)
        for M in (1, 2, 5, 17, 33):
            assert torch.equal(run(x[:M]), whole[:M]), M
        return
    alone = torch.cat([run(x[i : i + 1]) for i in range(33)])
    for M in (2, 5, 17, 33):
        assert torch.equal(run(x[:M]), alone[:M]), M
        assert torch.equal(run(x[33 - M :]), alone[33 - M :]), M  # the same rows at other positions in the tile


def numpy_keeps_a_rows_bits_anywhere_in_a_block(rows: int, depth: int, cols: int) -> bool:
    """Whether numpy's float32 matmul of a [rows, depth] x [depth, cols] block gives each row the bits it gets at row 0."""
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((rows, depth), dtype=np.float32), rng.standard_normal((depth, cols), dtype=np.float32)
    full = a @ b
    return all(np.array_equal(full[i], (np.pad(a[i : i + 1], ((0, rows - 1), (0, 0))) @ b)[0]) for i in range(rows))


def test_the_dense_choice_sets_every_layers_tile(monkeypatch):
    """TritonOps' "stable" runs each layer on tile_for's tile, "fixed" every layer (int ones too) on FIXED, and an unknown
    choice is refused naming the choices."""
    from specdec.runtime.backends.torch.ops import TritonOps
    from specdec.runtime.backends.torch.weights import Linear

    seen = []
    monkeypatch.setattr(gemm, "_launch", lambda launch, M, N, K, dtype, device, tile, kind, unsummed: seen.append(tile) or torch.zeros(M, N))
    x = rand(3, 512)
    dense = Linear(weight=rand(4096, 512, seed=1))
    q, s, z, _ = int_weight(512, 4096, 4, 128)
    int4 = Linear(qweight=q, scales=s, zeros=z, bits=4, group_size=128)
    shaped = [gemm.tile_for(4096, 512), gemm.tile_for(4096, 512, 4)]
    for choice, want in (("stable", shaped), ("unfused", shaped), ("fixed", [gemm.FIXED, gemm.FIXED])):
        seen.clear()
        ops = TritonOps(choice)
        ops.linear(x, dense)
        ops.linear(x, int4)
        assert seen == want, choice
    assert seen[0] != gemm.tile_for(4096, 512)  # the two choices differ at this shape
    with pytest.raises(ValueError, match="stable"):
        TritonOps("fast")


@pytest.mark.skipif(DEVICE != "cpu", reason="the mechanism, on tiles whose bits the interpreter fixes; on a GPU test_torch_cuda "
                    "checks the real 16-row tile (a GPU may also run a tile too big for its memory with fewer stages)")
def test_small_calls_take_the_16_row_tile_only_where_its_bits_agree(monkeypatch):
    """A dense call of at most 16 rows runs on small_tile_for's tile once that tile gave the shape tile's bits for the
    layer's shape (checked at the first such call); a tile that gives other bits is refused and the call takes the shape
    tile; a 17-row call, an explicit tile and ``small=False`` always take the shape tile. Whichever runs, a row's bits are
    the shape tile's. (Stages do not change the interpreter's sums; BLOCK_K does: 4 float32 adds per 128 instead of 1.
    Which tiles agree on a GPU is test_torch_cuda's: the 16-row tile on the demo pair.)"""
    K, N = 256, 96  # K = 2 x BLOCK_K: the shape tile does not split
    shape = gemm.tile_for(N, K)
    assert shape.split == 1
    w, x = rand(N, K, seed=40), rand(17, K, seed=41)
    want = gemm.linear(x, w, small=False)
    seen = []
    launch = gemm._launch  # the tile each call asks for
    monkeypatch.setattr(gemm, "_launch", lambda run, M, N, K, dtype, device, tile, kind, unsummed: seen.append((M, tile)) or launch(
        run, M, N, K, dtype, device, tile, kind, unsummed))
    # agreeing: the shape tile with 5 stages (on this CPU numpy's matmul itself gives a 16-row block other bits than a 64-row
    # one, see numpy_keeps_a_rows_bits_anywhere_in_a_block); disagreeing: 16 rows and BLOCK_K 32
    for little, agrees in ((gemm.replace(shape, num_stages=5), True), (gemm.replace(shape, block_m=16, block_k=32), False)):
        monkeypatch.setattr(gemm, "_SMALL_AGREES", {})
        monkeypatch.setattr(gemm, "small_tile_for", lambda tile, N, little=little: little)
        seen.clear()
        for M in (1, 5, 16, 17):
            assert torch.equal(gemm.linear(x[:M], w), want[:M]), (little, M)
        assert list(gemm._SMALL_AGREES.values()) == [agrees]  # asked once, at the first small call
        # the check's two 16-row probes, then the calls: 1, 5 and 16 rows on the small tile where it agrees, 17 on the shape tile
        assert seen[:2] == [(16, shape), (16, little)]
        assert seen[2:] == [(1, little if agrees else shape), (5, little if agrees else shape), (16, little if agrees else shape), (17, shape)]
        seen.clear()
        gemm.linear(x[:1], w, small=False)
        gemm.linear(x[:1], w, tile=shape)
        assert seen == [(1, shape), (1, shape)]


def test_which_layers_have_a_small_call_tile():
    """small_tile_for: 16 rows and 5 stages on the shape tile of an unsplit layer of at most 32768 columns (the 8B
    q|k|v and gate|up); none for a split layer (o_proj, down_proj) or the 8B LM head (not measured)."""
    for N, K in ((6144, 4096), (28672, 4096)):
        little = gemm.small_tile_for(gemm.tile_for(N, K), N)
        assert little == gemm.replace(gemm.tile_for(N, K), block_m=16, num_stages=5) and little.split == 1
    for N, K in ((4096, 4096), (4096, 14336)):
        assert gemm.tile_for(N, K).split > 1 and gemm.small_tile_for(gemm.tile_for(N, K), N) is None
    assert gemm.small_tile_for(gemm.tile_for(128256, 4096), 128256) is None
