"""Linear layers: y = x @ W (+ bias), W dense or weight-only int8/int4 (W8A16, W4A16) with per-group scales.

Each layer has one tile (Tile: BLOCK_M x BLOCK_N, BLOCK_K along the reduction, the reduction's number of parts),
chosen from its shape alone (tile_for), and the row count M is not specialised on: one compiled kernel serves every
call of a layer. Each output element is then the same float32 sum in the same order, of the same products, in every
call; a split reduction's parts are float32 partials added in part order, by a second kernel or, for o_proj and
down_proj, by the next residual add + RMSNorm (Partials, norm.add_rmsnorm). Calls of at most SMALL_ROWS rows may take
a 16-row tile instead, where small_tile_for offers one and it gave the shape tile's bits on this device (checked once
per shape at first use: _small_tile_agrees). So a row's result
does not depend on how many rows the call has, a token verified among k + 1 gets the bits of a one-token step, and
speculation on the target is exact at every batch size (the principle of the CPU int4 kernel, hardware/kernels/).
The programs of one column tile sit next to each other in launch order (M varies fastest), so a weight tile read
from memory by the first is in L2 for the others.

Integer weights (formats/torch_layout.py): codes [K, N] (int8) or [ceil(K / 2), N] (int4: row r = input rows 2r and
2r + 1 in its low and high nibbles), w[k, n] = (code - zeros[k // group, n]) * scales[k // group, n] in float32,
rounded to the activation dtype, then multiplied as a dense weight would be. int4 needs no interleaving: the even
and odd input rows are two dot products of half a tile each, in a fixed order.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cache

import torch

from ._triton import kernel

tl = None  # triton.language, bound when a kernel of this module first launches (_triton.LazyKernel): the references need no Triton


@dataclass(frozen=True)
class Tile:
    """One launch configuration: a BLOCK_M x BLOCK_N output tile, BLOCK_K along the reduction, and ``split`` parts of
    the reduction (each part's partial sums land in float32, added in part order after: Partials). A layer's tile is
    chosen from its shape alone (tile_for), never from the call's row count, so a row's bits stay those of a 1-row call;
    the one exception, small_tile_for's tile for calls of at most SMALL_ROWS rows, is taken only where a check on the
    device found it gives the same bits (_small_tile_agrees)."""

    block_m: int = 16
    block_n: int = 32
    block_k: int = 64
    split: int = 1
    num_warps: int = 4
    num_stages: int = 3

    def k_per_split(self, K: int) -> int:
        """Reduction length each part covers: a whole number of BLOCK_K, so no chunk straddles two parts."""
        chunks = -(-K // self.block_k)
        return -(-chunks // self.split) * self.block_k

    def __str__(self) -> str:
        return f"{self.block_m}x{self.block_n}x{self.block_k} s{self.split} w{self.num_warps} st{self.num_stages}"


FIXED = Tile()  # one tile for every layer (16 x 32, BLOCK_K 64, no split): the kernels' first tile, kept for comparing
DENSE_TILE = Tile(64, 64, 128, num_stages=3)  # tile_for's dense tile, before its split
INT_TILE = Tile(16, 64, 128, num_stages=4)  # tile_for's int8 / int4 tile, before its split
SMALL_ROWS = 16  # a call of at most this many rows may run on small_tile_for's tile
PARTIAL_BYTES = 64 << 20  # a split layer runs a long call in chunks of rows whose float32 partials fit in this


@cache  # a pure function of the shape, asked at every eager call of a layer (dataclasses.replace costs microseconds)
def tile_for(N: int, K: int, bits: int = 0) -> Tile:
    """The tile of a [K -> N] layer (bits 0: dense), from its shape alone (see Tile), as measured on an H200 by
    benchmarks/bench_gemm.py (docs/gpu.md#the-gemm-tiles).

    Dense: 64 x 64 x 128. A 64-row tile reads each weight tile once for up to 64 rows, where 16-row tiles re-read it per
    16 (a 16 x 5-token verification read the weights 5 times); at 1 row a step's GEMMs are within 6% of the fastest
    tile per layer (q|k|v alone 24%: kept for the 80-row calls). A layer
    with at most 64 column tiles (o_proj and down_proj at 4096 columns: under half an H200's 132 SMs) splits its
    reduction so that enough programs stream weights at once.
    int8 / int4: 16 x 64 x 128, the reduction in 4 parts (dequantizing is the bottleneck: more programs, fewer rows
    each), except a layer wider than 32768 columns (the LM head), whose partials would be large."""
    if bits:
        return _split(INT_TILE, 4 if N <= 32768 else 1, K)
    col_tiles = -(-N // DENSE_TILE.block_n)
    return _split(DENSE_TILE, min(8, 256 // col_tiles) if col_tiles <= 64 else 1, K)


@cache
def small_tile_for(tile: Tile, N: int) -> Tile | None:
    """The tile for calls of at most SMALL_ROWS rows (decode at batch 1 to 16, verification at batch 1 to 3) of a dense
    layer of N columns whose shape tile is ``tile``, or None: ``tile`` with 16 rows and 5 pipeline stages, for a layer
    whose tile does not split and has at most 32768 columns (on an H200 at 1 row: q|k|v 15.9 us against 20.5, gate|up
    56.7 against 59.1, each giving the shape tile's bits; a split layer gained under 1 us; the 8B LM head, 128256
    columns, was not measured, and an LM head within 32768 columns takes it as any layer: bench_gemm.py --tiles rows).
    Used only where it gives the shape tile's bits on the device (_small_tile_agrees), so a row's bits stay those of a
    one-row call."""
    if tile.split != 1 or N > 32768:
        return None
    return replace(tile, block_m=SMALL_ROWS, num_stages=5)


def _split(tile: Tile, split: int, K: int) -> Tile:
    """``tile`` in at most ``split`` parts of at least two chunks of BLOCK_K each."""
    return replace(tile, split=max(1, min(split, K // (2 * tile.block_k))))


def _chunk_rows(parts: int, N: int, block_m: int) -> int:
    """Rows per launch of a split layer: float32 partials [parts, rows, N] within PARTIAL_BYTES, whole row tiles."""
    rows = PARTIAL_BYTES // (4 * parts * N)
    return max(block_m, rows // block_m * block_m)


# -- references ----------------------------------------------------------------------------
def dequantize_ref(qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, bits: int, group: int, K: int,
                   dtype: torch.dtype) -> torch.Tensor:
    """[K, N] in ``dtype``: (code - zero) * scale per (group of input rows, column), in float32, then rounded."""
    if bits == 4:
        codes = torch.stack([qweight & 0x0F, qweight >> 4], dim=1).reshape(-1, qweight.shape[1])[:K]  # rows 2r, 2r + 1
    else:
        codes = qweight
    g = torch.arange(K, device=qweight.device) // group
    return ((codes.float() - zeros[g].float()) * scales[g]).to(dtype)


def linear_ref(x: torch.Tensor, weight: torch.Tensor, out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """x [M, K] @ weight [N, K]^T (F.linear's layout) -> [M, N] in out_dtype (default x's)."""
    return torch.nn.functional.linear(x, weight).to(out_dtype or x.dtype)


def int_linear_ref(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, bits: int, group: int,
                   out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """x [M, K] @ dequantize_ref(...) [K, N] -> [M, N]."""
    return (x @ dequantize_ref(qweight, scales, zeros, bits, group, x.shape[1], x.dtype)).to(out_dtype or x.dtype)


# -- kernels -------------------------------------------------------------------------------
@kernel(do_not_specialize=["M"])
def _dense_kernel(x_ptr, w_ptr, y_ptr, M, N, K, K_PER, x_stride, w_stride, y_stride,
                  IEEE: tl.constexpr, SPLIT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """y [M, N] = x @ w^T, or with SPLIT part program_id(2)'s float32 partial sums at y + part * M * N."""
    m = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)  # int64: m * stride passes 2**31 in a long prefill
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    k_begin = tl.program_id(2) * K_PER
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(k_begin, tl.minimum(k_begin + K_PER, K), BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(x_ptr + m[:, None] * x_stride + k[None, :], mask=(m[:, None] < M) & (k[None, :] < K), other=0.0)
        w = tl.load(w_ptr + n[None, :] * w_stride + k[:, None], mask=(n[None, :] < N) & (k[:, None] < K), other=0.0)  # [BLOCK_K, BLOCK_N]
        if IEEE:
            acc += tl.dot(x, w, input_precision="ieee")
        else:
            acc += tl.dot(x, w)
    ok = (m[:, None] < M) & (n[None, :] < N)
    if SPLIT:
        tl.store(y_ptr + tl.program_id(2).to(tl.int64) * M * N + m[:, None] * N + n[None, :], acc, mask=ok)
    else:
        tl.store(y_ptr + m[:, None] * y_stride + n[None, :], acc.to(y_ptr.dtype.element_ty), mask=ok)


@kernel(do_not_specialize=["M"])
def _int_kernel(x_ptr, q_ptr, s_ptr, z_ptr, y_ptr, M, N, K, K_PER, GROUP, x_stride, y_stride,
                BITS: tl.constexpr, IEEE: tl.constexpr, SPLIT: tl.constexpr, ONE_GROUP: tl.constexpr, BLOCK_M: tl.constexpr,
                BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """ONE_GROUP: GROUP is a multiple of BLOCK_K, so a chunk's input rows share one row of zeros and scales, loaded once
    ([1, BLOCK_N]) instead of per element: the same values, the same float32 arithmetic."""
    m = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)  # int64: m * stride passes 2**31 in a long prefill
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    m_ok = m[:, None] < M
    n_ok = n[None, :] < N
    k_begin = tl.program_id(2) * K_PER
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(k_begin, tl.minimum(k_begin + K_PER, K), BLOCK_K):
        if ONE_GROUP:
            zero_row = tl.load(z_ptr + (k0 // GROUP) * N + n[None, :], mask=n_ok, other=0).to(tl.float32)  # [1, BLOCK_N]
            scale_row = tl.load(s_ptr + (k0 // GROUP) * N + n[None, :], mask=n_ok, other=0.0)
        if BITS == 4:
            half = tl.arange(0, BLOCK_K // 2)
            packed = tl.load(q_ptr + (k0 // 2 + half)[:, None] * N + n[None, :], mask=((k0 + 2 * half)[:, None] < K) & n_ok, other=0)
            for part in tl.static_range(2):  # the even input rows (low nibbles), then the odd ones
                k = k0 + 2 * half + part
                k_ok = k[:, None] < K
                codes = (packed >> (4 * part)) & 0x0F
                x = tl.load(x_ptr + m[:, None] * x_stride + k[None, :], mask=m_ok & (k[None, :] < K), other=0.0)
                if ONE_GROUP:  # rows past K: codes 0 but a zero point, so w != 0 there; x is 0 there
                    w = ((codes.to(tl.float32) - zero_row) * scale_row).to(x.dtype)  # [BLOCK_K / 2, BLOCK_N]
                else:
                    zero = tl.load(z_ptr + (k // GROUP)[:, None] * N + n[None, :], mask=k_ok & n_ok, other=0)
                    scale = tl.load(s_ptr + (k // GROUP)[:, None] * N + n[None, :], mask=k_ok & n_ok, other=0.0)
                    w = ((codes.to(tl.float32) - zero.to(tl.float32)) * scale).to(x.dtype)
                if IEEE:
                    acc += tl.dot(x, w, input_precision="ieee")
                else:
                    acc += tl.dot(x, w)
        else:
            k = k0 + tl.arange(0, BLOCK_K)
            k_ok = k[:, None] < K
            codes = tl.load(q_ptr + k[:, None] * N + n[None, :], mask=k_ok & n_ok, other=0)
            x = tl.load(x_ptr + m[:, None] * x_stride + k[None, :], mask=m_ok & (k[None, :] < K), other=0.0)
            if ONE_GROUP:
                w = ((codes.to(tl.float32) - zero_row) * scale_row).to(x.dtype)
            else:
                zero = tl.load(z_ptr + (k // GROUP)[:, None] * N + n[None, :], mask=k_ok & n_ok, other=0)
                scale = tl.load(s_ptr + (k // GROUP)[:, None] * N + n[None, :], mask=k_ok & n_ok, other=0.0)
                w = ((codes.to(tl.float32) - zero.to(tl.float32)) * scale).to(x.dtype)
            if IEEE:
                acc += tl.dot(x, w, input_precision="ieee")
            else:
                acc += tl.dot(x, w)
    if SPLIT:
        tl.store(y_ptr + tl.program_id(2).to(tl.int64) * M * N + m[:, None] * N + n[None, :], acc, mask=m_ok & n_ok)
    else:
        tl.store(y_ptr + m[:, None] * y_stride + n[None, :], acc.to(y_ptr.dtype.element_ty), mask=m_ok & n_ok)


@kernel(do_not_specialize=["MN"])
def _sum_parts_kernel(p_ptr, y_ptr, MN, PARTS: tl.constexpr, BLOCK: tl.constexpr):
    """y[i] = p[0, i] + p[1, i] + ... in part order, in float32 (y contiguous [M, N], p [PARTS, M, N])."""
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    ok = i < MN
    acc = tl.load(p_ptr + i, mask=ok, other=0.0)
    for part in tl.static_range(1, PARTS):
        acc += tl.load(p_ptr + part * MN + i, mask=ok, other=0.0)
    tl.store(y_ptr + i, acc.to(y_ptr.dtype.element_ty), mask=ok)


SUM_BLOCK = 1024


@dataclass
class Partials:
    """A split layer's output before its sum: float32 partials [parts, M, N] whose sum in part order, rounded to ``dtype``,
    is the output (what _sum_parts_kernel writes). A consumer that adds them itself (norm.add_rmsnorm: the residual add
    after o_proj and down_proj) saves the sum's kernel and the output's round trip through memory, with the same bits."""

    parts: torch.Tensor  # [parts, M, N] float32, contiguous
    dtype: torch.dtype

    @property
    def shape(self) -> torch.Size:
        return self.parts.shape[1:]

    def sum(self) -> torch.Tensor:
        """The output [M, N] in ``dtype``."""
        _, M, N = self.parts.shape
        return _sum_parts(self.parts, torch.empty((M, N), dtype=self.dtype, device=self.parts.device))


def _sum_parts(partial: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """y [rows, N] (contiguous) = partial [parts, rows, N] summed in part order (_sum_parts_kernel)."""
    parts, rows, N = partial.shape
    _sum_parts_kernel[(-(-(rows * N) // SUM_BLOCK),)](partial, y, rows * N, PARTS=parts, BLOCK=SUM_BLOCK)
    return y


def summed(y: torch.Tensor | Partials) -> torch.Tensor:
    """A layer's output as a tensor, whether or not its sum was left to the consumer."""
    return y.sum() if isinstance(y, Partials) else y


# (kernel, activation dtype, tile) this GPU's shared memory cannot hold -> the tile run instead (found at its first launch):
# per kernel and dtype, as each compiles its own binary (float32 needs twice bfloat16's shared memory)
_SMALLER: dict[tuple, Tile] = {}


def _launch(launch, M: int, N: int, K: int, dtype: torch.dtype, device: torch.device, tile: Tile, kind: tuple,
            unsummed: bool) -> torch.Tensor | Partials:
    """Run ``launch(out, rows, M, K_PER, grid)`` over x's rows into a new [M, N] tensor of ``dtype``: at once, or for a
    split tile in chunks of _chunk_rows rows through float32 partials that _sum_parts_kernel adds in part order.
    ``unsummed``: a split call that fits in one chunk returns its Partials instead, for the consumer to add. A tile too big
    for the GPU (fewer pipeline stages fit in its shared memory) falls back, for every later call too, to 2 stages and then
    to FIXED: a layer's tile still never depends on the row count. kind: the kernel and its compile-time choices."""
    while (*kind, tile) in _SMALLER:
        tile = _SMALLER[(*kind, tile)]
    try:
        return _launch_tile(launch, M, N, K, dtype, device, tile, unsummed)
    except Exception as err:  # triton.runtime.errors.OutOfResources, raised when the kernel is compiled (its first launch)
        if type(err).__name__ != "OutOfResources" or tile == FIXED:
            raise
        _SMALLER[(*kind, tile)] = FIXED if tile.num_stages <= 2 else replace(tile, num_stages=2)
        return _launch(launch, M, N, K, dtype, device, tile, kind, unsummed)


def _launch_tile(launch, M: int, N: int, K: int, dtype: torch.dtype, device: torch.device, tile: Tile, unsummed: bool) -> torch.Tensor | Partials:
    meta = dict(BLOCK_M=tile.block_m, BLOCK_N=tile.block_n, BLOCK_K=tile.block_k, num_warps=tile.num_warps, num_stages=tile.num_stages)
    n_tiles = -(-N // tile.block_n)
    if tile.split == 1:
        y = torch.empty((M, N), dtype=dtype, device=device)
        launch(y, slice(0, M), M, K, (-(-M // tile.block_m), n_tiles, 1), SPLIT=False, **meta)
        return y
    k_per = tile.k_per_split(K)
    parts = -(-K // k_per)  # the parts that hold some of K: fewer than tile.split where k_per_split rounded up
    chunk = _chunk_rows(parts, N, tile.block_m)
    y = None if unsummed and M <= chunk else torch.empty((M, N), dtype=dtype, device=device)
    for r0 in range(0, M, chunk):
        rows = min(chunk, M - r0)
        partial = torch.empty((parts, rows, N), dtype=torch.float32, device=device)
        launch(partial, slice(r0, r0 + rows), rows, k_per, (-(-rows // tile.block_m), n_tiles, parts), SPLIT=True, **meta)
        if y is None:  # one chunk, left to the consumer
            return Partials(partial, dtype)
        _sum_parts(partial, y[r0 : r0 + rows])
    return y


def linear(x: torch.Tensor, weight: torch.Tensor, out_dtype: torch.dtype | None = None, tile: Tile | None = None,
           unsummed: bool = False, small: bool = True) -> torch.Tensor | Partials:
    """linear_ref on the layer's tile (default: tile_for its shape; with ``small``, a call of at most SMALL_ROWS rows on
    small_tile_for's tile where it gives the same bits). x [M, K] (unit stride along K), weight [N, K] contiguous.
    unsummed: a split layer may return its Partials (summed() makes them the output)."""
    M, K = x.shape
    N = weight.shape[0]
    dtype = out_dtype or x.dtype
    kind = ("dense", x.dtype, weight.dtype)
    if tile is None:
        tile = tile_for(N, K)
        if small and M <= SMALL_ROWS and (little := small_tile_for(tile, N)) is not None and _small_tile_agrees(x, weight, dtype, tile, little, kind):
            tile = little

    def launch(out, rows, m, k_per, grid, **meta):
        _dense_kernel[grid](x[rows], weight, out, m, N, K, k_per, x.stride(0), weight.stride(0), out.stride(0), IEEE=x.dtype == torch.float32, **meta)

    return _launch(launch, M, N, K, dtype, x.device, tile, kind, unsummed)


# (kind, out dtype, N, K, device, shape tile, small tile) -> whether the small tile gave the shape tile's bits there
_SMALL_AGREES: dict[tuple, bool] = {}


def _small_tile_agrees(x: torch.Tensor, weight: torch.Tensor, dtype: torch.dtype, tile: Tile, little: Tile, kind: tuple) -> bool:
    """Whether ``little`` gives ``tile``'s bits for this layer's shape on x's device, asked once per shape (on the first
    layer of that shape's weight): both run on a probe of SMALL_ROWS rows and are compared bit for bit. The probe's rows
    span 2**-8 to 2**7 in scale, with exact zeros and outlier columns, so that a different order of adding or a
    different rounding inside the tensor-core instruction shows (on an H200 the 64-row tile compiles to wgmma and the
    16-row one to mma.sync). Where they match, a row's bits are taken not to depend on which tile a call takes: the
    evidence bench_gemm.py --tiles rows gave for every dense 8B layer, asked again here because another GPU or Triton
    may compile them otherwise. Not asked inside a CUDA graph's capture (a comparison syncs): such a call takes the
    shape tile, as exact either way."""
    N, K = weight.shape
    key = (*kind, dtype, N, K, x.device, tile, little)
    if key not in _SMALL_AGREES:
        if x.device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            return False
        gen = torch.Generator(x.device).manual_seed(0)
        probe = torch.randn(SMALL_ROWS, K, generator=gen, device=x.device)  # [16, K] float32
        probe *= 2.0 ** (torch.arange(SMALL_ROWS, device=x.device, dtype=torch.float32) - 8)[:, None]  # each row its scale
        probe[::3, ::7] = 0.0
        probe[1::4, ::97] *= 16.0  # outliers, within float16's range
        probe = probe.to(x.dtype)
        a, b = (linear(probe, weight, dtype, tile=t) for t in (tile, little))  # an explicit tile: no small-call choice
        bits = torch.int16 if a.element_size() == 2 else torch.int32
        _SMALL_AGREES[key] = torch.equal(a.view(bits), b.view(bits))  # bits: -0.0 is not 0.0 here
    return _SMALL_AGREES[key]


def int_linear(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, bits: int, group: int,
               out_dtype: torch.dtype | None = None, tile: Tile | None = None, unsummed: bool = False) -> torch.Tensor | Partials:
    """int_linear_ref on the layer's tile (default: tile_for its shape). x [M, K] (unit stride along K); qweight, scales, zeros
    contiguous. unsummed: as linear's."""
    M, K = x.shape
    N = qweight.shape[1]
    tile = tile or tile_for(N, K, bits)

    def launch(out, rows, m, k_per, grid, **meta):
        _int_kernel[grid](x[rows], qweight, scales, zeros, out, m, N, K, k_per, group, x.stride(0), out.stride(0), BITS=bits,
                          IEEE=x.dtype == torch.float32, ONE_GROUP=group % meta["BLOCK_K"] == 0, **meta)

    return _launch(launch, M, N, K, out_dtype or x.dtype, x.device, tile, ("int", bits, x.dtype), unsummed)
