"""An ordinary OpenAI-SDK agent with a calculator tool. It knows nothing about agentboost.

It reads its model endpoint the way every OpenAI client does (OPENAI_BASE_URL, OPENAI_API_KEY) and
its task from AGENTBOOST_TASK (JSON with a "prompt"), prints its final answer and exits. Under
`agentboost train examples/gateway/train.yaml` each rollout starts it once against its own gateway
session; run by hand, it works against any OpenAI-compatible server.
"""

from __future__ import annotations

import ast
import json
import operator
import os

from openai import OpenAI

OPERATORS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.USub: operator.neg,
}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": "Evaluate an arithmetic expression such as (37 + 5) * 12.",
            "parameters": {
                "type": "object",
                "properties": {"expression": {"type": "string", "description": "The expression."}},
                "required": ["expression"],
            },
        },
    }
]


MAX_DEPTH = 100
"""Deepest nesting of operations the calculator evaluates (a 1,500-deep ``- - - 1`` is refused)."""
MAX_DIGITS = 300
"""Most digits a value may have (a float holds at most about 308)."""
LIMIT = 10**MAX_DIGITS


def calculate(expression: str) -> str:
    """The expression's value, or an ``Error: ...`` text for the model to read. Never raises: the
    arguments are the model's, and an agent that crashes on them would end the rollout instead of
    letting the model see its mistake."""

    def value(node: ast.AST, depth: int) -> int | float:
        if depth > MAX_DEPTH:
            raise ValueError(f"the expression nests more than {MAX_DEPTH} operations")
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            return checked(node.value)
        if isinstance(node, ast.BinOp) and type(node.op) in OPERATORS:
            left, right = value(node.left, depth + 1), value(node.right, depth + 1)
            return checked(OPERATORS[type(node.op)](left, right))
        if isinstance(node, ast.UnaryOp) and type(node.op) in OPERATORS:
            return checked(OPERATORS[type(node.op)](value(node.operand, depth + 1)))
        raise ValueError("only numbers and + - * / are allowed")

    def checked(number: int | float) -> int | float:
        if not abs(number) < LIMIT:  # also refuses inf and nan
            raise ValueError(f"a value has more than {MAX_DIGITS} digits")
        return number

    try:
        result = value(ast.parse(expression, mode="eval").body, 0)
        return str(int(result) if float(result).is_integer() else result)
    except (SyntaxError, ValueError, ZeroDivisionError, OverflowError) as error:
        return f"Error: {error}"
    except (RecursionError, MemoryError):  # the parser itself gave up on a deeply nested expression
        return f"Error: the expression nests more than {MAX_DEPTH} operations"


def main() -> None:
    task = json.loads(os.environ["AGENTBOOST_TASK"])
    prompt = task["prompt"]
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
    system = os.environ.get("AGENTBOOST_SYSTEM")
    if system and messages[0]["role"] != "system":
        messages.insert(0, {"role": "system", "content": system})
    client = OpenAI(max_retries=0)
    for _ in range(int(os.environ.get("AGENT_MAX_TURNS", "8"))):
        reply = client.chat.completions.create(model="policy", messages=messages, tools=TOOLS)
        message = reply.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            print(message.content)
            return
        for call in message.tool_calls:
            try:
                expression = json.loads(call.function.arguments).get("expression", "")
            except (ValueError, AttributeError, TypeError, RecursionError):  # not a JSON object
                expression = ""
            messages.append({"role": "tool", "tool_call_id": call.id, "content": calculate(str(expression))})


if __name__ == "__main__":
    main()
