#!/bin/sh
# A user's first use of --cpu_kernels specdec: the kernel library compiled into an empty cache, timed as a whole process
# by farm-bench (docs/benchmarks.md, "Compiling the CPU kernels on first use"). TREE: a specdec checkout whose
# hardware/cpu_kernels.py and kernels/ to compile (another commit's, to compare); python: the one on PATH.
#   farm-bench -n 5 --warmup 0 --timeout 400 --vs "sh benchmarks/kernel_first_use.sh /tmp/old" -- sh benchmarks/kernel_first_use.sh .
set -eu
tree=$(cd "${1:?usage: kernel_first_use.sh TREE}" && pwd)
cache=$(mktemp -d)
trap 'rm -rf "$cache"' EXIT
SPECDEC_CACHE_DIR=$cache python -c "
import importlib.util, sys
spec = importlib.util.spec_from_file_location('cpu_kernels', sys.argv[1] + '/hardware/cpu_kernels.py')
kernels = importlib.util.module_from_spec(spec)
spec.loader.exec_module(kernels)
print(kernels.kernel_library())" "$tree"
