"""An OpenAI-SDK agent that rewrites its own history once (a gateway session then forks).

Started by the gateway environment as a command: it asks once, edits the assistant message it got
back, sends the tool result after it, and prints the second answer.
"""

from __future__ import annotations

import json
import os

from openai import OpenAI

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": "Evaluate an arithmetic expression.",
            "parameters": {
                "type": "object",
                "properties": {"expression": {"type": "string"}},
                "required": ["expression"],
            },
        },
    }
]


def main() -> None:
    task = json.loads(os.environ["AGENTBOOST_TASK"])
    messages = [
        {"role": "system", "content": os.environ["AGENTBOOST_SYSTEM"]},
        {"role": "user", "content": task["prompt"]},
    ]
    client = OpenAI(max_retries=0)
    first = client.chat.completions.create(model="policy", messages=messages, tools=TOOLS).choices[0].message
    call = first.tool_calls[0]
    messages.append({"role": "assistant", "content": "Let me calculate.", "tool_calls": [call.model_dump()]})
    messages.append({"role": "tool", "tool_call_id": call.id, "content": os.environ["AGENT_TOOL_RESULT"]})
    second = client.chat.completions.create(model="policy", messages=messages, tools=TOOLS)
    print(second.choices[0].message.content)


if __name__ == "__main__":
    main()
