"""specdec's own CPU kernel for int4 weights: the ai.specdec.cpu::Q4Gemm op (plugins/kernels/).

ONNX Runtime's MatMulNBits reads and unpacks the 4-bit weights once for every *pair* of rows, so a 5-token
verification costs about 2x a one-token step on an int4 target, and it computes a lone row with other kernels
than rows in pairs, which costs an engine that verifies drafts an even-row padding on every one-token step
(docs/precision.md). Q4Gemm unpacks each weight block once for up to 4 rows (a tile of 4 rows x 32-64 columns,
AVX-512 VNNI integer dot products, as llama.cpp's tinyBLAS tiles do for Q4_0), and every row takes the same
instructions whatever the call's row count: no padding, and the verification logits equal the one-token logits
bit for bit.

An engine built with ``--cpu_kernels specdec`` carries the op's shared library (compiled here, at build, with the
system C compiler) beside model.onnx; the runtime registers it with the session. ONNX Runtime's Python wheel has
no C headers, so the op declares the few pieces of ONNX Runtime's stable C ABI it uses itself (ort_q4gemm.c says
how). Without AVX-512 VNNI the library runs a portable C kernel that computes the same bits, slowly.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .graph_api import GraphOps

DOMAIN = "ai.specdec.cpu"
LIBRARY = "specdec_cpu_kernels.so"  # the file name in an engine directory
SOURCES = ("ort_q4gemm.c", "q4_kernels.c")
HEADERS = ("q4_kernels.h",)
KERNEL_DIR = Path(__file__).parent / "kernels"
CFLAGS = ("-O3", "-ffp-contract=off", "-fPIC", "-shared", "-fvisibility=hidden", "-std=c11", "-D_GNU_SOURCE")
TILE = 16  # output columns per tile


class KernelBuildError(RuntimeError):
    """The kernel library could not be compiled (no C compiler, or it failed)."""


@dataclass
class Q4Weight:
    """An int4 weight in Q4Gemm's layout (plugins/kernels/q4_kernels.h)."""

    w: np.ndarray  # [N / 16, G, group / 8, 64] uint8
    scales: np.ndarray  # [N / 16, G, 16] float32
    zeros: np.ndarray  # [N / 16, G, 16] int32
    k: int
    n: int
    group: int


def q4_holds(w) -> bool:
    """Whether Q4Gemm takes ``w`` (an IntWeightLike): 4 bits, groups of a multiple of 8 rows spanning K evenly, and a
    multiple of 16 output columns. Others stay on MatMulNBits."""
    k, n = w.codes.shape
    groups = w.scale.shape[0]
    return w.bits == 4 and k % groups == 0 and (k // groups) % 8 == 0 and n % TILE == 0


def pack_q4(w) -> Q4Weight:
    """codes [K, N] (0..15), scale / zero [G, N] -> Q4Gemm's tiles."""
    k, n = w.codes.shape
    g = w.scale.shape[0]
    group = k // g
    c = np.asarray(w.codes, np.uint8).reshape(g, group // 8, 2, 4, n // TILE, TILE)  # group, quad pair, half, j, tile, column
    c = c.transpose(4, 0, 1, 2, 5, 3)  # tile, group, quad pair, half, column, j
    packed = (c[:, :, :, 0] | (c[:, :, :, 1] << 4)).reshape(n // TILE, g, group // 8, 64)
    per_tile = lambda a, dtype: np.ascontiguousarray(np.asarray(a, dtype).reshape(g, n // TILE, TILE).transpose(1, 0, 2))
    return Q4Weight(w=np.ascontiguousarray(packed), scales=per_tile(w.scale, np.float32), zeros=per_tile(w.zero, np.int32), k=k, n=n, group=group)


def unpack_q4(p: Q4Weight) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """-> (codes [K, N], scale [G, N], zero [G, N]): the inverse of pack_q4, for tests."""
    t, g = p.w.shape[:2]
    halves = np.stack([p.w & 0x0F, p.w >> 4], axis=3).reshape(t, g, p.group // 8, 2, TILE, 4)
    codes = halves.transpose(1, 2, 3, 5, 0, 4).reshape(p.k, p.n)
    flat = lambda a: a.transpose(1, 0, 2).reshape(g, p.n)
    return codes, flat(p.scales), flat(p.zeros)


def q4_gemm(gb: GraphOps, name: str, x: str, w) -> str:
    """x [..., K] @ deq(w) -> [..., N] with Q4Gemm."""
    p = pack_q4(w)
    inputs = [gb.const(f"{name}.weight_q4", p.w), gb.const(f"{name}.weight_scales", p.scales), gb.const(f"{name}.weight_zeros", p.zeros)]
    return gb.op("Q4Gemm", [x, *inputs], name, domain=DOMAIN, K=p.k, N=p.n, group_size=p.group)


def source_digest() -> str:
    """What the library is built from: the sources and the flags (recorded in config.json)."""
    h = hashlib.sha256(" ".join(CFLAGS).encode())
    for f in (*SOURCES, *HEADERS):
        h.update((KERNEL_DIR / f).read_bytes())
    return h.hexdigest()[:16]


def compiler() -> str | None:
    """$CC if it names a program, else cc, gcc or clang on PATH."""
    if os.environ.get("CC"):
        return shutil.which(os.environ["CC"])
    return shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")


def build_library(dest: Path) -> Path:
    """Compile the kernel library to ``dest`` (written beside it first, then moved into place)."""
    cc = compiler()
    if cc is None:
        raise KernelBuildError("--cpu_kernels specdec compiles a C library and found no C compiler (cc, gcc, clang or $CC): "
                               "install one (Debian: apt install gcc) or build with --cpu_kernels ort")
    dest = Path(dest)
    fd, tmp = tempfile.mkstemp(prefix=".specdec_kernels.", suffix=".so", dir=dest.parent)
    os.close(fd)
    cmd = [cc, *CFLAGS, "-o", tmp, *(str(KERNEL_DIR / s) for s in SOURCES), "-lm"]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            raise KernelBuildError(f"compiling the CPU kernel library failed ({' '.join(cmd)}):\n{done.stderr.strip()[-2000:]}")
        os.replace(tmp, dest)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return dest


_CACHE: dict[str, Path] = {}


def cached_library() -> Path:
    """The library compiled once per process into a temporary folder (tests and the build's own checks)."""
    digest = source_digest()
    if digest not in _CACHE:
        folder = Path(tempfile.mkdtemp(prefix="specdec_kernels_"))
        _CACHE[digest] = build_library(folder / LIBRARY)
    return _CACHE[digest]


def runs_vnni(library: Path) -> bool:
    """Whether the library runs its AVX-512 VNNI kernel on this machine (else the portable one)."""
    import ctypes

    return bool(ctypes.CDLL(str(library)).specdec_q4_kernel_is_vnni())
