#!/usr/bin/env bash
# Train an unmodified OpenAI-SDK agent on the arithmetic tasks through the gateway.
# Extra arguments override the config, e.g. `bash examples/gateway/train.sh steps=10`.
set -euo pipefail
cd "$(dirname "$0")/../.."
python -c "import openai" 2>/dev/null || { echo "the agent needs the OpenAI SDK: pip install -e '.[gateway]'" >&2; exit 2; }
agentboost train examples/gateway/train.yaml "$@"
