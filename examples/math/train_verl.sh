#!/usr/bin/env bash
# GRPO on the math environment (reasoning-gym generators, calculator or python tool) with veRL, through agentboost's agent loop.
#
# One node:   bash examples/math/train_verl.sh
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
GENERATORS=${GENERATORS:-products}                # reasoning-gym generator(s), comma-separated
TOOL=${TOOL:-python}                              # python (sandbox) | calculator | none
SEED=${SEED:-0}
N_GPUS_PER_NODE=${N_GPUS_PER_NODE:-8}
NNODES=${NNODES:-1}
ROLLOUT_TP=${ROLLOUT_TP:-1}                       # tensor parallel size of each vLLM / SGLang server
GPU_MEMORY_UTILIZATION=${GPU_MEMORY_UTILIZATION:-0.6}
AGENT_WORKERS=${AGENT_WORKERS:-8}                 # agent-loop worker processes (they run the Strands agents)
SAVE_FREQ=${SAVE_FREQ:-50}
TEST_FREQ=${TEST_FREQ:-10}
WANDB_PROJECT=${WANDB_PROJECT:-agentboost}        # wandb reads WANDB_API_KEY; WANDB_MODE=offline works too
EXPERIMENT_NAME=${EXPERIMENT_NAME:-math-${ADV_ESTIMATOR}-${ROLLOUT_BACKEND}}
DATA_DIR=${DATA_DIR:-$HOME/data/agentboost/math-${GENERATORS//,/-}}
# ----------------------------------------------------------------------------------------------------

case "$ROLLOUT_BACKEND" in
    vllm | sglang) ;;
    *) echo "ROLLOUT_BACKEND must be vllm or sglang, not '$ROLLOUT_BACKEND'" >&2; exit 2 ;;
esac

# Tasks as veRL parquet (the environment is stored by import reference, each task as JSON).
ENV_KWARGS="{\"generators\": \"$GENERATORS\", \"tool\": \"$TOOL\"}"
agentboost data to-verl --env math --env-kwargs "$ENV_KWARGS" --split train -n "$TRAIN_TASKS" \
    --seed "$SEED" --out "$DATA_DIR/train.parquet"
agentboost data to-verl --env math --env-kwargs "$ENV_KWARGS" --split test -n "$VAL_TASKS" \
    --seed "$SEED" --out "$DATA_DIR/test.parquet"

# The agent-loop config shipped inside the installed package; every node reads it. Where agentboost is
# installed at different paths on different nodes, set
# AGENT_LOOP_CONFIG=agentboost/integrations/verl/agent_loop.yaml (veRL resolves a relative path against
# each node's site-packages).
AGENT_LOOP_CONFIG=${AGENT_LOOP_CONFIG:-$(python -c 'import agentboost.integrations.verl as v; print(v.agent_loop_config_path())')}

TRAINER=(python -m verl.trainer.main_ppo)
if [[ "${DRY_RUN:-0}" == 1 ]]; then
    TRAINER=(python -m agentboost.integrations.verl.config)
fi

"${TRAINER[@]}" \
    algorithm.adv_estimator="$ADV_ESTIMATOR" \
    algorithm.use_kl_in_reward=False \
    data.train_files="$DATA_DIR/train.parquet" \
    data.val_files="$DATA_DIR/test.parquet" \
    data.train_batch_size="$TRAIN_BATCH_SIZE" \
    data.max_prompt_length="$MAX_PROMPT_LENGTH" \
    data.max_response_length="$MAX_RESPONSE_LENGTH" \
    data.filter_overlong_prompts=False \
    data.seed="$SEED" \
    actor_rollout_ref.model.path="$MODEL" \
    actor_rollout_ref.model.use_remove_padding=True \
    actor_rollout_ref.model.enable_gradient_checkpointing=True \
    actor_rollout_ref.actor.optim.lr="$LEARNING_RATE" \
    actor_rollout_ref.actor.ppo_mini_batch_size="$PPO_MINI_BATCH_SIZE" \
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu="$MICRO_BATCH_SIZE_PER_GPU" \
    actor_rollout_ref.actor.use_kl_loss=True \
    actor_rollout_ref.actor.kl_loss_coef="$KL_LOSS_COEF" \
    actor_rollout_ref.actor.kl_loss_type=low_var_kl \
    actor_rollout_ref.actor.entropy_coeff="$ENTROPY_COEFF" \
    actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu="$MICRO_BATCH_SIZE_PER_GPU" \
    actor_rollout_ref.rollout.name="$ROLLOUT_BACKEND" \
    actor_rollout_ref.rollout.mode=async \
    actor_rollout_ref.rollout.n="$GROUP_SIZE" \
    actor_rollout_ref.rollout.temperature="$TEMPERATURE" \
    actor_rollout_ref.rollout.tensor_model_parallel_size="$ROLLOUT_TP" \
    actor_rollout_ref.rollout.gpu_memory_utilization="$GPU_MEMORY_UTILIZATION" \
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu="$MICRO_BATCH_SIZE_PER_GPU" \
    actor_rollout_ref.rollout.calculate_log_probs=True \
    actor_rollout_ref.rollout.agent.agent_loop_config_path="$AGENT_LOOP_CONFIG" \
    actor_rollout_ref.rollout.agent.default_agent_loop=agentboost \
    actor_rollout_ref.rollout.agent.num_workers="$AGENT_WORKERS" \
    trainer.logger='["console","wandb"]' \
    trainer.project_name="$WANDB_PROJECT" \
    trainer.experiment_name="$EXPERIMENT_NAME" \
    trainer.n_gpus_per_node="$N_GPUS_PER_NODE" \
    trainer.nnodes="$NNODES" \
    trainer.save_freq="$SAVE_FREQ" \
    trainer.test_freq="$TEST_FREQ" \
    trainer.total_epochs="$TOTAL_EPOCHS" \
    "$@"
