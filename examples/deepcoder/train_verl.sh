#!/usr/bin/env bash
# GRPO for a DeepCoder-style coding agent with veRL, through agentboost's agent loop: the model writes a
# program, tests it on public examples with the run_tests tool, and is rewarded by hidden tests that run
# in agentboost's sandbox on the agent-loop workers.
#
#   python examples/deepcoder/prepare_data.py --verl --train ... --test ...   # writes DATA_DIR/*.parquet
#   bash examples/deepcoder/train_verl.sh        # (prepares TRAIN_SOURCES / TEST_SOURCES if DATA_DIR is empty)
#
# Many nodes: start Ray first (`ray start --head` on node 0, `ray start --address=HEAD:6379` on the
# others), then run this script on node 0 with NNODES set. Hyperparameters live in examples/deepcoder/
# verl.yaml (CONFIG=... for another file); the knobs below override it, and any Hydra override after the
# script's name overrides both. DRY_RUN=1 composes and checks the whole trainer configuration (no GPU,
# no Ray) instead of training; `agentboost doctor` checks the installed versions.
set -euo pipefail

# --- what a user tunes -----------------------------------------------------------------------------
MODEL=${MODEL:-Qwen/Qwen3-1.7B}                   # hub id or local directory (weights + tokenizer)
ROLLOUT_BACKEND=${ROLLOUT_BACKEND:-vllm}          # vllm | sglang
N_GPUS_PER_NODE=${N_GPUS_PER_NODE:-8}
NNODES=${NNODES:-1}
ROLLOUT_TP=${ROLLOUT_TP:-1}                       # tensor parallel size of each vLLM / SGLang server
AGENT_WORKERS=${AGENT_WORKERS:-8}                 # agent-loop worker processes (agents and sandboxes run there)
DATA_DIR=${DATA_DIR:-data/deepcoder}              # train.parquet / test.parquet (prepare_data.py --verl)
TRAIN_SOURCES=${TRAIN_SOURCES:-humaneval}         # used only when DATA_DIR has no parquet yet: files, hub
TEST_SOURCES=${TEST_SOURCES:-humaneval}           #   names (NAME:CONFIG) or humaneval, space-separated
TRAIN_TASKS=${TRAIN_TASKS:-}                      # at most this many tasks per split (empty: all)
VAL_TASKS=${VAL_TASKS:-}
EXPERIMENT_NAME=${EXPERIMENT_NAME:-deepcoder-${ROLLOUT_BACKEND}}
CONFIG=${CONFIG:-$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/verl.yaml}
# ----------------------------------------------------------------------------------------------------

# shellcheck source=examples/verl_common.sh
source "$(dirname "${BASH_SOURCE[0]}")/../verl_common.sh"
check_rollout_backend
# Tasks as veRL parquet, unless prepared already (examples/deepcoder/prepare_data.py --verl also drops
# training problems that are in the test set; this shortcut does not).
if [[ ! -f "$DATA_DIR/train.parquet" ]]; then
    # shellcheck disable=SC2086  # the sources are a space-separated list
    agentboost data prepare-coding $TRAIN_SOURCES --split train ${TRAIN_TASKS:+--limit "$TRAIN_TASKS"} \
        --out "$DATA_DIR/train.jsonl" --verl-out "$DATA_DIR/train.parquet" --force
fi
if [[ ! -f "$DATA_DIR/test.parquet" ]]; then
    # shellcheck disable=SC2086
    agentboost data prepare-coding $TEST_SOURCES --split test ${VAL_TASKS:+--limit "$VAL_TASKS"} \
        --out "$DATA_DIR/test.jsonl" --verl-out "$DATA_DIR/test.parquet" --force
fi

# verl.yaml as Hydra overrides (nested keys joined with dots; lists and dicts as Hydra values).
mapfile -t FROM_CONFIG < <(python - "$CONFIG" <<'PY'
import json, sys, yaml

def flat(prefix, value):
    if isinstance(value, dict):
        for key, inner in value.items():
            yield from flat(f"{prefix}.{key}" if prefix else key, inner)
    elif isinstance(value, (list, bool)) or value is None:
        yield f"{prefix}={json.dumps(value)}"
    else:
        yield f"{prefix}={value}"

for override in flat("", yaml.safe_load(open(sys.argv[1]))):
    print(override)
PY
)

launch_verl "${FROM_CONFIG[@]}" "$@"
