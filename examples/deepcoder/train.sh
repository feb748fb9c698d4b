#!/usr/bin/env bash
# GRPO for a coding agent on one machine with agentboost's local trainer (embedded engine).
#
#   bash examples/deepcoder/train.sh                          # prepares HumanEval data if none is there
#   DATA_DIR=data/deepcoder bash examples/deepcoder/train.sh steps=20 rollout.group_size=4
#
# Prepare other data first with examples/deepcoder/prepare_data.py (DeepCoder, TACO, PrimeIntellect,
# LiveCodeBench, HumanEval); any `key=value` after the script's name overrides examples/deepcoder/train.yaml.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
DATA_DIR=${DATA_DIR:-data/deepcoder}
CONFIG=${CONFIG:-$HERE/train.yaml}
OUTPUT_DIR=${OUTPUT_DIR:-runs/deepcoder}

if [[ ! -f "$DATA_DIR/train.jsonl" || ! -f "$DATA_DIR/test.jsonl" ]]; then
    python "$HERE/prepare_data.py" --out-dir "$DATA_DIR"
fi

exec agentboost train "$CONFIG" \
    environment.kwargs.data.train="$DATA_DIR/train.jsonl" \
    environment.kwargs.data.test="$DATA_DIR/test.jsonl" \
    output_dir="$OUTPUT_DIR" \
    "$@"
