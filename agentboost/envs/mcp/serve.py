"""``agentboost mcp serve --env NAME``: an agentboost environment's tools as an MCP server.

Other agents, gateways and AEnvironment-style platforms can then use the environment's tools. Each
client session is one episode of its own (``Environment.reset`` ... ``cleanup``), so two clients never
share a database copy or a sandbox. A session is named by, in order: the request's ``_meta``
``agentboost/episode`` (what agentboost's MCP client sends), the ``Agentboost-Episode`` header, the
``Mcp-Session-Id`` header (clients of the stateful HTTP protocol versions); over stdio the one client
of the process is one session. An HTTP request that names no session is refused with a sentence
saying how to name one, rather than silently sharing state.

Besides the environment's own tools, the server offers ``start_task`` (begin the session's episode on
a task of the chosen split, by id; without it, the first tool call begins one on the split's first
task) and ``end_task`` (score the episode on a final answer with the environment's reward, when that
reward reads only the conversation's text, and release it).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
from dataclasses import dataclass
from typing import Any

from agentboost.envs.base import Environment, Episode
from agentboost.envs.mcp.servers import EPISODE_HEADER, EPISODE_META_KEY
from agentboost.errors import ConfigError
from agentboost.tokens.trajectory import TerminationReason, Trajectory

logger = logging.getLogger(__name__)

_LIFECYCLE_TOOLS = {
    "start_task": {
        "description": (
            "Begin this session's episode on a task (ends the previous one). Returns the task's prompt."
        ),
        "inputSchema": {
            "type": "object",
            "properties": {
                "task_id": {"type": "string", "description": "A task id; empty for the first task."}
            },
        },
    },
    "end_task": {
        "description": (
            "Score this session's episode on a final answer and release it. Returns the reward as JSON."
        ),
        "inputSchema": {
            "type": "object",
            "properties": {"final_text": {"type": "string", "description": "The agent's final answer text."}},
        },
    },
}


@dataclass
class _Session:
    episode: Episode
    tools: dict[str, Any]


class EnvironmentServer:
    """Sessions of one environment: each an episode with its own tools (see the module docstring)."""

    def __init__(self, environment: Environment, split: str = "train", stdio: bool = False) -> None:
        self.environment = environment
        self.split = split
        self.stdio = stdio
        self.tasks = {task.id: task for task in environment.tasks(split=split)}
        if not self.tasks:
            raise ConfigError(f"environment {environment.name!r} has no {split!r} tasks to serve")
        self.sessions: dict[str, _Session] = {}
        self.specs: list[dict[str, Any]] = []

    async def describe_tools(self) -> None:
        """Learn the tool specs from one throw-away episode (the same tools every episode gets)."""
        episode = await self.environment.reset(next(iter(self.tasks.values())))
        try:
            self.specs = [tool.tool_spec for tool in self.environment.tools(episode)]
        finally:
            await self.environment.cleanup(episode)
        clash = {spec["name"] for spec in self.specs} & set(_LIFECYCLE_TOOLS)
        if clash:
            raise ConfigError(f"the environment's tools {sorted(clash)} clash with the server's own tools")

    def session_key(self, context: Any) -> str | None:
        meta = getattr(context, "meta", None) or {}
        if isinstance(meta, dict) and meta.get(EPISODE_META_KEY):
            return str(meta[EPISODE_META_KEY])
        headers = getattr(getattr(context, "request", None), "headers", None) or {}
        for header in (EPISODE_HEADER, "mcp-session-id"):
            if headers.get(header):
                return str(headers[header])
        return "stdio" if self.stdio else None

    async def start(self, key: str, task_id: str = "") -> _Session:
        await self.end(key)
        if task_id and task_id not in self.tasks:
            raise ConfigError(
                f"no task {task_id!r} in the {self.split!r} split; e.g. {next(iter(self.tasks))!r}"
            )
        task = self.tasks[task_id] if task_id else next(iter(self.tasks.values()))
        episode = await self.environment.reset(task)
        tools = {tool.tool_name: tool for tool in self.environment.tools(episode)}
        self.sessions[key] = session = _Session(episode, tools)
        return session

    async def end(self, key: str) -> None:
        session = self.sessions.pop(key, None)
        if session is not None:
            await asyncio.shield(self.environment.cleanup(session.episode))

    async def close(self) -> None:
        for key in list(self.sessions):
            await self.end(key)

    async def call(self, key: str, name: str, arguments: dict[str, Any]) -> tuple[str, bool]:
        """Run one tool for session ``key``: (text, is_error)."""
        if name == "start_task":
            session = await self.start(key, str(arguments.get("task_id") or ""))
            return session.episode.task.text, False
        if name == "end_task":
            return await self.score(key, str(arguments.get("final_text") or "")), False
        session = self.sessions.get(key) or await self.start(key)
        tool = session.tools.get(name)
        if tool is None:
            return f"unknown tool {name!r}; tools: {', '.join(sorted(session.tools))}", True
        tool_use = {"toolUseId": f"mcp-{key}-{name}", "name": name, "input": arguments}
        result: dict[str, Any] | None = None
        async for event in tool.stream(tool_use, {}):
            if isinstance(event, dict) and "tool_result" in event:
                result = event["tool_result"]
        if result is None:
            return f"the tool {name!r} returned no result", True
        texts = [block.get("text") or json.dumps(block.get("json")) for block in result.get("content") or []]
        return "\n".join(texts), result.get("status") == "error"

    async def score(self, key: str, final_text: str) -> str:
        session = self.sessions.get(key)
        if session is None:
            return json.dumps({"reward": None, "error": "no episode: call start_task or a tool first"})
        task = session.episode.task
        trajectory = Trajectory.empty(
            task.id,
            TerminationReason.COMPLETED,
            messages=[*task.messages, {"role": "assistant", "content": final_text}],
        )
        try:
            reward = await self.environment.score(trajectory, session.episode)
        finally:
            await self.end(key)
        if isinstance(reward, str):
            return json.dumps({"reward": None, "error": reward})
        return json.dumps({"reward": reward.value, "breakdown": reward.breakdown})


def build_server(state: EnvironmentServer) -> Any:
    """The mcp SDK's low-level server, serving ``state``'s sessions (raw tool schemas, no re-derivation)."""
    from mcp import types
    from mcp.server.lowlevel import Server

    async def list_tools(context: Any, params: Any) -> types.ListToolsResult:
        specs = [*state.specs, *({"name": name, **spec} for name, spec in _LIFECYCLE_TOOLS.items())]
        return types.ListToolsResult(
            tools=[
                types.Tool(
                    name=spec["name"],
                    description=spec.get("description") or "",
                    input_schema=spec["inputSchema"].get("json", spec["inputSchema"]),
                )
                for spec in specs
            ]
        )

    async def call_tool(context: Any, params: Any) -> types.CallToolResult:
        key = state.session_key(context)
        if key is None:
            text, error = (
                f"this server keeps one episode per session: name yours with the request _meta key "
                f"{EPISODE_META_KEY!r}, the {EPISODE_HEADER!r} header or an MCP session",
                True,
            )
        else:
            try:
                text, error = await state.call(key, params.name, dict(params.arguments or {}))
            except ConfigError as refused:
                text, error = str(refused), True
        return types.CallToolResult(content=[types.TextContent(type="text", text=text)], is_error=error)

    return Server(f"agentboost-{state.environment.name}", on_list_tools=list_tools, on_call_tool=call_tool)


async def serve(environment: Environment, *, split: str, http: str | None) -> None:
    """Serve until interrupted: stdio, or streamable HTTP at ``http`` (``HOST:PORT``, path ``/mcp``)."""
    state = EnvironmentServer(environment, split=split, stdio=http is None)
    await state.describe_tools()
    server = build_server(state)
    try:
        if http is None:
            from mcp.server.stdio import stdio_server

            async with stdio_server() as (read, write):
                await server.run(read, write, server.create_initialization_options())
        else:
            import uvicorn

            host, _, port = http.rpartition(":")
            app = server.streamable_http_app(host=host or "127.0.0.1")
            config = uvicorn.Config(app, host=host or "127.0.0.1", port=int(port), log_level="warning")
            await uvicorn.Server(config).serve()
    finally:
        with contextlib.suppress(Exception):
            await state.close()


def register_commands(commands: argparse._SubParsersAction) -> None:
    """Add ``agentboost mcp serve`` to the command's subparsers."""
    mcp = commands.add_parser("mcp", help="serve an environment's tools over MCP")
    actions = mcp.add_subparsers(dest="mcp_command", required=True)
    command = actions.add_parser(
        "serve", help="an environment's tools as an MCP server, one episode per session"
    )
    command.add_argument("--env", required=True, help="environment name or module:Class")
    command.add_argument("--env-kwargs", default=None, help="JSON object of environment keyword arguments")
    command.add_argument(
        "--split", default="train", help="the split whose tasks sessions run (default train)"
    )
    command.add_argument("--http", metavar="HOST:PORT", help="serve streamable HTTP at /mcp (default: stdio)")
    command.set_defaults(func=_cmd_serve)


def _cmd_serve(args: argparse.Namespace) -> int:
    from agentboost.envs.registry import make_environment, parse_json_object

    kwargs = parse_json_object(args.env_kwargs, "--env-kwargs") if args.env_kwargs else {}
    if args.http is not None:
        host, _, port = args.http.rpartition(":")
        if not port.isdigit() or not 0 < int(port) < 65536:
            raise ConfigError(f"--http must be HOST:PORT such as 127.0.0.1:8765, got {args.http!r}")
        from agentboost.cli_args import claim_port

        claim_port(host or "127.0.0.1", int(port), "--http port")
    environment = make_environment(args.env, kwargs)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(environment, split=args.split, http=args.http))
    return 0
