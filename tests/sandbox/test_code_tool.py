"""The Strands tool coding environments give their agents: a compact report of a sandboxed run."""

from __future__ import annotations

from sandbox_support import run

from agentboost.agent.episode import run_agent
from agentboost.agent.limits import RolloutLimits
from agentboost.engines.scripted import ScriptedEngine
from agentboost.sandbox import SandboxLimits, SandboxPool, make_code_tool
from agentboost.sandbox.tool import format_report


async def _invoke(code_tool, tool_input):
    """Invoke the tool the way a Strands agent does: stream a ToolUse and take the final event."""
    tool_use = {"toolUseId": "call-1", "name": code_tool.tool_name, "input": tool_input}
    return [event async for event in code_tool.stream(tool_use, {})][-1]


def test_the_tool_spec_tells_the_model_the_limits():
    code_tool = make_code_tool(SandboxLimits(timeout_s=5.0, memory_mb=256))
    spec = code_tool.tool_spec
    assert spec["name"] == "run_python"
    assert "5 s time limit" in spec["description"] and "256 MiB" in spec["description"]
    assert "without network access" in spec["description"]
    schema = spec["inputSchema"]["json"]
    assert schema["required"] == ["code"]
    assert set(schema["properties"]) == {"code", "stdin"}


def test_the_tool_returns_the_report_of_a_pooled_run():
    async def main():
        async with SandboxPool(size=1) as pool:
            code_tool = make_code_tool(pool, name="execute")
            ok = await _invoke(code_tool, {"code": "print(input() * 2)", "stdin": "ab"})
            failed = await _invoke(code_tool, {"code": "print('partial')\nraise KeyError('k')"})
            return code_tool, ok, failed

    code_tool, ok, failed = run(main())
    assert code_tool.tool_name == "execute"
    assert ok.tool_result["status"] == "success"
    [content] = ok.tool_result["content"]
    assert content["text"].startswith("status: ok, exit code 0, ")
    assert content["text"].endswith("stdout:\nabab")
    [content] = failed.tool_result["content"]
    lines = content["text"].splitlines()
    assert lines[0].startswith("status: runtime_error, exit code 1, ")
    assert lines[1] == "exit code 1: KeyError: 'k'"
    assert lines[2:4] == ["stdout:", "partial"]
    assert lines[4] == "stderr:" and lines[-1] == "KeyError: 'k'"


def test_the_tool_works_without_a_pool():
    code_tool = make_code_tool()
    event = run(_invoke(code_tool, {"code": "import time\ntime.sleep(0.1)"}))
    assert "status: ok" in event.tool_result["content"][0]["text"]
    short = make_code_tool(SandboxLimits(timeout_s=0.5))
    event = run(_invoke(short, {"code": "import time\ntime.sleep(5)"}))
    text = event.tool_result["content"][0]["text"]
    assert text.startswith("status: timeout, ")
    assert "wall-clock limit of 0.5 s reached" in text


def test_long_outputs_keep_their_beginning_and_end():
    async def main():
        async with SandboxPool(size=1) as pool:
            return await pool.run_python("for n in range(5000):\n    print(n)")

    result = run(main())
    report = format_report(result, max_chars=400)
    assert len(report) < 500
    assert "stdout:\n0\n1\n" in report and report.endswith("4998\n4999")
    assert "characters omitted" in report


def test_an_agent_calls_the_tool_and_reads_the_report(qwen_tokenizer, say):
    script = [
        '<tool_call>\n{"name": "run_python", "arguments": {"code": "print(sum(range(101)))"}}\n</tool_call>',
        "The sum is 5050.",
    ]

    async def main():
        async with SandboxPool(size=1) as pool:
            return await run_agent(
                ScriptedEngine([say(text) for text in script]),
                qwen_tokenizer,
                "Add the numbers from 1 to 100 with Python.",
                tools=[make_code_tool(pool)],
                template="qwen3",
                limits=RolloutLimits(max_turns=4),
            )

    trajectory = run(main())
    [tool_message] = [message for message in trajectory.messages if message["role"] == "tool"]
    assert tool_message["name"] == "run_python"
    assert tool_message["content"].startswith("status: ok, exit code 0, ")
    assert tool_message["content"].endswith("stdout:\n5050")
    assert trajectory.final_text == "The sum is 5050."
