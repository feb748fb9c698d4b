#!/usr/bin/env bash
# GRPO on the built-in arithmetic environment with veRL, through agentboost's agent loop.
#
# One node:   bash examples/arithmetic/train_verl.sh
# Many nodes: start Ray first (`ray start --head` on node 0, `ray start --address=HEAD:6379` on the
#             others), then run this script on node 0 with NNODES set.
# Any setting below can be overridden from the environment (MODEL=... bash train_verl.sh), and any
# further Hydra override can follow the script's name (bash train_verl.sh trainer.total_epochs=1).
# `agentboost doctor` checks the installed versions first; DRY_RUN=1 composes and checks the whole
# trainer configuration (no GPU, no Ray) instead of training.
set -euo pipefail

# --- what a user tunes -----------------------------------------------------------------------------
MODEL=${MODEL:-Qwen/Qwen3-0.6B}                   # hub id or local directory (weights + tokenizer)
ROLLOUT_BACKEND=${ROLLOUT_BACKEND:-vllm}          # vllm | sglang
ADV_ESTIMATOR=${ADV_ESTIMATOR:-grpo}              # grpo | rloo | reinforce_plus_plus | gae (needs a critic) ...
GROUP_SIZE=${GROUP_SIZE:-8}                       # rollouts per task (the GRPO group)
TRAIN_BATCH_SIZE=${TRAIN_BATCH_SIZE:-64}          # tasks per step
PPO_MINI_BATCH_SIZE=${PPO_MINI_BATCH_SIZE:-16}    # tasks per optimizer step
MICRO_BATCH_SIZE_PER_GPU=${MICRO_BATCH_SIZE_PER_GPU:-8}
LEARNING_RATE=${LEARNING_RATE:-1e-6}
KL_LOSS_COEF=${KL_LOSS_COEF:-0.001}
ENTROPY_COEFF=${ENTROPY_COEFF:-0}
TEMPERATURE=${TEMPERATURE:-1.0}
MAX_PROMPT_LENGTH=${MAX_PROMPT_LENGTH:-1024}      # system prompt + tool schemas + task
MAX_RESPONSE_LENGTH=${MAX_RESPONSE_LENGTH:-2048}  # every turn after the prompt: generations and tool results
TOTAL_EPOCHS=${TOTAL_EPOCHS:-10}
TRAIN_TASKS=${TRAIN_TASKS:-4096}
VAL_TASKS=${VAL_TASKS:-256}
DIFFICULTY=${DIFFICULTY:-2}                       # arithmetic difficulty 1-3
SEED=${SEED:-0}
N_GPUS_PER_NODE=${N_GPUS_PER_NODE:-8}
NNODES=${NNODES:-1}
ROLLOUT_TP=${ROLLOUT_TP:-1}                       # tensor parallel size of each vLLM / SGLang server
GPU_MEMORY_UTILIZATION=${GPU_MEMORY_UTILIZATION:-0.6}
AGENT_WORKERS=${AGENT_WORKERS:-8}                 # agent-loop worker processes (they run the Strands agents)
SAVE_FREQ=${SAVE_FREQ:-50}
TEST_FREQ=${TEST_FREQ:-10}
WANDB_PROJECT=${WANDB_PROJECT:-agentboost}        # wandb reads WANDB_API_KEY; WANDB_MODE=offline works too
EXPERIMENT_NAME=${EXPERIMENT_NAME:-arithmetic-${ADV_ESTIMATOR}-${ROLLOUT_BACKEND}}
if [[ "${DRY_RUN:-0}" == 1 && -z "${DATA_DIR:-}" ]]; then  # a dry run writes its tasks to a scratch dir
    DATA_DIR=$(mktemp -d)
    trap 'rm -rf "$DATA_DIR"' EXIT
fi
DATA_DIR=${DATA_DIR:-$HOME/data/agentboost/arithmetic-d${DIFFICULTY}}
# ----------------------------------------------------------------------------------------------------

# shellcheck source=examples/verl_common.sh
source "$(dirname "${BASH_SOURCE[0]}")/../verl_common.sh"
check_rollout_backend

# Tasks as veRL parquet (the environment is stored by import reference, each task as JSON).
ENV_KWARGS="{\"difficulty\": $DIFFICULTY}"
agentboost data to-verl --env arithmetic --env-kwargs "$ENV_KWARGS" --split train -n "$TRAIN_TASKS" \
    --seed "$SEED" --out "$DATA_DIR/train.parquet" --force
agentboost data to-verl --env arithmetic --env-kwargs "$ENV_KWARGS" --split test -n "$VAL_TASKS" \
    --seed "$SEED" --out "$DATA_DIR/test.parquet" --force

knob_overrides
launch_verl "${KNOBS[@]}" "$@"
