"""Compiling and loading specdec's int4/int8 CPU kernels (hardware/kernels/: the ai.specdec.cpu::Q4Gemm and Q8Gemm ops' C sources).

An engine built with ``--cpu_kernels specdec`` records the op's weight layout (LAYOUT), never native code: the
library is compiled from the *installed* specdec's sources with the system C compiler, once per user and source
version, into a private cache folder (``$SPECDEC_CACHE_DIR/kernels``, else ``$XDG_CACHE_HOME/specdec/kernels`` or
``~/.cache/specdec/kernels``), and registered with the ONNX Runtime session (backends/onnxruntime/cpu.py). Loading an
engine directory runs no code that came with it. ONNX Runtime's Python wheel has no C headers, so the op declares the
few pieces of ONNX Runtime's stable C ABI it uses itself (kernels/ort_q4gemm.c says how). Without AVX-512 VNNI the
library runs an AVX2 kernel, and without AVX2 a portable C one, that compute the same bits, more slowly. The graph
side (the weight layout, the node) is plugins/cpu_kernels.py.

The cache holds what this specdec compiled, and is checked before anything is loaded from it: each library is
written beside a manifest (its size, its sha256, the source digest) with the symbols it must export checked first,
both moved into place whole. A library that is not what its manifest says (cut short by a full disk or a killed
copy: loading it would be a SIGBUS; another library put in its place; no manifest: an older specdec's) is compiled
again, or refused in one line where that fails. Nothing is loaded from a file whose bytes were not checked.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from .cpu import usable_cpus

LIBRARY = "specdec_cpu_kernels.so"
MANIFEST = "specdec_cpu_kernels.json"  # beside the library: {"size", "sha256", "source_digest", "symbols"}
SYMBOLS = ("RegisterCustomOps", "specdec_q4_kernel_name")  # what the library must export (ONNX Runtime's entry; ours)
LAYOUT = 2  # Q4Gemm/Q8Gemm weight layouts and arithmetic (kernels/q4_kernels.h); an engine of another layout is refused
SOURCES = ("ort_q4gemm.c", "q4_kernels.c", "q8_kernels.c", "swiglu.c", "large_pages.c", "ort_attention.c", "attention.c", "attention_avx512.c",
           "attention_avx2.c", "ort_swiglu.c")
HEADERS = ("q4_kernels.h", "ort_abi.h", "attention.h", "attention_impl.h", "exp_cephes.h")
KERNEL_DIR = Path(__file__).parent / "kernels"
# -ffp-contract=off -fno-fast-math: no fused or reordered float operations but the explicit ones, so that the
# AVX-512 and the portable kernels round alike
CFLAGS = ("-O3", "-ffp-contract=off", "-fno-fast-math", "-fPIC", "-fvisibility=hidden", "-std=c11", "-D_GNU_SOURCE", "-pthread")
LDFLAGS = ("-shared", "-pthread")
# told, before a compile starts, what it compiles and where (the CLIs print it: a first use waits 10-20 s on 2 cores
# with nothing else to show); None: silent (a library's caller)
compile_note: Callable[[str], None] | None = None


class KernelBuildError(RuntimeError):
    """The kernel library could not be compiled (no C compiler, or it failed), or the engine's layout is not ours."""


def source_digest() -> str:
    """What the library is built from: the sources and the flags (its cache folder's name)."""
    h = hashlib.sha256(" ".join((*CFLAGS, *LDFLAGS)).encode())
    for f in (*SOURCES, *HEADERS):
        h.update((KERNEL_DIR / f).read_bytes())
    return h.hexdigest()[:16]


def compiler() -> str | None:
    """$CC if it names a program, else cc, gcc or clang on PATH."""
    if os.environ.get("CC"):
        return shutil.which(os.environ["CC"])
    return shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")


def build_library(dest: Path) -> Path:
    """Compile the kernel library to ``dest``, check that it exports SYMBOLS, and write its manifest: each written
    beside its place first, then moved there whole (a concurrent build or reader never sees half a file), the
    library before the manifest that vouches for it. Each source is compiled by a process of its own, as many at once
    as this process may use CPUs, then linked: the same objects as one compiler call makes (each file is its own
    translation unit either way), in about half the time on 2 cores (a user's first ``--cpu_kernels specdec`` build or
    run waits for it: docs/benchmarks.md, "Compiling the CPU kernels on first use"). The objects go to a private
    temporary folder, never the cache: a build killed midway leaves at most one temporary library beside ``dest``."""
    cc = compiler()
    if cc is None:
        raise KernelBuildError("specdec's int4/int8 CPU kernels (--cpu_kernels specdec) are compiled on first use and no C compiler "
                               "was found (cc, gcc, clang or $CC): install one (Debian: apt install gcc), or use an engine "
                               "built with --cpu_kernels ort")
    dest = Path(dest)
    fd, tmp = tempfile.mkstemp(prefix=".specdec_kernels.", suffix=".so", dir=dest.parent)
    os.close(fd)
    objects = None
    try:
        objects = tempfile.mkdtemp(prefix="specdec_kernels.")  # (mode 0700)
        outputs = [os.path.join(objects, f"{name}.o") for name in SOURCES]
        steps = [[cc, *CFLAGS, "-c", "-o", out, str(KERNEL_DIR / name)] for name, out in zip(SOURCES, outputs, strict=True)]
        pool = ThreadPoolExecutor(max_workers=min(len(steps), usable_cpus()))
        try:
            runs = list(pool.map(_run, steps))
        finally:  # an interrupt (Ctrl-C) starts no compile still queued
            pool.shutdown(cancel_futures=True)
        for cmd, done in zip(steps, runs, strict=True):  # the first compile that failed, if any: then nothing is linked
            _check(cmd, done)
        link = [cc, *LDFLAGS, "-o", tmp, *outputs, "-lm"]
        _check(link, _run(link))
        missing = _missing_symbols(Path(tmp))
        if missing:
            what = missing if isinstance(missing, str) else f"it lacks the symbols {', '.join(missing)}"
            raise KernelBuildError(f"{cc} compiled specdec's int4/int8 CPU kernels, but {what}: use gcc or clang ($CC), or an engine built with "
                                   "--cpu_kernels ort")
        data = Path(tmp).read_bytes()
        manifest = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest(), "source_digest": source_digest(), "symbols": list(SYMBOLS)}
        os.replace(tmp, dest)
        _write_atomically(dest.parent / MANIFEST, json.dumps(manifest))
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
        if objects is not None:
            shutil.rmtree(objects, ignore_errors=True)
    return dest


def _run(cmd: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True)


def _check(cmd: list[str], done: subprocess.CompletedProcess) -> None:
    if done.returncode != 0:
        raise KernelBuildError(f"compiling specdec's int4/int8 CPU kernels failed ({' '.join(cmd)}): {' '.join(done.stderr.split())[-2000:]}")


def _write_atomically(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _missing_symbols(library: Path) -> list[str] | str:
    """SYMBOLS the library does not export, or why it does not load at all. Loaded in a child process: a library that
    is not ours never enters this one (where the dynamic loader would keep it for its path, even once replaced)."""
    probe = "import ctypes, sys; lib = ctypes.CDLL(sys.argv[1]); print(' '.join(n for n in sys.argv[2:] if not hasattr(lib, n)))"
    try:
        done = subprocess.run([sys.executable, "-c", probe, str(library), *SYMBOLS], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as err:
        return f"it could not be checked ({err})"
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
        return f"it does not load ({last[-300:]})"
    return done.stdout.split()


def check_cached(library: Path) -> str | None:
    """Why the cached ``library`` is not what this specdec compiled (read, never loaded), or None."""
    manifest_path = library.parent / MANIFEST
    try:
        manifest = json.loads(manifest_path.read_text())
    except FileNotFoundError:
        return "it has no manifest (an older specdec's, or a build that was cut short)"
    except (OSError, ValueError, RecursionError):
        manifest = None
    # read as typed fields, never converted: {"size": Infinity} is JSON too (found by the fuzzer: int() overflowed)
    size, digest = (manifest.get("size"), manifest.get("sha256")) if isinstance(manifest, dict) else (None, None)
    if type(size) is not int or not isinstance(digest, str):
        return f"its manifest {manifest_path.name} is not one specdec wrote"
    vouched = manifest.get("source_digest") == source_digest() and manifest.get("symbols") == list(SYMBOLS)
    if not vouched:
        return "its manifest is another source's"
    data = library.read_bytes()
    if len(data) != size:
        return f"it is {len(data)} bytes, and {size} were compiled (a write cut short?)"
    if hashlib.sha256(data).hexdigest() != digest:
        return "its bytes are not the ones compiled (another file in its place?)"
    return None


def cache_dir() -> Path:
    base = os.environ.get("SPECDEC_CACHE_DIR") or os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "specdec")
    return Path(base) / "kernels"


def kernel_library(layout: int = LAYOUT) -> Path:
    """The installed sources' library, compiled on first use into this user's cache (a private folder: what is loaded
    from it is what this specdec compiled, checked against its manifest first; a library that fails the check is
    compiled again); refuses an engine whose Q4Gemm layout is not this specdec's."""
    if layout != LAYOUT:
        raise KernelBuildError(f"the engine's int4/int8 CPU kernel layout is {layout}, this specdec's is {LAYOUT}: rebuild the engine with "
                               "this specdec's specdec-build")
    folder = cache_dir() / source_digest()
    lib = folder / LIBRARY
    if lib.is_file():
        why = check_cached(lib)
        if why is None:
            missing = _missing_symbols(lib)
            if not missing:
                return lib
            why = missing if isinstance(missing, str) else f"it does not export {', '.join(missing)}"
        try:
            _note(f"compiling specdec's CPU kernels again: the cached library is not what specdec compiled ({why})", folder)
            return build_library(lib)
        except KernelBuildError as err:
            raise KernelBuildError(f"the cached int4 CPU kernel {lib} is not what specdec compiled ({why}), and compiling it again failed: "
                                   f"{err}") from None
        except OSError as err:
            raise KernelBuildError(f"the cached int4 CPU kernel {lib} is not what specdec compiled ({why}), and it cannot be replaced "
                                   f"({err.strerror}): remove {folder}, or set SPECDEC_CACHE_DIR to a folder of your own") from None
    try:
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        _note("compiling specdec's CPU kernels for this host (its first use by this specdec version)", folder)
        return build_library(lib)
    except OSError as err:
        raise KernelBuildError(f"cannot write specdec's int4 CPU kernel into {folder} ({err.strerror}): set SPECDEC_CACHE_DIR to a writable "
                               "folder of your own") from None


def _note(what: str, folder: Path) -> None:
    if compile_note is not None and compiler() is not None:  # (without a compiler the build's error says so at once)
        compile_note(f"{what} into {folder}: about 10-20 s on 2 cores, once")


def kernel_name(library: Path) -> str:
    """Which kernel the library runs on this machine: "AVX-512 VNNI", "AVX2" or "portable C" (``library``: one
    kernel_library returned, checked)."""
    import ctypes

    fn = ctypes.CDLL(str(library)).specdec_q4_kernel_name
    fn.restype = ctypes.c_char_p
    return fn().decode()
