"""specdec's own CPU kernel for int4 weights: the ai.specdec.cpu::Q4Gemm op (plugins/kernels/).

ONNX Runtime's MatMulNBits reads and unpacks the 4-bit weights once for every *pair* of rows, so a 5-token
verification costs about 2x a one-token step on an int4 target, and it computes a lone row with other kernels
than rows in pairs, which costs an engine that verifies drafts an even-row padding on every one-token step
(docs/precision.md). Q4Gemm unpacks each weight block once for up to 4 rows (a tile of 4 rows x 32-64 columns,
AVX-512 VNNI integer dot products, as llama.cpp's tinyBLAS tiles do for Q4_0), and every row takes the same
instructions whatever the call's row count: no padding, and the verification logits equal the one-token logits
bit for bit.

An engine built with ``--cpu_kernels specdec`` records the op's weight layout (LAYOUT); the op's shared library is
compiled from the *installed* specdec's sources with the system C compiler, once per user and source version, into
a cache folder (``$SPECDEC_CACHE_DIR``, else ``$XDG_CACHE_HOME/specdec`` or ``~/.cache/specdec``), and registered
with the session. An engine directory never carries native code: loading an engine runs no code that came with it.
ONNX Runtime's Python wheel has no C headers, so the op declares the few pieces of ONNX Runtime's stable C ABI it
uses itself (ort_q4gemm.c says how). Without AVX-512 VNNI the library runs a portable C kernel that computes the
same bits, slowly.
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
LIBRARY = "specdec_cpu_kernels.so"
LAYOUT = 1  # Q4Gemm's weight layout and arithmetic (q4_kernels.h); an engine of another layout is refused
SOURCES = ("ort_q4gemm.c", "q4_kernels.c")
HEADERS = ("q4_kernels.h",)
KERNEL_DIR = Path(__file__).parent / "kernels"
# -ffp-contract=off -fno-fast-math: no fused or reordered float operations but the explicit ones, so that the
# AVX-512 and the portable kernels round alike
CFLAGS = ("-O3", "-ffp-contract=off", "-fno-fast-math", "-fPIC", "-shared", "-fvisibility=hidden", "-std=c11", "-D_GNU_SOURCE")
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
    """Whether Q4Gemm takes ``w`` (an IntWeightLike): 4 bits, equal groups of a multiple of 8 rows (no shorter last
    group), and a multiple of 16 output columns. Others stay on MatMulNBits."""
    k, n = w.codes.shape
    g = w.group_size
    return w.bits == 4 and g > 0 and g % 8 == 0 and k % g == 0 and w.scale.shape[0] == k // g and n % TILE == 0


def pack_q4(w) -> Q4Weight:
    """codes [K, N] (0..15), scale / zero [G, N] -> Q4Gemm's tiles."""
    k, n = w.codes.shape
    group = w.group_size
    g = k // group
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
    """What the library is built from: the sources and the flags (its cache folder's name)."""
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
    """Compile the kernel library to ``dest`` (written beside it first, then moved into place: a concurrent build or
    reader never sees half a file)."""
    cc = compiler()
    if cc is None:
        raise KernelBuildError("specdec's int4 CPU kernel (--cpu_kernels specdec) is compiled on first use and no C compiler "
                               "was found (cc, gcc, clang or $CC): install one (Debian: apt install gcc), or use an engine "
                               "built with --cpu_kernels ort")
    dest = Path(dest)
    fd, tmp = tempfile.mkstemp(prefix=".specdec_kernels.", suffix=".so", dir=dest.parent)
    os.close(fd)
    cmd = [cc, *CFLAGS, "-o", tmp, *(str(KERNEL_DIR / s) for s in SOURCES), "-lm"]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            raise KernelBuildError(f"compiling specdec's int4 CPU kernel failed ({' '.join(cmd)}):\n{done.stderr.strip()[-2000:]}")
        os.replace(tmp, dest)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return dest


def cache_dir() -> Path:
    base = os.environ.get("SPECDEC_CACHE_DIR") or os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "specdec")
    return Path(base) / "kernels"


def kernel_library(layout: int = LAYOUT) -> Path:
    """The installed sources' library, compiled on first use into this user's cache (a private folder: what is loaded
    from it is what this specdec compiled); refuses an engine whose Q4Gemm layout is not this specdec's."""
    if layout != LAYOUT:
        raise KernelBuildError(f"the engine's int4 CPU kernel layout is {layout}, this specdec's is {LAYOUT}: rebuild the engine with "
                               "this specdec's specdec-build")
    folder = cache_dir() / source_digest()
    lib = folder / LIBRARY
    if lib.is_file():
        return lib
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    return build_library(lib)


def runs_vnni(library: Path) -> bool:
    """Whether the library runs its AVX-512 VNNI kernel on this machine (else the portable one)."""
    import ctypes

    return bool(ctypes.CDLL(str(library)).specdec_q4_kernel_is_vnni())
