"""A Markdown table of the tool calls in exported tau2 trajectories (chat form, `agentboost export`).

    python examples/tau2/tool_call_table.py examples/tau2/trajectories/*.chat.jsonl > table.md

One row per tool call: task, reward, the agent turn it came from, the tool, its arguments and whether
tau2 answered with an error; tasks without any call get one row saying so.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from agentboost.envs.tau2.simulator import AGENT_GREETING


def _cell(value: Any, limit: int = 80) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    text = text.replace("|", "\\|").replace("\n", " ")
    return text if len(text) <= limit else text[: limit - 3] + "..."


def table(paths: list[str]) -> str:
    lines = [
        "| file | task | reward | termination | agent turn | tool | arguments | result |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for path in paths:
        for line in Path(path).read_text(encoding="utf-8").splitlines():
            record = json.loads(line)
            results = {m.get("tool_call_id"): m for m in record["messages"] if m["role"] == "tool"}
            head = (
                f"| {Path(path).name} | {record['task_id']} | {record['reward']} | {record['termination']} "
            )
            turn, rows = 0, 0
            for message in record["messages"]:
                if (
                    message["role"] != "assistant"
                    or message.get("content") == AGENT_GREETING  # part of the prompt, not a turn
                ):
                    continue
                turn += 1
                for call in message.get("tool_calls") or []:
                    result = results.get(call.get("id"), {})
                    status = "error" if result.get("error") else ("ok" if result else "not run")
                    function = call["function"]
                    lines.append(
                        f"{head}| {turn} | {_cell(function['name'])} | {_cell(function.get('arguments'))} "
                        f"| {status}: {_cell(result.get('content', ''), 60)} |"
                    )
                    rows += 1
            if not rows:
                lines.append(f"{head}| - | (no tool call) | | |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    if len(sys.argv) < 2:
        raise SystemExit(__doc__)
    sys.stdout.write(table(sys.argv[1:]))
