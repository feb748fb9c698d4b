#!/usr/bin/env bash
# Train an unmodified OpenAI-SDK agent on the arithmetic tasks through the gateway.
# Extra arguments override the config, e.g. `bash examples/gateway/train.sh steps=10`;
# `SMOKE=1 bash examples/gateway/train.sh` runs it at a smoke size (one small step), under runs/smoke/.
set -euo pipefail
cd "$(dirname "$0")/../.."
python -c "import openai" 2>/dev/null || { echo "the agent needs the OpenAI SDK: pip install -e '.[gateway]'" >&2; exit 2; }
SMOKE_ARGS=()
if [[ "${SMOKE:-0}" == 1 ]]; then  # one small step and a small evaluation, end to end
    SMOKE_ARGS=(output_dir=runs/smoke/gateway steps=1 rollout.tasks_per_step=2 rollout.group_size=2
        eval.tasks=2 eval.every=1 checkpoint.every=1)
fi
agentboost train examples/gateway/train.yaml "${SMOKE_ARGS[@]}" "$@"
