#!/usr/bin/env bash
# The main job, as a new user runs it, in two parts:
#  1. build a target and a draft engine from the demo pair shipped in examples/demo-pair, and an EAGLE-3
#     target from the demo target and its trained EAGLE module (examples/demo-pair/heads/eagle), then decode
#     a code prompt with draft-target speculative decoding, with n-gram drafting and with an EAGLE draft tree,
#     each against target-only decoding in the same run;
#  2. the same on a zero-padded enlargement of the pair made here (benchmarks/enlarge.py): the same
#     tokens, but a target whose step costs its weight bytes, as a real model's does. The demo target is
#     so small that per-call overhead, not weights, sets its speed, which hides what speculation buys.
# Each comparison is timed several times, interleaved (target-only, method, method, target-only, ...);
# the tables give the median and the spread. A few minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${SPECDEC_DEMO_OUT:-demo-engines}
REPEAT=${SPECDEC_DEMO_REPEAT:-5}
# The prompt ends mid-line: the byte-level BPE merges a newline with the next line's
# indentation, so a prompt ending in a bare newline starts the model at column 0.
PROMPT=${SPECDEC_DEMO_PROMPT:-'class Stack:\n    """A last-in, first-out stack."""\n\n    def __init__(self):\n        self._items = []\n\n    def push(self, item):\n        self'}

say() { printf '\n\033[1m$ %s\033[0m\n' "$*"; }
build() {  # build TARGET_CKPT DRAFT_CKPT DIR: a target that verifies up to 8 drafts, and a draft with the same limits
    say specdec-build --checkpoint_dir "$1" --output_dir "$3/target" --speculative_decoding_mode draft_tokens_external --max_draft_len 8 --max_seq_len 1024 --max_batch_size 4 --force
    specdec-build --checkpoint_dir "$1" --output_dir "$3/target" --speculative_decoding_mode draft_tokens_external --max_draft_len 8 --max_seq_len 1024 --max_batch_size 4 --force
    say specdec-build --checkpoint_dir "$2" --output_dir "$3/draft" --max_seq_len 1024 --max_batch_size 4 --force
    specdec-build --checkpoint_dir "$2" --output_dir "$3/draft" --max_seq_len 1024 --max_batch_size 4 --force
}
EAGLE_TREE=${SPECDEC_DEMO_EAGLE_CHOICES:-'[[0],[1],[0,0],[0,0,0]]'}
build_eagle() {  # build_eagle TARGET_CKPT EAGLE_MODULE DIR: the target with its EAGLE-3 module (DIR/eagle/ holds the module's engine)
    say specdec-build --checkpoint_dir "$1" --output_dir "$3/eagle" --speculative_decoding_mode eagle --eagle_dir "$2" --max_draft_len 8 --max_seq_len 1024 --max_batch_size 4 --force
    specdec-build --checkpoint_dir "$1" --output_dir "$3/eagle" --speculative_decoding_mode eagle --eagle_dir "$2" --max_draft_len 8 --max_seq_len 1024 --max_batch_size 4 --force
}
compare() {  # compare DIR TOKENS TAG: draft-target, then n-gram, then EAGLE, each interleaved with target-only
    say specdec-run --engine_dir "$1/target" --draft_engine_dir "$1/draft" --draft_target_model_config "[4,[0],[0],False]" --input_text "..." --max_output_len "$2" --baseline --repeat "$REPEAT"
    specdec-run --engine_dir "$1/target" --draft_engine_dir "$1/draft" --draft_target_model_config "[4,[0],[0],False]" \
        --input_text "$PROMPT" --max_output_len "$2" --baseline --repeat "$REPEAT" --output_json "$OUT/$3-draft.json"
    say specdec-run --engine_dir "$1/target" --ngram_config "[8,3,[0]]" --input_text "..." --max_output_len "$2" --baseline --repeat "$REPEAT"
    specdec-run --engine_dir "$1/target" --ngram_config "[8,3,[0]]" \
        --input_text "$PROMPT" --max_output_len "$2" --baseline --repeat "$REPEAT" --output_json "$OUT/$3-ngram.json"
    say specdec-run --engine_dir "$1/eagle" --eagle_choices "\"$EAGLE_TREE\"" --input_text "..." --max_output_len "$2" --baseline --repeat "$REPEAT"
    specdec-run --engine_dir "$1/eagle" --eagle_choices "$EAGLE_TREE" \
        --input_text "$PROMPT" --max_output_len "$2" --baseline --repeat "$REPEAT" --output_json "$OUT/$3-eagle.json"
}

printf '\n\033[1m== 1. The demo pair as shipped: target 5.8M parameters, draft 0.9M\033[0m\n'
build examples/demo-pair/target examples/demo-pair/draft "$OUT"
build_eagle examples/demo-pair/target examples/demo-pair/heads/eagle "$OUT"
compare "$OUT" 160 small

printf '\n\033[1m== 2. The same pair, zero-padded to a 131M-parameter target and a 4.2M draft (same outputs, real-model costs)\033[0m\n'
# Target: width x3 and x3 the layers; draft: width x2 and x2 the layers. Every new weight is an exact zero
# (benchmarks/README.md says why the function does not change). The float32 target engine is 498 MiB, read
# once per target step: more than a CPU's last-level cache, so a step costs its weight bytes, as a real model's does.
say python benchmarks/enlarge.py --hidden_size 768 --intermediate_size 2304 --num_heads 24 --num_kv_heads 12 --extra_layers 12 --dtype float32 --force examples/demo-pair/target "$OUT/enlarged-ckpt/target"
python benchmarks/enlarge.py --hidden_size 768 --intermediate_size 2304 --num_heads 24 --num_kv_heads 12 --extra_layers 12 \
    --dtype float32 --force examples/demo-pair/target "$OUT/enlarged-ckpt/target"
say python benchmarks/enlarge.py --hidden_size 256 --intermediate_size 768 --num_heads 8 --num_kv_heads 4 --extra_layers 2 --dtype float32 --force examples/demo-pair/draft "$OUT/enlarged-ckpt/draft"
python benchmarks/enlarge.py --hidden_size 256 --intermediate_size 768 --num_heads 8 --num_kv_heads 4 --extra_layers 2 \
    --dtype float32 --force examples/demo-pair/draft "$OUT/enlarged-ckpt/draft"
# The EAGLE module grows with its target (the same zero padding; benchmarks/enlarge.py --heads).
say python benchmarks/enlarge.py --heads examples/demo-pair/heads/eagle --base "$OUT/enlarged-ckpt/target" "$OUT/enlarged-ckpt/eagle"
python benchmarks/enlarge.py --heads examples/demo-pair/heads/eagle --base "$OUT/enlarged-ckpt/target" --force "$OUT/enlarged-ckpt/eagle"
build "$OUT/enlarged-ckpt/target" "$OUT/enlarged-ckpt/draft" "$OUT/enlarged"
build_eagle "$OUT/enlarged-ckpt/target" "$OUT/enlarged-ckpt/eagle" "$OUT/enlarged"
compare "$OUT/enlarged" 64 enlarged

printf '\n\033[1m== Speedup over target-only (median of %s interleaved runs, min-max)\033[0m\n' "$REPEAT"
python - "$OUT" <<'EOF'
import json, sys
out = sys.argv[1]
print(f"{'pair':<34}{'draft-target':>22}{'n-gram':>22}{'EAGLE tree':>22}")
for tag, name in (("small", "demo pair (5.8M target)"), ("enlarged", "enlarged pair (131M target)")):
    cells = []
    for method in ("draft", "ngram", "eagle"):
        b = json.load(open(f"{out}/{tag}-{method}.json"))["baseline"]
        ups = b.get("repeats", {}).get("speedups", [b["speedup"]])
        same = "" if b["identical_outputs"] else " (outputs differ!)"
        cells.append(f"{b['speedup']:.2f}x ({min(ups):.2f}-{max(ups):.2f}){same}")
    print(f"{name:<34}{cells[0]:>22}{cells[1]:>22}{cells[2]:>22}")
EOF
