"""Gateway rollouts in worker processes give what they give in this process."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from conftest import run

from agentboost.engines.scripted import ScriptedEngine
from agentboost.engines.servers.serve import start_server
from agentboost.rollout.results import read_results
from agentboost.rollout.run import run_rollouts_async
from agentboost.rollout.spec import RunSpec
from agentboost.tokens.trajectory import TerminationReason

HERE = Path(__file__).parent
AGENT = HERE.parents[1] / "examples" / "gateway" / "openai_agent.py"


CALCULATOR_CALL = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "6 * 7"}}\n</tool_call>'
ADD_CALL = '<tool_call>\n{"name": "add", "arguments": {"a": 40, "b": 2}}\n</tool_call>'
AGENTS = {
    # the example's OpenAI-SDK program, started by each worker: one tool call, then the answer
    "command": ({"command": [sys.executable, str(AGENT)]}, CALCULATOR_CALL, 1),
    # an async function that rewrites its history once: two training rows per rollout
    "forking-function": ({"agent": "gateway_support:forking_agent"}, ADD_CALL, 2),
}


def scripted_engine(tokenizer, say, call):
    """Calls a tool once, then answers."""

    def script(prompt, _index):
        if "<|im_start|>user\n<tool_response>" not in tokenizer.decode(prompt):
            return say(call)
        return say("The answer is 42.\nAnswer: 42")

    return ScriptedEngine(script)


def _content(result, trajectory):
    """What a rollout's row holds, less the names a run draws at random (session, tool-call ids)."""
    calls = {}
    for message in trajectory.messages:
        for call in message.get("tool_calls") or ():
            calls.setdefault(call["id"], f"call-{len(calls)}")
    messages = [
        {
            **message,
            **(
                {"tool_calls": [{**call, "id": calls[call["id"]]} for call in message["tool_calls"]]}
                if message.get("tool_calls")
                else {}
            ),
            **({"tool_call_id": calls[message["tool_call_id"]]} if "tool_call_id" in message else {}),
        }
        for message in trajectory.messages
    ]
    gateway = {key: value for key, value in trajectory.info["gateway"].items() if key != "session"}
    return (
        trajectory.token_ids,
        trajectory.loss_mask,
        trajectory.logprobs,
        [(s.role, s.start, s.end, s.turn, s.finish_reason) for s in trajectory.segments],
        messages,
        gateway,
        trajectory.termination,
        result.reward,
        trajectory.info.get("agent_output"),
    )


@pytest.mark.parametrize("agent", AGENTS)
def test_gateway_rollouts_in_worker_processes_give_the_in_process_results(
    qwen_tokenizer, say, tmp_path, monkeypatch, agent
):
    options, call, rows = AGENTS[agent]
    tokenizer_dir = tmp_path / "tokenizer"
    qwen_tokenizer.save_pretrained(tokenizer_dir)
    kwargs = {**options, "tasks_from": "arithmetic"}
    # workers import a function agent by the name the registry got (tests/gateway and tests/ on the path)
    paths = [str(HERE), str(HERE.parent), os.environ.get("PYTHONPATH", "")]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(paths))

    async def main():
        server = await start_server(scripted_engine(qwen_tokenizer, say, call), context_length=40960)
        try:
            for workers in (0, 2):
                spec = RunSpec(
                    "gateway",
                    model=str(tokenizer_dir),
                    engine="sglang",
                    urls=[server.url],
                    environment_kwargs=kwargs,
                    tasks=3,
                    samples=2,
                    concurrency=4,
                    workers=workers,
                )
                summary = await run_rollouts_async(spec, tmp_path / f"w{workers}.jsonl", progress=False)
                assert summary.completed == 6 and summary.failed == 0
        finally:
            await server.close()

    run(main())
    alone, pooled = (
        {(r.task_id, r.sample): r for r in read_results(tmp_path / f"w{workers}.jsonl")} for workers in (0, 2)
    )
    assert alone.keys() == pooled.keys() and len(alone) == 6
    for key, result in alone.items():
        assert result.termination is TerminationReason.COMPLETED and result.reward is not None
        assert result.trajectory.metrics["tool_calls"] == 1
        assert "Answer: 42" in result.trajectory.info["agent_output"]
        alone_rows, pooled_rows = result.trajectory.training_rows, pooled[key].trajectory.training_rows
        assert len(alone_rows) == len(pooled_rows) == rows
        for alone_row, pooled_row in zip(alone_rows, pooled_rows, strict=True):
            assert _content(pooled[key], pooled_row) == _content(result, alone_row)
