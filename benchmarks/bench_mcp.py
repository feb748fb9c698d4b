"""MCP tool overhead and MCP-environment rollout throughput.

1. Per-call time of the same function (``add``) as a built-in Strands tool, an MCP tool over stdio, an
   MCP tool over streamable HTTP (both through agentboost's per-episode connection: Strands' MCP client
   plus classification and metadata), and an AEnvironment tool (``python -m aenv.main``, when
   AGENTBOOST_AENV_PYTHON names a Python with aenvironment).
2. Rollouts per second of an MCP environment (two tool calls per rollout) at 1, 16 and 128 concurrent
   episodes against the zero-latency scripted engine: HTTP (one shared server) at every level, stdio
   (one server process per episode) at 1 and 16 (128 processes of ~70 MB are left out on purpose).

    python benchmarks/bench_mcp.py [--calls 300]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "envs" / "mcp_env"))

from mcp_support import FAULT_SERVER, http_server  # noqa: E402

from agentboost.engines.scripted import ScriptedEngine  # noqa: E402
from agentboost.envs.mcp.servers import EpisodeConnection, ServerSpec  # noqa: E402
from agentboost.envs.registry import make_environment  # noqa: E402
from agentboost.envs.task import Task  # noqa: E402
from agentboost.models.tokenizers import load_qwen3_tokenizer  # noqa: E402

AENV_TOOL = '''
from aenv import register_tool


@register_tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b
'''


async def per_call_builtin(calls: int) -> float:
    from strands import tool

    @tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    async def once(index: int) -> None:
        async for _ in add.stream(
            {"toolUseId": f"c{index}", "name": "add", "input": {"a": 1, "b": index}}, {}
        ):
            pass

    await once(-1)
    started = time.perf_counter()
    for index in range(calls):
        await once(index)
    return (time.perf_counter() - started) / calls


async def per_call_mcp(spec: ServerSpec, calls: int) -> float:
    connection = EpisodeConnection(spec, "bench")
    await connection.open()
    try:
        await connection.call("add", {"a": 1, "b": 1}, "warm")
        started = time.perf_counter()
        for index in range(calls):
            result = await connection.call("add", {"a": 1, "b": index}, f"c{index}")
            assert result["content"][0]["text"] == str(1 + index), result
        return (time.perf_counter() - started) / calls
    finally:
        await connection.close()


async def per_call_aenv(python: str, calls: int) -> float:
    from agentboost.envs.mcp.aenv import AEnvServer

    with tempfile.TemporaryDirectory() as directory:
        Path(directory, "add_env.py").write_text(AENV_TOOL)
        server = await asyncio.to_thread(AEnvServer.start, python, Path(directory), "127.0.0.90", 8081, 180.0)
        try:
            return await per_call_mcp(ServerSpec(name="aenv", url=f"{server.base_url}/mcp"), calls)
        finally:
            server.stop()


async def throughput(server: dict, concurrency: int, rollouts: int, tokenizer) -> float:
    environment = make_environment(
        "mcp", {"servers": [server], "reward": {"python": "bench_mcp:zero"}, "template": "qwen3"}
    )
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")

    def say(text: str) -> list[int]:
        return [*tokenizer.encode(text, add_special_tokens=False), im_end]

    first = say('<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>')
    second = say('<tool_call>\n{"name": "multiply", "arguments": {"a": 3, "b": 2}}\n</tool_call>')
    answer = say("Answer: 6")

    def script(prompt_ids, index):
        calls = tokenizer.decode(prompt_ids).count("<tool_response>")
        return (first, second, answer)[min(calls, 2)]

    engine = ScriptedEngine(script)
    limit = asyncio.Semaphore(concurrency)

    async def one(index: int):
        async with limit:
            return await environment.run_episode(Task(f"t{index}", "What is (1 + 2) * 2?"), engine, tokenizer)

    started = time.perf_counter()
    results = await asyncio.gather(*(one(index) for index in range(rollouts)))
    elapsed = time.perf_counter() - started
    failed = [r.trajectory.termination_detail for r in results if r.failed]
    assert not failed, failed[:3]
    return rollouts / elapsed


def zero(trajectory, episode) -> float:
    return 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=300)
    args = parser.parse_args()
    sys.modules.setdefault("bench_mcp", sys.modules["__main__"])
    print(f"load average before: {os.getloadavg()}")
    stdio = {"name": "tools", "command": [sys.executable, str(FAULT_SERVER)]}
    with http_server(FAULT_SERVER) as (url, _):
        http = {"name": "tools", "url": url}
        rows = {
            "built-in Strands tool": asyncio.run(per_call_builtin(args.calls)),
            "MCP over stdio": asyncio.run(per_call_mcp(ServerSpec.from_dict(stdio), args.calls)),
            "MCP over HTTP": asyncio.run(per_call_mcp(ServerSpec.from_dict(http), args.calls)),
        }
        python = os.environ.get("AGENTBOOST_AENV_PYTHON")
        if python and Path(python).exists():
            rows["AEnvironment (aenv.main)"] = asyncio.run(per_call_aenv(python, args.calls))
        base = rows["built-in Strands tool"]
        print(f"\nper tool call ({args.calls} sequential calls of add(a, b)):")
        for name, seconds in rows.items():
            print(f"  {name:26s} {seconds * 1e6:10.0f} us   x{seconds / base:7.1f}")
        tokenizer = load_qwen3_tokenizer()
        print("\nrollouts/s (2 MCP tool calls per rollout, scripted engine, per-episode connections):")
        for concurrency, rollouts in ((1, 8), (16, 64), (128, 256)):
            figures = [f"HTTP {asyncio.run(throughput(http, concurrency, rollouts, tokenizer)):7.1f}"]
            if concurrency <= 16:
                figures.append(
                    f"stdio {asyncio.run(throughput(stdio, concurrency, rollouts, tokenizer)):7.1f}"
                )
            print(f"  concurrency {concurrency:4d}: " + "   ".join(figures))
    print(f"\nload average after: {os.getloadavg()}")
    subprocess.run(["uptime"], check=False)


if __name__ == "__main__":
    main()
