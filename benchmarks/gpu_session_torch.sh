#!/usr/bin/env bash
# gpu_session.sh BENCH=torch (it execs this, with its environment): the torch backend's GPU tests, then its benchmark on
# the enlarged pair, in one device call within BUDGET_S. Resumable: what $WORK holds (checkpoints, engines) is reused.
# Stages and their expected cost on an H100/H200 (8B-shaped pair; the build figures are from the ORT path's run):
#   tests on the demo pair  60-150 s   (TESTS=0 skips; capped at TEST_S)
#   enlarge 8B + 1B + EAGLE ~115 s     (reused when there)
#   torch builds            ~60-100 s each for the 8B bf16 and int4 targets (numpy, single-threaded), 10 s the draft
#   bench_torch.py          the rest of the budget: sections are skipped (and said so) once it is spent
# The tests run beside the enlarging and building (GPU against CPU), and the measurement waits for them (PARALLEL_TESTS=0: first,
# alone). METHODS: a regular expression of decode's methods to keep (bench_torch.py --methods; target-only always).
# PEAGLE=1 adds a P-EAGLE target (the demo's P-EAGLE module enlarged, one more 8B torch build, ~60-100 s) and its methods
# to the decode section (its exactness is in the tests either way: tests/runtime/test_torch_cuda.py). PEAGLE_REFINE=1,auto
# (with PEAGLE=1) enlarges the module trained to read its drafts instead (heads/peagle-refine: its one call drafts as the
# blind module's) and decodes its chains again with those --peagle_refine settings, fixed k = 4 and auto.
# GEMM=1 (default) times the GEMM's per-shape tiles against the one 16 x 32 tile and cuBLAS (bench_gemm.py --tiles policy, ~20 s;
# GEMM_SWEEP=1 adds every candidate tile on the 8B and 1B shapes, ~2 min; GEMM_ROWS=1, default, each layer's tile with other
# row tiles, checked for the same bits, ~30 s), after the tests and beside the building;
# COMPARE=unfused,fixed (default) times the target's steps under those SPECDEC_TORCH_DENSE choices too (bench_torch.py --compare;
# COMPARE= times the default alone).
# TEST_K: a pytest -k expression choosing among the GPU tests (default: all of them).
# The server's GPU test needs specdec's serve extra, which GPU hosts without a registry lack: wheels for the host's Python in
# build/serve-wheels (carried with the call) are installed from there first, made on a machine with a registry by
#   pip download --only-binary=:all: --python-version 3.12 --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 \
#       -d build/serve-wheels fastapi uvicorn prometheus_client jinja2 llguidance httpx      # ~7 MB
# DRY=1 runs the same stages on a CPU with the demo pair as it is (no enlargement), float32, batches 1 and 2, few tokens:
# a check of this script and bench_torch.py before a device is spent on them.
set -euo pipefail
start=$(date +%s)
root=$(cd "$(dirname "$0")/.." && pwd)
PRESET=${PRESET:-llama8b}
WORK=${WORK:-/tmp/specdec-gpu}
OUT=${OUT:-$PWD/gpu-results}
BUDGET_S=${BUDGET_S:-540}
BATCHES=${BATCHES_TORCH:-1,4,16,64}
mkdir -p "$WORK" "$OUT"  # (gpu_session.sh made them; a DRY=1 run calls this script itself)
left() { echo $(( BUDGET_S - ($(date +%s) - start) )); }
pack_out() {  # at most 8 files come back from a device call: past 7, all but the log, the results and the tests' summary go into results.tgz
    [ -n "${tests_pid:-}" ] && { kill "$tests_pid" 2>/dev/null; wait "$tests_pid" 2>/dev/null; }  # no file packed while written
    (cd "$OUT" && mapfile -t files < <(ls -1 | grep -v -x -F -e "gpu-session-$PRESET.log" -e "torch-$PRESET.json" -e torch-tests-summary.log \
        -e results.tgz) && [ "${#files[@]}" -gt 4 ] && tar czf results.tgz "${files[@]}" && rm -f "${files[@]}" && echo "== packed into $OUT/results.tgz: ${files[*]}") || true
}
trap pack_out EXIT
# specdec importable without installing anything: the checkout is the package (setup.py maps its folders to specdec.*)
if ! python3 -c "import specdec.runtime.backends.torch" 2>/dev/null; then
    mkdir -p /tmp/specdec-site && ln -sfn "$root" /tmp/specdec-site/specdec
    export PYTHONPATH=/tmp/specdec-site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONUNBUFFERED=1
python3 - <<'PY'
import torch, triton, transformers, numpy
print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.is_available(), "triton", triton.__version__,
      "transformers", transformers.__version__, "numpy", numpy.__version__)
if torch.cuda.is_available():
    print("gpu", torch.cuda.get_device_name(0), f"{torch.cuda.get_device_properties(0).total_memory / 2**30:.0f} GiB",
          "sm", "%d%d" % torch.cuda.get_device_capability(0))
for name in ("onnx", "ml_dtypes", "click", "tqdm", "pytest", "onnxruntime"):
    try:
        module = __import__(name)
        print(name, getattr(module, "__version__", "?"))
    except ImportError as err:
        print("no", name, f"({err})")
PY
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
df -h "$WORK" | tail -1
if [ -d "$root/build/serve-wheels" ] && ! python3 -c "import fastapi, httpx, llguidance" 2>/dev/null; then
    echo "== the serve extra from $root/build/serve-wheels"
    serve=(python3 -m pip install -q --no-index --find-links "$root/build/serve-wheels" fastapi uvicorn prometheus_client jinja2 llguidance httpx)
    "${serve[@]}" 2>&1 || "${serve[@]}" --break-system-packages 2>&1 || echo "== could not install the serve extra from build/serve-wheels"
fi
run_tests() {
    local tests=(tests/runtime/test_torch_cuda.py tests/runtime/test_torch_kernels.py)
    # the server's test where the host has the serve extra (a module that fails to import stops pytest's whole run)
    if python3 -c "import specdec.serve, httpx" 2>/dev/null; then
        tests+=("tests/serve/test_serve_gpu.py::test_sixteen_concurrent_clients_on_the_torch_backend_get_their_solo_output")
    else
        echo "== specdec.serve or httpx does not import on this host: the server's GPU test is left out (carry its packages as wheels to run it)"
    fi
    (cd "$root" && timeout "${TEST_S:-240}" python3 -m pytest -q -p no:cacheprovider -rs --durations=12 ${TEST_K:+-k "$TEST_K"} "${tests[@]}" \
        > "$OUT/torch-pytest-cuda.log" 2>&1) || echo "== tests failed or timed out: $OUT/torch-pytest-cuda.log"
    tail -40 "$OUT/torch-pytest-cuda.log"
}
run_gemm() {  # GEMM=1: the per-shape tiles against the one 16 x 32 tile and cuBLAS; GEMM_SWEEP=1: every candidate tile, 8B and 1B shapes
    [ "${GEMM:-1}" = 1 ] || return 0
    echo "== bench_gemm.py --tiles policy ($(left) s left)"
    python3 "$root/benchmarks/bench_gemm.py" --tiles policy --kinds dense,int4 --json "$OUT/gemm-$PRESET-policy.json" > "$OUT/gemm-$PRESET-policy.log" 2>&1 \
        || echo "== bench_gemm.py failed: $OUT/gemm-$PRESET-policy.log"
    cut -c1-200 "$OUT/gemm-$PRESET-policy.log" | tail -30
    if [ "${GEMM_ROWS:-1}" = 1 ]; then  # does a layer keep its bits on another row tile? (bench_gemm.py --tiles rows)
        python3 "$root/benchmarks/bench_gemm.py" --tiles rows --kinds dense,int4 --layers qkv,o,gate_up,down --rows 1,16,80 \
            --json "$OUT/gemm-$PRESET-rows.json" > "$OUT/gemm-$PRESET-rows.log" 2>&1 || echo "== bench_gemm.py --tiles rows failed"
        cut -c1-200 "$OUT/gemm-$PRESET-rows.log" | tail -30
    fi
    [ "${GEMM_SWEEP:-0}" = 1 ] || return 0
    for preset in $(printf '%s\n' "$PRESET" llama1b | awk '!seen[$0]++'); do  # the draft's shapes too, once
        python3 "$root/benchmarks/bench_gemm.py" --preset "$preset" --kinds "$([ "$preset" = "$PRESET" ] && echo int4,dense || echo dense)" \
            --budget_s "$([ "$preset" = "$PRESET" ] && echo 75 || echo 40)" --json "$OUT/gemm-$preset-sweep.json" > "$OUT/gemm-$preset-sweep.log" 2>&1 || echo "== sweep $preset failed"
    done
}
tests_pid=
if [ "${TESTS:-1}" = 1 ] && [ "${DRY:-0}" != 1 ] && [ "${PARALLEL_TESTS:-1}" = 1 ]; then
    # the tests (GPU, demo pair) run while the CPU enlarges and builds the 8B pair; the measurement waits for them
    echo "== GPU tests of the torch backend, beside the enlarging and building ($(left) s left)"
    { run_tests; run_gemm; } > "$OUT/torch-tests-summary.log" 2>&1 &  # the GEMM timings too, while the CPU builds
    tests_pid=$!
elif [ "${TESTS:-1}" = 1 ]; then
    echo "== GPU tests of the torch backend ($(left) s left)"
    run_tests
fi
[ -z "$tests_pid" ] && [ "${DRY:-0}" != 1 ] && run_gemm
if [ "${DRY:-0}" = 1 ]; then
    demo="$root/examples/demo-pair"
    echo "== dry run on the CPU: the demo pair, float32 ($(left) s left)"
    python3 "$root/benchmarks/bench_torch.py" --target "$demo/target" --draft "$demo/draft" --eagle "$demo/heads/eagle" --int4 \
        --peagle "$demo/heads/peagle-refine" --peagle_refine 1,auto --work "$WORK/torch-dry" --device cpu --dtype float32 --batches 1,2 --min_prompts 2 --prompt_tokens 24 --max_new_tokens 8 \
        --repeats 1 --budget_s "$(left)" --json "$OUT/torch-dry.json"
    echo "== dry run done in $(( $(date +%s) - start )) s"
    exit 0
fi
draft_preset=llama1b
enlarge() {  # enlarge SRC DST ARGS...: skipped when DST already holds a checkpoint
    local src=$1 dst=$2; shift 2
    if [ -f "$dst/config.json" ]; then echo "reuse $dst"; return; fi
    t=$(date +%s); python3 "$root/benchmarks/enlarge.py" --quiet "$@" "$src" "$dst"; echo "enlarged $(basename "$dst") in $(( $(date +%s) - t )) s"
}
demo="$root/examples/demo-pair"
enlarge "$demo/draft" "$WORK/draft-$draft_preset" --preset "$draft_preset" --dtype bfloat16 &  # beside the target's
enlarge "$demo/target" "$WORK/target-$PRESET" --preset "$PRESET" --dtype bfloat16
wait $!
[ -f "$WORK/eagle-$PRESET/config.json" ] || python3 "$root/benchmarks/enlarge.py" --heads "$demo/heads/eagle" --base "$WORK/target-$PRESET" "$WORK/eagle-$PRESET"
extra=()
[ -n "${PEAGLE_REFINE:-}" ] && [ "${PEAGLE:-0}" != 1 ] && echo "== PEAGLE_REFINE=$PEAGLE_REFINE ignored: it refines the P-EAGLE target's chains (PEAGLE=1)"
if [ "${PEAGLE:-0}" = 1 ]; then
    if [ -n "${PEAGLE_REFINE:-}" ]; then  # refining needs a module trained to read its drafts; its one call drafts as the blind one's
        python3 - "$PEAGLE_REFINE" <<'PY'  # a bad value stops the session here, before the module is enlarged
import sys
from specdec.formats.errors import RequestError
from specdec.runtime.proposers.peagle import refine_value
try:
    [refine_value(x) for x in sys.argv[1].split(",") if x.strip()]
except RequestError as err:
    sys.exit(f"PEAGLE_REFINE: {err}")
PY
        peagle_heads=peagle-refine
        extra+=(--peagle_refine "$PEAGLE_REFINE")
    else
        peagle_heads=peagle
    fi
    [ -f "$WORK/$peagle_heads-$PRESET/config.json" ] || python3 "$root/benchmarks/enlarge.py" --heads "$demo/heads/$peagle_heads" \
        --base "$WORK/target-$PRESET" "$WORK/$peagle_heads-$PRESET"
    extra+=(--peagle "$WORK/$peagle_heads-$PRESET")
fi
[ "${INT4:-1}" = 1 ] && extra+=(--int4)
[ "${ORT:-0}" = 1 ] && extra+=(--ort)
bench=(python3 "$root/benchmarks/bench_torch.py" --target "$WORK/target-$PRESET" --draft "$WORK/draft-$draft_preset" --eagle "$WORK/eagle-$PRESET"
       "${extra[@]}" --work "$WORK/torch-$PRESET" --batches "$BATCHES")
if [ -n "$tests_pid" ]; then
    echo "== builds with $(left) s left (the tests still running)"
    "${bench[@]}" --sections build --build_jobs "${BUILD_JOBS:-3}" --budget_s "$(left)" --json "$OUT/torch-$PRESET-build.json"
    echo "== waiting for the tests ($(left) s left)"
    wait "$tests_pid" || true
    tests_pid=
    cat "$OUT/torch-tests-summary.log"
fi
echo "== bench_torch.py with $(left) s left"
python3 "$root/benchmarks/bench_torch.py" --target "$WORK/target-$PRESET" --draft "$WORK/draft-$draft_preset" --eagle "$WORK/eagle-$PRESET" \
    "${extra[@]}" --work "$WORK/torch-$PRESET" --batches "$BATCHES" --hf_batches "${HF_BATCHES:-1,16}" --budget_s "$(left)" \
    --json "$OUT/torch-$PRESET.json" --max_new_tokens "${NEW_TOKENS:-64}" --repeats "${REPEATS:-2}" ${SECTIONS:+--sections "$SECTIONS"} ${METHODS:+--methods "$METHODS"} \
    --compare "${COMPARE-unfused,fixed}"
echo "== done in $(( $(date +%s) - start )) s; $OUT/torch-$PRESET.json"
du -sh "$WORK"/* 2>/dev/null || true
