"""MCPEnvironment against real MCP servers (stdio subprocesses and streamable HTTP on loopback)."""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time

import pytest
from mcp_support import FAULT_SERVER, STORE_SERVER, descendants, free_port, http_server, stdio

from agentboost.engines.scripted import ScriptedEngine
from agentboost.envs.mcp.environment import MCPEnvironment
from agentboost.envs.registry import make_environment
from agentboost.envs.task import Task
from agentboost.errors import ConfigError
from agentboost.tokens.trajectory import TerminationReason

pytestmark = [
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings(
        "ignore:coroutine .MCPClient.stop:RuntimeWarning"
    ),  # Strands, on a dead server
]

TASK = Task("t1", "What is (12 + 30) * 2?")


def call(name: str, **arguments) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


@pytest.fixture(scope="module")
def fault_http():
    with http_server(FAULT_SERVER) as (url, _):
        yield url


@pytest.fixture(params=["stdio", "http"])
def fault_server(request, fault_http):
    return stdio(FAULT_SERVER) if request.param == "stdio" else {"name": "tools", "url": fault_http}


def environment(server: dict, **kwargs) -> MCPEnvironment:
    kwargs.setdefault("reward", {"tool": "secret_reward"})
    return make_environment("mcp", {"servers": [server], "template": "qwen3", **kwargs})


def rollout(env, say, qwen_tokenizer, script, task=TASK):
    engine = ScriptedEngine([say(text) for text in script])
    return asyncio.run(env.run_episode(task, engine, qwen_tokenizer))


def tool_messages(result):
    return [message for message in result.trajectory.messages if message["role"] == "tool"]


def test_mcp_tools_reach_the_model_with_their_metadata_and_a_hidden_reward_tool(
    fault_server, say, qwen_tokenizer
):
    env = environment(fault_server)
    script = [call("add", a=12, b=30), call("multiply", a=42, b=2), "Answer: 84"]
    result = rollout(env, say, qwen_tokenizer, script)
    assert result.termination is TerminationReason.COMPLETED
    assert [message["content"] for message in tool_messages(result)] == ["42", "84"]
    for message in tool_messages(result):
        assert message["metadata"]["server"] == "tools" and message["metadata"]["mcp_outcome"] == "ok"
        assert message["metadata"]["latency_s"] >= 0
    assert result.reward == 0.5 and result.reward_breakdown == {"half": 0.5}
    prompt = qwen_tokenizer.decode(result.trajectory.token_ids[: result.trajectory.segments[0].end])
    assert '"name": "add"' in prompt and "secret_reward" not in prompt  # the reward tool stays hidden
    assert result.trajectory.info["mcp_episode"]


def test_a_tool_error_and_an_mcp_error_are_tool_results_the_model_reads(fault_server, say, qwen_tokenizer):
    env = environment(fault_server)
    script = [call("refuse"), call("add", a="twelve", b=30), "I could not."]
    result = rollout(env, say, qwen_tokenizer, script)
    assert result.termination is TerminationReason.COMPLETED and result.reward == 0.5
    refused, bad_arguments = tool_messages(result)
    assert refused["error"] and "the shelf is locked" in refused["content"]
    assert refused["metadata"]["mcp_outcome"] == "tool_error"
    assert bad_arguments["error"] and "a" in bad_arguments["content"]
    assert bad_arguments["metadata"]["mcp_outcome"] in ("tool_error", "mcp_error")


def test_a_hung_tool_is_answered_with_an_error_after_its_timeout(say, qwen_tokenizer, fault_http):
    for server in (stdio(FAULT_SERVER, timeout_s=1), {"name": "tools", "url": fault_http, "timeout_s": 1}):
        started = time.monotonic()
        result = rollout(
            environment(server), say, qwen_tokenizer, [call("hang"), call("add", a=1, b=2), "done"]
        )
        assert time.monotonic() - started < 30  # bounded by the 1 s timeout, not the tool's hour
        hung, added = tool_messages(result)
        assert hung["error"] and "did not answer within 1 s" in hung["content"]
        assert hung["metadata"]["mcp_outcome"] == "timeout"
        assert added["content"] == "3"  # the server still answers after the timed-out call
        assert result.termination is TerminationReason.COMPLETED


def test_huge_output_is_truncated_and_marked(fault_server, say, qwen_tokenizer):
    server = {**fault_server, "max_result_chars": 1000}
    result = rollout(environment(server), say, qwen_tokenizer, [call("flood", size=3_000_000), "ok"])
    (flood,) = tool_messages(result)
    assert flood["content"].startswith("x" * 1000) and len(flood["content"]) < 1100
    assert "2999000 more characters truncated" in flood["content"]
    assert flood["metadata"]["truncated"] is True
    assert result.trajectory.metrics["total_tokens"] < 2000


def test_a_server_that_dies_mid_episode_ends_the_rollout_env_error(say, qwen_tokenizer):
    env = environment(stdio(FAULT_SERVER))
    result = rollout(env, say, qwen_tokenizer, [call("add", a=1, b=2), call("crash"), "never generated"])
    assert result.termination is TerminationReason.ENV_ERROR
    assert "MCP server 'tools' was lost during tool 'crash'" in result.trajectory.termination_detail
    assert result.reward is None and result.failed
    assert tool_messages(result)[0]["content"] == "3"  # what happened before the crash is kept
    assert tool_messages(result)[1]["metadata"]["mcp_outcome"] == "server_lost"


def test_an_http_server_that_dies_mid_episode_ends_the_rollout_env_error(say, qwen_tokenizer):
    with http_server(FAULT_SERVER) as (url, _):
        result = rollout(
            environment({"name": "tools", "url": url}), say, qwen_tokenizer, [call("crash"), "x"]
        )
    assert result.termination is TerminationReason.ENV_ERROR
    assert "was lost during tool 'crash'" in result.trajectory.termination_detail


@pytest.mark.parametrize(
    "server, message",
    [
        (
            {"name": "tools", "url": f"http://127.0.0.1:{free_port()}/mcp", "startup_timeout_s": 5},
            "cannot connect",
        ),
        ({"name": "tools", "command": ["/nonexistent/mcp-server"]}, "cannot connect"),
    ],
)
def test_an_unreachable_server_is_env_error_before_the_agent_runs(server, message, say, qwen_tokenizer):
    result = rollout(environment(server), say, qwen_tokenizer, ["unused"])
    assert result.termination is TerminationReason.ENV_ERROR and result.trajectory.token_ids == []
    assert (
        message in result.trajectory.termination_detail and "'tools'" in result.trajectory.termination_detail
    )


@pytest.mark.parametrize("transport", ["stdio", "http"])
def test_concurrent_episodes_never_see_each_others_state(transport, say, qwen_tokenizer):
    """Eight episodes restock the same product by different amounts at once; each sees only its own."""
    amounts = range(1, 9)
    tasks = [
        Task(
            f"restock-{k}", f"Restock W-1 with {k} units.", metadata={"expected": {"stock": {"W-1": 10 + k}}}
        )
        for k in amounts
    ]

    def script(prompt_ids, index):
        text = qwen_tokenizer.decode(prompt_ids)
        if "<tool_response>" in text.rsplit("<|im_start|>user", 1)[-1]:
            return say("Restocked.")
        amount = int(re.findall(r"Restock W-1 with (\d+) units", text)[-1])
        return say(call("restock", sku="W-1", quantity=amount))

    async def run_all(server):
        env = make_environment(
            "mcp",
            {
                "servers": [server],
                "template": "qwen3",
                "reset_tool": "start_task",
                "release_tool": "end_task",
                "reward": {"tool": "check_task"},
            },
        )
        engine = ScriptedEngine(script)
        return await asyncio.gather(*(env.run_episode(task, engine, qwen_tokenizer) for task in tasks))

    if transport == "stdio":
        results = asyncio.run(run_all(stdio(STORE_SERVER, name="store")))
    else:
        with http_server(STORE_SERVER) as (url, _):
            results = asyncio.run(run_all({"name": "store", "url": url}))
    for k, result in zip(amounts, results, strict=True):
        assert result.termination is TerminationReason.COMPLETED, result.trajectory.termination_detail
        assert tool_messages(result)[0]["content"] == f"W-1 now has {10 + k} units in stock"
        assert result.reward == 1.0, result.reward_breakdown


def test_cancelled_rollouts_leave_no_server_process_or_client_thread(say, qwen_tokenizer):
    before_processes, before_threads = descendants(), threading.active_count()
    env = environment(stdio(FAULT_SERVER, timeout_s=600))
    engine = ScriptedEngine([say(call("hang"))], cycle=True)

    async def cancel_mid_episode():
        rollouts = [
            asyncio.ensure_future(env.run_episode(Task(f"h{i}", "hang"), engine, qwen_tokenizer))
            for i in range(4)
        ]
        deadline = time.monotonic() + 60
        while engine.calls < 4 and time.monotonic() < deadline:  # every episode is inside its hung tool
            await asyncio.sleep(0.1)
        await asyncio.sleep(0.5)
        assert len(descendants() - before_processes) == 4
        for task in rollouts:
            task.cancel()
        await asyncio.gather(*rollouts, return_exceptions=True)

    asyncio.run(cancel_mid_episode())
    deadline = time.monotonic() + 15
    while (descendants() - before_processes or threading.active_count() > before_threads + 64) and (
        time.monotonic() < deadline
    ):
        time.sleep(0.2)
    assert descendants() - before_processes == set()
    client_threads = [
        t for t in threading.enumerate() if t.daemon and not t.name.startswith("agentboost-mcp")
    ]
    assert len(client_threads) <= before_threads, [t.name for t in client_threads]


def test_a_python_reward_can_read_the_servers_state(say, qwen_tokenizer):
    env = environment(stdio(FAULT_SERVER), reward={"python": "mcp_support:counter_reward"})
    result = rollout(env, say, qwen_tokenizer, [call("bump"), call("bump"), "bumped twice"])
    assert result.reward == 3.0  # two agent calls, then the reward's own call returns 3


def test_tasks_come_from_jsonl_files_and_bad_configuration_is_refused(tmp_path):
    path = tmp_path / "tasks.jsonl"
    path.write_text('{"id": "a", "prompt": "one"}\n\n{"id": "b", "prompt": "two", "metadata": {"k": 1}}\n')
    env = environment(stdio(FAULT_SERVER), tasks=str(path))
    assert [task.id for task in env.tasks()] == ["a", "b"] and env.tasks(split="test")[1].metadata == {"k": 1}
    split_env = environment(stdio(FAULT_SERVER), tasks={"train": str(path)})
    with pytest.raises(ConfigError, match="no 'test' split"):
        split_env.tasks(split="test")
    path.write_text('{"id": "a", "prompt": "one"}\n{"id": "a", "prompt": "two"}\n')
    with pytest.raises(ConfigError, match="appears twice"):
        environment(stdio(FAULT_SERVER), tasks=str(path)).tasks()
    with pytest.raises(ConfigError, match="exactly one of 'command'"):
        environment({"name": "x"})
    with pytest.raises(ConfigError, match="needs a 'reward'"):
        make_environment("mcp", {"servers": [stdio(FAULT_SERVER)]})
    with pytest.raises(ConfigError, match="unknown keys"):
        environment({**stdio(FAULT_SERVER), "comand": ["x"]})


def test_a_failed_reset_tool_is_env_error_and_releases_the_server(say, qwen_tokenizer):
    before = descendants()
    result = rollout(environment(stdio(FAULT_SERVER), reset_tool="refuse"), say, qwen_tokenizer, ["unused"])
    assert result.termination is TerminationReason.ENV_ERROR
    assert "MCP tool tools.refuse failed" in result.trajectory.termination_detail
    deadline = time.monotonic() + 10
    while descendants() - before and time.monotonic() < deadline:
        time.sleep(0.1)
    assert descendants() - before == set()


def test_a_stdio_server_starts_when_this_process_stderr_is_not_a_file(say, qwen_tokenizer, monkeypatch):
    """Under pytest's capsys or in a notebook sys.stderr is a stream with no file descriptor; the mcp
    SDK's default errlog (bound when it was imported) then failed every server start with
    ``UnsupportedOperation: fileno`` (found by the veRL cluster test, after a capsys test)."""
    import io

    import mcp.client.stdio

    monkeypatch.setattr("sys.stderr", io.StringIO())
    # the SDK's default, as it is when mcp.client.stdio was first imported under such a stream
    monkeypatch.setattr(mcp.client.stdio.stdio_client.__wrapped__, "__defaults__", (io.StringIO(),))
    env = environment(stdio(FAULT_SERVER))
    result = rollout(env, say, qwen_tokenizer, [call("add", a=12, b=30), "Answer: 42"])
    assert result.termination is TerminationReason.COMPLETED, result.trajectory.termination_detail
    assert [message["content"] for message in tool_messages(result)] == ["42"]
