"""What machine a benchmark ran on, and what its memory gives: every CPU figure names its machine (issue 41).

    python benchmarks/host.py            # prints the record as JSON

``host_record()`` says which CPU (model name, vendor, family / model), how many cores this process may use, the
cache sizes, the instruction-set flags that pick specdec's and llama.cpp's kernels, the load average, and a measured
read bandwidth: ``stream_read.c`` (beside this file, compiled with the host's C compiler, ``-O3 -march=native``)
sums a buffer 8x the last-level cache with 1 thread and with every core, best and median of several passes. A
one-token decode step of a model bigger than the caches cannot beat ``weight bytes / read bandwidth``: that is the
floor each step is reported against (``step_bytes`` counts the bytes). Without a C compiler the bandwidth falls back
to numpy's sum over the same buffer (one thread; ``method`` says which).
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
# the flags that decide which kernels run: specdec's Q4Gemm (VNNI, AVX2, portable), ONNX Runtime's MLAS, ggml
ISA_FLAGS = ("sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx_vnni", "avx512_bf16",
             "amx_tile", "amx_int8", "amx_bf16")


# (vendor, family, first model, last model) -> core: a guest's model name is often just "AMD EPYC", which says neither
# which core nor which kernels it runs (family 25 holds Zen 3 and Zen 4); the numbers do. Server and desktop parts.
CORES = (
    ("AuthenticAMD", 23, 0x00, 0x2F, "Zen / Zen+"), ("AuthenticAMD", 23, 0x30, 0xFF, "Zen 2"),
    ("AuthenticAMD", 25, 0x00, 0x0F, "Zen 3"), ("AuthenticAMD", 25, 0x10, 0x1F, "Zen 4"), ("AuthenticAMD", 25, 0x20, 0x5F, "Zen 3"),
    ("AuthenticAMD", 25, 0x60, 0xAF, "Zen 4"), ("AuthenticAMD", 26, 0x00, 0x2F, "Zen 5"), ("AuthenticAMD", 26, 0x40, 0x4F, "Zen 5"),
    ("AuthenticAMD", 26, 0x60, 0x7F, "Zen 5"),
    ("GenuineIntel", 6, 0x55, 0x55, "Skylake-SP / Cascade Lake"), ("GenuineIntel", 6, 0x6A, 0x6C, "Ice Lake-SP"),
    ("GenuineIntel", 6, 0x8F, 0x8F, "Sapphire Rapids"), ("GenuineIntel", 6, 0xCF, 0xCF, "Emerald Rapids"),
    ("GenuineIntel", 6, 0xAD, 0xAE, "Granite Rapids"), ("GenuineIntel", 6, 0x97, 0x9A, "Alder Lake"),
    ("GenuineIntel", 6, 0xB7, 0xB7, "Raptor Lake"), ("GenuineIntel", 6, 0xBA, 0xBA, "Raptor Lake"),
    ("GenuineIntel", 6, 0xBF, 0xBF, "Raptor Lake"),
)


def core_name(vendor: str | None, family: int | str | None, model: int | str | None) -> str | None:
    """The core a CPU's vendor, family and model numbers (/proc/cpuinfo's, decimal) name, or None when not in CORES."""
    try:
        fam, mod = int(family), int(model)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return next((name for v, f, lo, hi, name in CORES if v == vendor and f == fam and lo <= mod <= hi), None)


def _cpuinfo() -> dict[str, str]:
    """The first processor's fields of /proc/cpuinfo (Linux), else what platform says."""
    try:
        block = Path("/proc/cpuinfo").read_text().split("\n\n")[0]
    except OSError:
        return {"model name": platform.processor() or platform.machine()}
    return {k.strip(): v.strip() for k, _, v in (line.partition(":") for line in block.splitlines()) if k.strip()}


def caches() -> list[dict[str, Any]]:
    """Each cache of CPU 0: level, type, size in bytes and the CPUs that share it (Linux sysfs)."""
    out = []
    for index in sorted(Path("/sys/devices/system/cpu/cpu0/cache").glob("index*")):
        def read(name: str, index: Path = index) -> str:
            return (index / name).read_text().strip()

        try:
            size = read("size")
            mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(size[-1], 1)
            out.append({"level": int(read("level")), "type": read("type"), "bytes": int(size.rstrip("KMG")) * mult,
                        "shared_cpu_list": read("shared_cpu_list")})
        except (OSError, ValueError):
            continue
    return out


def last_level_cache_bytes() -> int:
    sizes = [c["bytes"] for c in caches() if c["type"] in ("Unified", "Data")]
    return max(sizes, default=32 << 20)


def cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


class StreamReader:
    """stream_read.c built once, to sample the read bandwidth again and again within a run (the figure moves from minute
    to minute on a shared machine, so a step is set against the bandwidth measured next to it). Use as a context
    manager; ``sample(threads, passes)`` -> (best GB/s by wall time, best by CPU time), or None without a C compiler."""

    def __init__(self, buffer_bytes: int | None = None):
        self.size = buffer_bytes or 8 * last_level_cache_bytes()
        self._tmp = tempfile.TemporaryDirectory()
        self.exe: Path | None = Path(self._tmp.name) / "stream_read"
        self.cc = cc = os.environ.get("CC") and shutil.which(os.environ["CC"]) or shutil.which("cc") or shutil.which("gcc")
        built = cc and subprocess.run([cc, "-O3", "-march=native", "-pthread", "-o", str(self.exe), str(HERE / "stream_read.c")],
                                      capture_output=True, text=True)
        if not built or built.returncode != 0:
            self.exe = None

    def sample(self, threads: int, passes: int = 2) -> tuple[float, float] | None:
        figures = self.measure(threads, passes)
        return None if figures is None else (figures["best_gb_s"], figures["cpu_best_gb_s"])

    def measure(self, threads: int, passes: int) -> dict[str, float] | None:
        """{"best_gb_s", "median_gb_s", "cpu_best_gb_s", "cpu_median_gb_s"} of ``passes`` passes on ``threads`` threads."""
        if self.exe is None:
            return None
        best, median, cpu_best, cpu_median, _ = subprocess.run([str(self.exe), str(self.size), str(threads), str(passes)], capture_output=True,
                                                               text=True, check=True).stdout.split()
        return {"best_gb_s": float(best) / 1e9, "median_gb_s": float(median) / 1e9,
                "cpu_best_gb_s": float(cpu_best) / 1e9, "cpu_median_gb_s": float(cpu_median) / 1e9}

    def __enter__(self) -> StreamReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self._tmp.cleanup()


def read_bandwidth(threads: list[int] | None = None, passes: int = 7, buffer_bytes: int | None = None) -> dict[str, Any]:
    """Read bandwidth in GB/s over a buffer 8x the last-level cache: {"method", "buffer_bytes", "by_threads":
    {n: {"best_gb_s", "median_gb_s", "cpu_best_gb_s", "cpu_median_gb_s"}}}. The best pass is the machine's; the median
    says how much others took; the cpu_ figures time each pass by its threads' own CPU time (a descheduled thread
    stretches the wall time, not that), the steadier measure on a shared machine."""
    size = buffer_bytes or 8 * last_level_cache_bytes()
    threads = threads or sorted({1, cores()})
    with StreamReader(size) as reader:
        if reader.exe is not None:
            by = {n: reader.measure(n, passes) for n in threads}
            return {"method": f"stream_read.c ({Path(reader.cc).name} -O3 -march=native): each thread sums its slice, 64-bit words",
                    "buffer_bytes": size, "passes": passes, "by_threads": by}
    import numpy as np

    buf = np.ones(size // 4, np.float32)
    rates = []
    for _ in range(passes):
        t = time.perf_counter()
        buf.sum()
        rates.append(size / (time.perf_counter() - t) / 1e9)
    rates.sort()
    one = {"best_gb_s": rates[-1], "median_gb_s": rates[len(rates) // 2]}
    return {"method": "numpy float32 sum (no C compiler found)", "buffer_bytes": size, "passes": passes,
            "by_threads": {1: {**one, "cpu_best_gb_s": one["best_gb_s"], "cpu_median_gb_s": one["median_gb_s"]}}}


def host_record(bandwidth: bool = True) -> dict[str, Any]:
    """The machine, as the results JSON records it."""
    info = _cpuinfo()
    flags = set(info.get("flags", "").split())
    rec: dict[str, Any] = {
        "cpu_model": info.get("model name", platform.processor()),
        "vendor": info.get("vendor_id"),
        "family_model": f"family {info.get('cpu family')} model {info.get('model')}" if "cpu family" in info else None,
        "core": core_name(info.get("vendor_id"), info.get("cpu family"), info.get("model")),
        "cores": cores(),
        "caches": caches(),
        "isa": [f for f in ISA_FLAGS if f in flags],
        "hypervisor": "hypervisor" in flags,
        "platform": platform.platform(),
        "load_average": list(os.getloadavg()),
    }
    try:
        import onnxruntime

        rec["onnxruntime"] = onnxruntime.__version__
    except ImportError:
        pass
    if bandwidth:
        rec["read_bandwidth"] = read_bandwidth()
    return rec


def describe(rec: dict[str, Any]) -> str:
    """One line for a table caption: CPU, cores, last-level cache, the ISA that picks the kernels, bandwidth."""
    llc = max((c["bytes"] for c in rec["caches"]), default=0) >> 20
    isa = "AVX-512 VNNI" if "avx512_vnni" in rec["isa"] else "AVX2" if "avx2" in rec["isa"] else "no AVX2"
    bw = rec.get("read_bandwidth", {}).get("by_threads", {})
    bws = ", ".join(f"{n} thread{'s' if int(n) > 1 else ''} {v['best_gb_s']:.1f} GB/s (by CPU time {v['cpu_best_gb_s']:.1f})" for n, v in bw.items())
    which = ", ".join(x for x in (rec.get("core"), rec.get("family_model")) if x)
    return f"{rec['cpu_model']} ({which}), {rec['cores']} cores, {llc} MiB L3, {isa}" + (f"; read {bws}" if bws else "")


def step_bytes(engine_dir: Path) -> int:
    """Bytes of weights a one-token step reads: every initializer of model.onnx except the ones only gathered from
    (the embedding table, of which a step reads a row or two)."""
    import onnx

    model = onnx.load(str(Path(engine_dir) / "model.onnx"), load_external_data=False)
    gathered = {n.input[0] for n in model.graph.node if n.op_type in ("Gather", "GatherBlockQuantized")}
    others = {i for n in model.graph.node if n.op_type not in ("Gather", "GatherBlockQuantized") for i in n.input}
    total = 0
    for init in model.graph.initializer:
        if init.name in gathered and init.name not in others:
            continue
        ext = {e.key: e.value for e in init.external_data}
        if "length" in ext:
            total += int(ext["length"])
        else:
            total += len(init.raw_data) or onnx.numpy_helper.to_array(init).nbytes
    return total


if __name__ == "__main__":
    print(json.dumps(host_record(), indent=1))
