#!/usr/bin/env bash
# The main job, as a new user runs it: build a target and a draft engine from the
# demo pair shipped in examples/demo-pair, then decode a code prompt with
# draft-target speculative decoding and with n-gram drafting, each measured
# against target-only decoding in the same run.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${SPECDEC_DEMO_OUT:-demo-engines}
# The prompt ends mid-line: the byte-level BPE merges a newline with the next line's
# indentation, so a prompt ending in a bare newline starts the model at column 0.
PROMPT=${SPECDEC_DEMO_PROMPT:-'class Stack:\n    """A last-in, first-out stack."""\n\n    def __init__(self):\n        self._items = []\n\n    def push(self, item):\n        self'}

say() { printf '\n\033[1m$ %s\033[0m\n' "$*"; }

say specdec-build --checkpoint_dir examples/demo-pair/target --output_dir "$OUT/target" --speculative_decoding_mode draft_tokens_external --max_draft_len 8 --max_seq_len 1024 --force
specdec-build --checkpoint_dir examples/demo-pair/target --output_dir "$OUT/target" \
    --speculative_decoding_mode draft_tokens_external --max_draft_len 8 --max_seq_len 1024 --max_batch_size 4 --force

say specdec-build --checkpoint_dir examples/demo-pair/draft --output_dir "$OUT/draft" --max_seq_len 1024 --force
specdec-build --checkpoint_dir examples/demo-pair/draft --output_dir "$OUT/draft" --max_seq_len 1024 --max_batch_size 4 --force

say specdec-run --engine_dir "$OUT/target" --draft_engine_dir "$OUT/draft" --draft_target_model_config "[3,[0],[0],False]" --input_text "..." --max_output_len 160 --baseline
specdec-run --engine_dir "$OUT/target" --draft_engine_dir "$OUT/draft" --draft_target_model_config "[3,[0],[0],False]" \
    --input_text "$PROMPT" --max_output_len 160 --baseline

say specdec-run --engine_dir "$OUT/target" --ngram_config "[8,3,[0]]" --input_text "..." --max_output_len 160 --baseline
specdec-run --engine_dir "$OUT/target" --ngram_config "[8,3,[0]]" --input_text "$PROMPT" --max_output_len 160 --baseline
