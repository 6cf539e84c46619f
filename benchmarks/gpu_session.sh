#!/usr/bin/env bash
# One GPU session's measurement, in one go (docs/gpu.md#the-8b-shaped-pair; figures: docs/benchmarks.md): generate the
# 8B-shaped pair from the demo pair, build its engines, measure. Resumable: what is already in $WORK
# (checkpoints, engines) is reused, so a second call on a still-warm host carries on where the first stopped.
#
#   bash benchmarks/gpu_session.sh                      # PRESET=llama8b, results in $OUT (or ./gpu-results)
#   PRESET=llama3b bash benchmarks/gpu_session.sh       # the fallback when the 8B build does not fit
#   BENCH=drafters bash benchmarks/gpu_session.sh       # suffix decoding vs n-gram vs EAGLE (bench_drafters.py speed)
#
# Environment: PRESET (llama8b | llama3b), WORK (default /tmp/specdec-gpu), OUT (default ./gpu-results),
# BUDGET_S (seconds for the whole script, default 540: a 10-minute device call with room to copy results
# back), INT4 (default 1: also an int4 target), MEDUSA (1: also a Medusa target: another bf16 copy of the
# weights on disk), SECTIONS (bench_gpu.py's --sections), BATCHES (default 1,4,16), NUM_PROMPTS (16),
# NEW_TOKENS (64), REPEATS (timed rounds after the warm-up round, 1). On the device, $OUT is the folder that
# comes back: results land there.
# BENCH=drafters: only the EAGLE target is built (batch 1, --max_draft_len 8: it verifies suffix and n-gram
# trees and chains too), then bench_drafters.py speed on the GPU: the agentic and demo workloads, target-only,
# n-gram, suffix decoding and EAGLE interleaved, ROUNDS rounds (3), REQUESTS agentic requests (50), TOKENS each (32).
# MAX_DRAFT_LEN (8) the engine's, METHODS bench_drafters' --methods.
# BUILD_ONLY=1 stops after the build (a first device call; the second, on the still-warm host, reuses it).
# BENCH=torch: the torch backend (issue 37; needs torch with CUDA and Triton, not onnxruntime-gpu): first its GPU tests on
# the demo pair (tests/runtime/test_torch_cuda.py, the kernels compiled, the server; TESTS=0 skips them, TEST_S caps them at
# 240 s), then the pair enlarged, built with --backend torch (target as an EAGLE target, draft, int4) and measured by
# benchmarks/bench_torch.py: read-bandwidth floor, steps at BATCHES (default here 1,4,16,64), kernels per step, every
# method and auto, Hugging Face at HF_BATCHES (default 1,16: each batch size compiles for about a minute). ORT=1 adds the
# ort_cuda engines beside (onnxruntime-gpu must be installed: ../shared/gpu/README.md). PEAGLE=1 adds a P-EAGLE target
# and its methods (one more 8B build). REPEATS (2), NEW_TOKENS (64).
set -euo pipefail
start=$(date +%s)
PRESET=${PRESET:-llama8b}
WORK=${WORK:-/tmp/specdec-gpu}
OUT=${OUT:-$PWD/gpu-results}
BUDGET_S=${BUDGET_S:-540}
BATCHES=${BATCHES:-1,4,16}
SECTIONS=${SECTIONS:-build,steps,profile,decode,hf}
root=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$WORK" "$OUT"
log="$OUT/gpu-session-$PRESET.log"
exec > >(tee -a "$log") 2>&1
echo "== $(date -u +%FT%TZ) preset $PRESET, work $WORK, budget $BUDGET_S s, bench ${BENCH:-gpu}"
if [ "${BENCH:-gpu}" = torch ]; then
    exec bash "$root/benchmarks/gpu_session_torch.sh"
fi
python3 - <<'EOF'
import onnxruntime as ort
providers = ort.get_available_providers()
print("onnxruntime", ort.__version__, providers)
assert "CUDAExecutionProvider" in providers, "onnxruntime-gpu is not installed: see docs/gpu.md#install"
try:
    import torch, transformers
    print("torch", torch.__version__, "cuda", torch.cuda.is_available(), "transformers", transformers.__version__)
except ImportError as err:
    print("no torch/transformers here:", err, "(the Hugging Face section and kernel counts are skipped)")
EOF
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
df -h "$WORK" | tail -1
free -g | head -2

draft_preset=llama1b
step() { echo "== [$(( $(date +%s) - start )) s] $*"; }  # where the session is, in the log as it goes
timed() {  # timed LABEL CMD...: run CMD, print its wall time and peak memory (its own rusage; GNU time may be absent)
    step "$1 ..."
    python3 - "$@" <<'EOF'
import os, subprocess, sys, time
label, cmd = sys.argv[1], sys.argv[2:]
t = time.time()
proc = subprocess.Popen(cmd)
_, status, usage = os.wait4(proc.pid, 0)
print(f"{label}: {time.time() - t:.0f} s, peak RSS {usage.ru_maxrss / 2**20:.1f} GiB, exit {os.waitstatus_to_exitcode(status)}", flush=True)
sys.exit(os.waitstatus_to_exitcode(status))
EOF
}
enlarge() {  # enlarge SRC DST ARGS...: skipped when DST already holds a checkpoint
    local src=$1 dst=$2; shift 2
    if [ -f "$dst/config.json" ]; then echo "reuse $dst"; return; fi
    timed "enlarge $(basename "$dst")" python3 "$root/benchmarks/enlarge.py" "$@" "$src" "$dst"  # a line per quarter of the layers
}
demo="$root/examples/demo-pair"
enlarge "$demo/target" "$WORK/target-$PRESET" --preset "$PRESET" --dtype bfloat16
[ "${BENCH:-gpu}" = drafters ] || enlarge "$demo/draft" "$WORK/draft-$draft_preset" --preset "$draft_preset" --dtype bfloat16
if [ ! -f "$WORK/eagle-$PRESET/config.json" ]; then
    step "enlarge the EAGLE module"
    python3 "$root/benchmarks/enlarge.py" --heads "$demo/heads/eagle" --base "$WORK/target-$PRESET" "$WORK/eagle-$PRESET"
fi
if [ "${BENCH:-gpu}" = drafters ]; then
    engine="$WORK/engines-$PRESET/eagle-tree-k${MAX_DRAFT_LEN:-8}"
    [ -f "$engine/config.json" ] || timed "build $(basename "$engine")" python3 -m specdec.cli.build --model_dir "$WORK/target-$PRESET" \
        --output_dir "$engine" --lowering ort_cuda --dtype bfloat16 --max_batch_size 1 --max_input_len 256 --max_seq_len 512 \
        --max_draft_len "${MAX_DRAFT_LEN:-8}" --speculative_decoding_mode eagle --eagle_dir "$WORK/eagle-$PRESET" --force
    [ "${BUILD_ONLY:-0}" = 1 ] && { echo "== built in $(( $(date +%s) - start )) s (BUILD_ONLY)"; exit 0; }
    step "bench_drafters.py speed with $(( BUDGET_S - ($(date +%s) - start) )) s left"
    python3 "$root/benchmarks/bench_drafters.py" speed --device cuda --target "$engine" --eagle_target "$engine" --workload agentic,demo \
        --requests "${REQUESTS:-50}" --tokens "${TOKENS:-32}" --rounds "${ROUNDS:-3}" --oracle --json "$OUT/drafters-$PRESET.json" \
        --methods "${METHODS:-ngram,ngram auto,suffix-t0,suffix,suffix auto,eagle}"
    echo "== done in $(( $(date +%s) - start )) s; $OUT/drafters-$PRESET.json"
    exit 0
fi
extra=()
if [ "${MEDUSA:-0}" = 1 ]; then
    if [ ! -f "$WORK/medusa-$PRESET/config.json" ]; then
        step "enlarge the Medusa heads"
        python3 "$root/benchmarks/enlarge.py" --heads "$demo/heads/medusa" --base "$WORK/target-$PRESET" "$WORK/medusa-$PRESET"
    fi
    extra+=(--medusa "$WORK/medusa-$PRESET")
fi
[ "${INT4:-1}" = 1 ] && extra+=(--int4)
left=$(( BUDGET_S - ($(date +%s) - start) ))
step "bench_gpu.py with $left s left"
python3 "$root/benchmarks/bench_gpu.py" --target "$WORK/target-$PRESET" --draft "$WORK/draft-$draft_preset" --eagle "$WORK/eagle-$PRESET" \
    "${extra[@]}" --work "$WORK/engines-$PRESET" --batches "$BATCHES" --sections "$SECTIONS" --budget_s "$left" --json "$OUT/gpu-$PRESET.json" \
    --num_prompts "${NUM_PROMPTS:-16}" --max_new_tokens "${NEW_TOKENS:-64}" --repeats "${REPEATS:-1}"
echo "== done in $(( $(date +%s) - start )) s; $OUT/gpu-$PRESET.json"
du -sh "$WORK"/* 2>/dev/null || true
