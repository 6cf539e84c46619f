"""benchmarks/bench_attention_kernel.c: CachedAttention's kernel alone, builds against each other, built as its header says."""

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
KERNELS = ROOT / "hardware" / "kernels"
CC = shutil.which("cc") or shutil.which("gcc")
pytestmark = pytest.mark.skipif(CC is None, reason="no C compiler")


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> tuple[Path, Path]:
    """(the benchmark, a build of this tree's attention kernel), compiled with its header's commands."""
    tmp = tmp_path_factory.mktemp("attention_kernel")
    bench, lib = tmp / "bench_attention_kernel", tmp / "attention.so"
    subprocess.run([CC, "-O3", "-I", str(KERNELS), "-o", str(bench), str(ROOT / "benchmarks" / "bench_attention_kernel.c"), "-ldl", "-lm"],
                   check=True)
    subprocess.run([CC, "-O3", "-ffp-contract=off", "-fno-fast-math", "-fPIC", "-shared", "-std=c11", "-D_GNU_SOURCE", "-o", str(lib),
                    *(str(KERNELS / f) for f in ("attention.c", "attention_avx2.c", "attention_avx512.c", "q4_kernels.c")), "-lm"], check=True)
    return bench, lib


def test_it_times_every_case_and_compares_the_builds_bits(built, tmp_path):
    bench, lib = built
    other = tmp_path / "again.so"  # another file of the same build: dlopen loads it apart
    shutil.copy(lib, other)
    out = subprocess.run([str(bench), "--rounds", "2", "--reps", "2", "--shapes", "4/2/8/5,6/3/20/12", "--tokens", "1,3", str(lib), str(other)],
                         capture_output=True, text=True, check=True).stdout
    cases = re.findall(r"^(\d+)/(\d+) heads of (\d+), context (\d+), (\d+) token", out, re.M)
    assert cases == [("4", "2", "8", "5", "1"), ("4", "2", "8", "5", "3"), ("6", "3", "20", "12", "1"), ("6", "3", "20", "12", "3")]
    times = [float(t) for t in re.findall(r"^\s+\S+\s+([\d.]+) us \[", out, re.M)]
    assert len(times) == 8 and all(t > 0 for t in times)
    assert out.count("same bits: yes") == 4


def test_a_bad_option_or_library_is_refused_in_one_line(built, tmp_path):
    bench, lib = built
    for args in (["--shapes", "5/2/8/5", str(lib)], ["--shapes", "-4/2/8/5", str(lib)], ["--tokens", "0", str(lib)], ["--bogus", str(lib)],
                 [str(lib), "--rounds"], [str(tmp_path / "missing.so")], []):
        done = subprocess.run([str(bench), *args], capture_output=True, text=True)
        assert done.returncode == 2, args
        assert len(done.stderr.strip().splitlines()) == 1 and not done.stdout, args
