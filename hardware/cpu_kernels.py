"""Compiling and loading specdec's int4 CPU kernel (hardware/kernels/: the ai.specdec.cpu::Q4Gemm op's C sources).

An engine built with ``--cpu_kernels specdec`` records the op's weight layout (LAYOUT), never native code: the
library is compiled from the *installed* specdec's sources with the system C compiler, once per user and source
version, into a private cache folder (``$SPECDEC_CACHE_DIR/kernels``, else ``$XDG_CACHE_HOME/specdec/kernels`` or
``~/.cache/specdec/kernels``), and registered with the ONNX Runtime session (backends/onnxruntime/cpu.py). Loading an
engine directory runs no code that came with it. ONNX Runtime's Python wheel has no C headers, so the op declares the
few pieces of ONNX Runtime's stable C ABI it uses itself (kernels/ort_q4gemm.c says how). Without AVX-512 VNNI the
library runs an AVX2 kernel, and without AVX2 a portable C one, that compute the same bits, more slowly. The graph side (the weight layout, the node) is
plugins/cpu_kernels.py.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

LIBRARY = "specdec_cpu_kernels.so"
LAYOUT = 1  # Q4Gemm's weight layout and arithmetic (kernels/q4_kernels.h); an engine of another layout is refused
SOURCES = ("ort_q4gemm.c", "q4_kernels.c")
HEADERS = ("q4_kernels.h",)
KERNEL_DIR = Path(__file__).parent / "kernels"
# -ffp-contract=off -fno-fast-math: no fused or reordered float operations but the explicit ones, so that the
# AVX-512 and the portable kernels round alike
CFLAGS = ("-O3", "-ffp-contract=off", "-fno-fast-math", "-fPIC", "-shared", "-fvisibility=hidden", "-std=c11", "-D_GNU_SOURCE")


class KernelBuildError(RuntimeError):
    """The kernel library could not be compiled (no C compiler, or it failed), or the engine's layout is not ours."""


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


def kernel_name(library: Path) -> str:
    """Which kernel the library runs on this machine: "AVX-512 VNNI", "AVX2" or "portable C"."""
    import ctypes

    fn = ctypes.CDLL(str(library)).specdec_q4_kernel_name
    fn.restype = ctypes.c_char_p
    return fn().decode()
