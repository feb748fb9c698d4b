#!/usr/bin/env bash
# Roll out and train an agent on an MCP environment: a real MCP server (examples/mcp/store_server.py, a
# shop's inventory in SQLite, one database per episode) and tasks whose reward checks the final state.
# Then the same tasks through the AEnvironment adapter (examples/mcp/aenv_store/, served by
# `python -m aenv.main` from its own virtual environment, AGENTBOOST_AENV_PYTHON).
#
#   bash examples/mcp/train.sh
#   SMOKE=1 bash examples/mcp/train.sh   # the same at a smoke size (one small step), under runs/smoke/
#
# Offline; a few minutes on 2 CPU cores. Writes runs/mcp-store/ and runs/mcp-*.jsonl (docs/mcp.md).
set -euo pipefail
cd "$(dirname "$0")/../.."

STDIO='{"name": "store", "command": ["python", "examples/mcp/store_server.py"]}'
ENV_KWARGS='{"servers": ['"$STDIO"'], "tasks": {"train": "examples/mcp/tasks_train.jsonl", "test": "examples/mcp/tasks_test.jsonl"},
  "system_prompt": "You manage a shop inventory with the tools list_products, restock, set_price and place_order.",
  "reset_tool": "start_task", "reward": {"tool": "check_task"}, "release_tool": "end_task"}'
RUN=(--max-turns 4 --max-new-tokens 64 --temperature 0 --fresh)
N=4 RUNS=runs TRAIN_ARGS=()
if [[ "${SMOKE:-0}" == 1 ]]; then  # two short rollouts per transport and one training step, end to end
    N=2 RUNS=runs/smoke RUN=(--max-turns 2 --max-new-tokens 32 --temperature 0 --fresh)
    TRAIN_ARGS=(output_dir=runs/smoke/mcp-store steps=1 rollout.tasks_per_step=1 rollout.group_size=2
        rollout.max_turns=2 rollout.max_new_tokens=32 eval.tasks=1 eval.every=1 checkpoint.every=1)
fi

agentboost pull                                                    # the embedded default model
# 1. roll out over stdio: one server process per episode
agentboost rollout --env mcp --env-kwargs "$ENV_KWARGS" -n "$N" "${RUN[@]}" --out "$RUNS/mcp-stdio.jsonl"

# 2. the same server over streamable HTTP: one shared process, one database per episode id
PORT="${PORT:-$(python -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')}"
python examples/mcp/store_server.py --http "127.0.0.1:$PORT" >/dev/null 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null || true' EXIT
for _ in $(seq 50); do curl -s -o /dev/null "http://127.0.0.1:$PORT/mcp" && break; sleep 0.2; done
HTTP_KWARGS="${ENV_KWARGS/$STDIO/{\"name\": \"store\", \"url\": \"http://127.0.0.1:$PORT/mcp\"\}}"
agentboost rollout --env mcp --env-kwargs "$HTTP_KWARGS" -n "$N" "${RUN[@]}" --out "$RUNS/mcp-http.jsonl"

# 3. train (GRPO, 2 small steps) on the stdio environment
agentboost train examples/mcp/train.yaml "${TRAIN_ARGS[@]}"

# 4. the same tasks through the AEnvironment adapter (the aenv server runs in its own venv)
AENV_PYTHON="${AGENTBOOST_AENV_PYTHON:-}"
if [ -n "$AENV_PYTHON" ] && [ -x "$AENV_PYTHON" ]; then
    AENV_KWARGS='{"directory": "examples/mcp/aenv_store", "python": "'"$AENV_PYTHON"'",
      "tasks": "examples/mcp/tasks_test.jsonl", "reset_function": "start_task"}'
    agentboost rollout --env aenv --env-kwargs "$AENV_KWARGS" -n "$N" "${RUN[@]}" --out "$RUNS/mcp-aenv.jsonl"
else
    echo "skipping the AEnvironment run: set AGENTBOOST_AENV_PYTHON (python3 -m venv V && V/bin/pip install aenvironment==0.1.7;"
    echo "then AGENTBOOST_AENV_PYTHON=V/bin/python)"
fi
