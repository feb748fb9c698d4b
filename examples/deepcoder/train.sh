#!/usr/bin/env bash
# GRPO for a coding agent on one machine with agentboost's local trainer (embedded engine).
#
#   bash examples/deepcoder/train.sh                          # prepares HumanEval data if none is there
#   SMOKE=1 bash examples/deepcoder/train.sh   # the same at a smoke size (one small step), under runs/smoke/
#   DATA_DIR=data/deepcoder bash examples/deepcoder/train.sh steps=20 rollout.group_size=4
#
# Prepare other data first with examples/deepcoder/prepare_data.py (DeepCoder, TACO, PrimeIntellect,
# LiveCodeBench, HumanEval); any `key=value` after the script's name overrides examples/deepcoder/train.yaml.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
DATA_DIR=${DATA_DIR:-data/deepcoder}
CONFIG=${CONFIG:-$HERE/train.yaml}
OUTPUT_DIR=${OUTPUT_DIR:-runs/deepcoder}
SMOKE_ARGS=() PREPARE_ARGS=()
if [[ "${SMOKE:-0}" == 1 ]]; then  # one small step and a small evaluation, end to end
    DATA_DIR=data/deepcoder-smoke OUTPUT_DIR=runs/smoke/deepcoder PREPARE_ARGS=(--limit 4)
    SMOKE_ARGS=(steps=1 rollout.tasks_per_step=1 rollout.group_size=2 rollout.max_turns=2
        rollout.max_new_tokens=128 rollout.concurrency=2 eval.tasks=2 eval.every=1 checkpoint.every=1)
fi

if [[ ! -f "$DATA_DIR/train.jsonl" || ! -f "$DATA_DIR/test.jsonl" ]]; then
    python "$HERE/prepare_data.py" --out-dir "$DATA_DIR" "${PREPARE_ARGS[@]}"
fi

exec agentboost train "$CONFIG" \
    environment.kwargs.data.train="$DATA_DIR/train.jsonl" \
    environment.kwargs.data.test="$DATA_DIR/test.jsonl" \
    output_dir="$OUTPUT_DIR" \
    "${SMOKE_ARGS[@]}" "$@"
