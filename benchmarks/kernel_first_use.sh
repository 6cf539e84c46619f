#!/bin/sh
# A user's first use of --cpu_kernels specdec: the kernel library compiled into an empty cache, timed as a whole process
# by farm-bench (docs/benchmarks.md, "Compiling the CPU kernels on first use"). TREE: a specdec checkout whose
# hardware/ (cpu_kernels.py and kernels/) to compile (another commit's, to compare); python: the one on PATH.
#   farm-bench -n 5 --warmup 0 --timeout 400 --vs "sh benchmarks/kernel_first_use.sh /tmp/old" -- sh benchmarks/kernel_first_use.sh .
set -eu
tree=$(cd "${1:?usage: kernel_first_use.sh TREE}" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# TREE's hardware/ and formats/ (what hardware/ stands on) as a package of their own: the installed specdec stays out of it
mkdir "$work/specdec" && touch "$work/specdec/__init__.py" && ln -s "$tree/hardware" "$tree/formats" "$work/specdec/"
SPECDEC_CACHE_DIR=$work/cache PYTHONPATH=$work python -c "
import specdec.hardware.cpu_kernels as kernels
assert kernels.__file__.startswith('$work'), kernels.__file__
print(kernels.kernel_library())"
