#!/usr/bin/env bash
# GRPO for a DeepCoder-style coding agent with veRL, through agentboost's agent loop: the model writes a
# program, tests it on public examples with the run_tests tool, and is rewarded by hidden tests that run
# in agentboost's sandbox on the agent-loop workers.
#
#   python examples/deepcoder/prepare_data.py --verl --train ... --test ...   # writes DATA_DIR/*.parquet
#   bash examples/deepcoder/train_verl.sh
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
DATA_DIR=${DATA_DIR:-data/deepcoder}              # train.parquet / test.parquet from prepare_data.py --verl
EXPERIMENT_NAME=${EXPERIMENT_NAME:-deepcoder-${ROLLOUT_BACKEND}}
CONFIG=${CONFIG:-$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/verl.yaml}
# ----------------------------------------------------------------------------------------------------

case "$ROLLOUT_BACKEND" in
    vllm | sglang) ;;
    *) echo "ROLLOUT_BACKEND must be vllm or sglang, not '$ROLLOUT_BACKEND'" >&2; exit 2 ;;
esac
for split in train test; do
    if [[ ! -f "$DATA_DIR/$split.parquet" ]]; then
        echo "no $DATA_DIR/$split.parquet: run python examples/deepcoder/prepare_data.py --verl first" >&2
        exit 2
    fi
done

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

AGENT_LOOP_CONFIG=${AGENT_LOOP_CONFIG:-$(python -c 'import agentboost.integrations.verl as v; print(v.agent_loop_config_path())')}

TRAINER=(python -m verl.trainer.main_ppo)
if [[ "${DRY_RUN:-0}" == 1 ]]; then
    TRAINER=(python -m agentboost.integrations.verl.config)
fi

"${TRAINER[@]}" \
    "${FROM_CONFIG[@]}" \
    data.train_files="$DATA_DIR/train.parquet" \
    data.val_files="$DATA_DIR/test.parquet" \
    actor_rollout_ref.model.path="$MODEL" \
    actor_rollout_ref.rollout.name="$ROLLOUT_BACKEND" \
    actor_rollout_ref.rollout.tensor_model_parallel_size="$ROLLOUT_TP" \
    actor_rollout_ref.rollout.agent.agent_loop_config_path="$AGENT_LOOP_CONFIG" \
    actor_rollout_ref.rollout.agent.num_workers="$AGENT_WORKERS" \
    trainer.experiment_name="$EXPERIMENT_NAME" \
    trainer.n_gpus_per_node="$N_GPUS_PER_NODE" \
    trainer.nnodes="$NNODES" \
    "$@"
