"""An environment whose tools come from MCP servers: stdio commands and streamable HTTP URLs.

Built from JSON keyword arguments only, so the runner, worker processes, the trainer and the veRL
plug-in rebuild it by name (``--env mcp --env-kwargs '{...}'``)::

    {"servers": [{"name": "store", "command": ["python", "store_server.py"]}],
     "tasks": "tasks.jsonl",                       # or {"train": "...", "test": "..."}
     "system_prompt": "You manage a shop's inventory.",
     "reset_tool": "start_task",                  # optional, hidden: called once per episode
     "reward": {"tool": "check_task"},            # or {"python": "pkg.mod:fn"} or {"url": "http://..."}
     "release_tool": "end_task",                  # optional, hidden: called at cleanup
     "hidden_tools": ["admin_dump"],              # more tools the agent must not see
     "limits": {"max_turns": 8, "max_new_tokens": 256}}

Connections are per episode, on purpose: each episode opens its own client to every server at
``reset`` and closes it at ``cleanup``. A stdio server is therefore one process per episode (its
memory and files ARE the episode's state, and they vanish with it); an HTTP server receives the
episode's id with every call (``_meta`` and a header, see :mod:`.servers`) and keeps state under it.
A pool of connections reset between episodes would save the start-up (a Python stdio server takes
seconds to start; see docs/benchmarks.md), but it trusts every server to reset completely, and one
episode's crash or leftover state would reach the next: isolation by construction is worth the start-up.

Hidden tools receive the arguments they declare among ``task_id``, ``task`` (the task as JSON),
``metadata`` (the task's metadata), ``episode_id`` and, for the reward tool, ``final_text``; a reward
(tool text or endpoint JSON) is a number or ``{"reward": x, "breakdown": {...}, "info": {...}}``.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import logging
import os
import shutil
import tempfile
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from agentboost.agent.limits import RolloutLimits
from agentboost.envs.base import Environment, Episode
from agentboost.envs.mcp.servers import EpisodeConnection, ServerSpec
from agentboost.envs.task import Task
from agentboost.errors import ConfigError, EnvironmentStepError, UnscorableError
from agentboost.outcomes import Outcome, Reward
from agentboost.tokens.trajectory import Trajectory

logger = logging.getLogger(__name__)

__all__ = ["MCPEnvironment", "MCPEpisode", "parse_reward", "read_task_file", "split_tasks"]


class MCPEpisode(Episode):
    """One episode: its id (sent to every server) and its open connections, by server name."""

    def __init__(self, task: Task, sample: int = 0) -> None:
        super().__init__(task, sample)
        self.id = uuid.uuid4().hex
        self.connections: dict[str, EpisodeConnection] = {}
        self.directory: str | None = None
        """This episode's own directory (``{episode_dir}`` in a server's ``cwd`` or ``env``): made
        before the servers start, removed after they stop; None when no server names it."""

    def server_of(self, tool: str, server: str | None = None) -> EpisodeConnection:
        """The connection that offers ``tool`` (on ``server`` when given)."""
        if server is not None:
            if server not in self.connections:
                raise ConfigError(f"no MCP server named {server!r}; servers: {sorted(self.connections)}")
            return self.connections[server]
        owners = [connection for connection in self.connections.values() if tool in connection.mcp_tools]
        if not owners:
            offered = sorted(
                name for connection in self.connections.values() for name in connection.mcp_tools
            )
            raise EnvironmentStepError(f"no MCP server offers the tool {tool!r}; offered: {offered}")
        return owners[0]

    async def call_tool(
        self, tool: str, arguments: Mapping[str, Any] | None = None, server: str | None = None
    ) -> str:
        """Call any tool of this episode's servers (hidden ones included), e.g. from a Python reward."""
        return await self.server_of(tool, server).call_hidden(tool, arguments)


class MCPEnvironment(Environment):
    """Tools from MCP servers, tasks from JSONL files, a reward from Python, a hidden tool or an endpoint."""

    name = "mcp"

    def __init__(
        self,
        servers: list[Mapping[str, Any]],
        tasks: str | Mapping[str, str] | None = None,
        system_prompt: str | None = None,
        reward: Mapping[str, Any] | None = None,
        reset_tool: str | None = None,
        release_tool: str | None = None,
        hidden_tools: list[str] | None = None,
        limits: Mapping[str, Any] | None = None,
        template: str | None = None,
        parser: str = "hermes",
    ) -> None:
        if isinstance(servers, Mapping) or not isinstance(servers, list) or not servers:
            raise ConfigError(
                "'servers' must be a non-empty list of MCP server objects (name + command or url)"
            )
        self.servers = [ServerSpec.from_dict(server) for server in servers]
        names = [server.name for server in self.servers]
        if len(set(names)) != len(names):
            raise ConfigError(f"MCP server names must be unique, got {names}")
        self.task_files = tasks
        self.system_prompt = system_prompt
        self.reward_spec = parse_reward(reward)
        self.reset_tool = reset_tool
        self.release_tool = release_tool
        self.hidden = {*(hidden_tools or []), *(name for name in (reset_tool, release_tool) if name)}
        if "tool" in self.reward_spec:
            self.hidden.add(self.reward_spec["tool"])
        try:
            self.limits = RolloutLimits(**dict(limits or {}))
        except TypeError as error:
            raise ConfigError(f"bad 'limits' {dict(limits or {})}: {error}") from error
        self.template = template
        self.parser = parser
        self._tasks: dict[str, list[Task]] = {}

    # --- tasks ----------------------------------------------------------------------------------

    def tasks(self, n: int | None = None, *, seed: int = 0, split: str = "train") -> list[Task]:
        """The tasks of ``split``: one file serves every split; a mapping names a file per split."""
        return split_tasks(self.task_files, self._tasks, split)[:n]

    # --- one episode ----------------------------------------------------------------------------

    async def reset(self, task: Task, *, sample: int = 0) -> MCPEpisode:
        episode = MCPEpisode(task, sample)
        episode.info["mcp_episode"] = episode.id
        await self.connect(episode)
        if self.reset_tool:
            try:  # a failed reset gets no cleanup call: close here
                connection = episode.server_of(self.reset_tool)
                arguments = self.arguments(connection, self.reset_tool, episode)
                await connection.call_hidden(self.reset_tool, arguments)
            except BaseException:
                await asyncio.shield(_close_all(episode))
                raise
        return episode

    async def connect(self, episode: MCPEpisode) -> None:
        """Open one connection per server (concurrently); on any failure close them all and raise."""
        if any(spec.uses_episode_dir for spec in self.servers):
            episode.directory = tempfile.mkdtemp(prefix=f"agentboost-mcp-{episode.id[:12]}-")
        for spec in self.servers:
            episode.connections[spec.name] = EpisodeConnection(spec, episode.id, episode, episode.directory)
        try:
            await asyncio.gather(*(connection.open() for connection in episode.connections.values()))
        except BaseException:
            await asyncio.shield(_close_all(episode))
            raise
        seen: dict[str, str] = {}
        for connection in episode.connections.values():
            for tool in connection.mcp_tools:
                if tool in seen and tool not in self.hidden:
                    await asyncio.shield(_close_all(episode))
                    raise EnvironmentStepError(
                        f"the tool {tool!r} is offered by both {seen[tool]!r} and {connection.spec.name!r}; "
                        "tool names must be unique across an environment's servers"
                    )
                seen[tool] = connection.spec.name

    def tools(self, episode: Episode) -> list[Any]:
        assert isinstance(episode, MCPEpisode), "MCPEnvironment.tools needs the episode its reset returned"
        return [tool for connection in episode.connections.values() for tool in connection.tools(self.hidden)]

    async def reward(self, trajectory: Trajectory, episode: Episode) -> float | Reward:
        assert isinstance(episode, MCPEpisode)
        spec = self.reward_spec
        if "python" in spec:
            outcome = spec["function"](trajectory, episode)
            return await outcome if asyncio.iscoroutine(outcome) else outcome
        if "tool" in spec:
            connection = episode.server_of(spec["tool"], spec.get("server"))
            arguments = self.arguments(connection, spec["tool"], episode, final_text=trajectory.final_text)
            return parse_reward_value(await connection.call_hidden(spec["tool"], arguments), spec["tool"])
        return await _endpoint_reward(spec["url"], spec.get("timeout_s", 30.0), trajectory, episode)

    async def cleanup(self, episode: Episode) -> None:
        assert isinstance(episode, MCPEpisode)
        try:
            if self.release_tool and episode.connections:
                connection = episode.server_of(self.release_tool)
                await connection.call_hidden(
                    self.release_tool, self.arguments(connection, self.release_tool, episode)
                )
        except Exception as error:
            logger.warning(
                "MCP release tool %r failed for task %r: %s", self.release_tool, episode.task.id, error
            )
        finally:
            await _close_all(episode)

    @staticmethod
    def arguments(
        connection: EpisodeConnection, tool: str, episode: MCPEpisode, **extra: Any
    ) -> dict[str, Any]:
        """The offered arguments a hidden tool declares in its input schema."""
        offered = {
            "task_id": episode.task.id,
            "task": episode.task.to_dict(),
            "metadata": episode.task.metadata,
            "episode_id": episode.id,
            **extra,
        }
        mcp_tool = connection.mcp_tools.get(tool)
        schema = getattr(mcp_tool, "input_schema", None) or getattr(mcp_tool, "inputSchema", None) or {}
        declared = schema.get("properties") or {}
        return {key: value for key, value in offered.items() if key in declared}


async def _close_all(episode: MCPEpisode) -> None:
    """Close every connection (stdio servers end), then remove the episode's directory."""
    await asyncio.gather(*(connection.close() for connection in episode.connections.values()))
    if episode.directory is not None:
        shutil.rmtree(episode.directory, ignore_errors=True)
        episode.directory = None


def parse_reward(spec: Mapping[str, Any] | None) -> dict[str, Any]:
    """Validate a reward choice: ``{"python": "module:function"}``, ``{"tool": name[, "server"]}``,
    or ``{"url": "http://.../reward"[, "timeout_s"]}``."""
    if spec is None:
        raise ConfigError(
            'an MCP environment needs a \'reward\': {"python": "module:function"}, {"tool": "hidden_tool"} '
            'or {"url": "http://host/reward"}'
        )
    if not isinstance(spec, Mapping):
        raise ConfigError(f"'reward' must be a JSON object, got {spec!r}")
    kinds = [kind for kind in ("python", "tool", "url") if kind in spec]
    if len(kinds) != 1:
        raise ConfigError(f"'reward' needs exactly one of python, tool or url, got {dict(spec)}")
    parsed = dict(spec)
    if "python" in spec:
        module_name, _, attribute = str(spec["python"]).partition(":")
        try:
            parsed["function"] = getattr(importlib.import_module(module_name), attribute)
        except (ImportError, AttributeError, ValueError) as error:
            raise ConfigError(f"cannot import the reward function {spec['python']!r}: {error}") from error
    if "url" in spec and not str(spec["url"]).startswith(("http://", "https://")):
        raise ConfigError(f"reward 'url' must start with http:// or https://, got {spec['url']!r}")
    return parsed


def parse_reward_value(text: str, source: str) -> float | Reward:
    """A reward from text: a number, or JSON ``{"reward": x, "breakdown": {...}, "info": {...}}``.

    ``{"reward": null, "outcome": "unscorable", "error": ...}`` (what ``agentboost mcp serve`` answers
    for an unscorable reward) raises :class:`UnscorableError`; any other null reward is a failed one."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as error:
        raise EnvironmentStepError(
            f"the reward from {source} is not a number or JSON: {text[:200]!r}"
        ) from error
    if isinstance(value, Mapping) and "reward" in value and value["reward"] is None:
        why = value.get("error") or "no reason given"  # the served side's reward failed
        if value.get("outcome") == Outcome.UNSCORABLE.value:
            raise UnscorableError(f"the reward from {source} is unscorable: {why}")
        raise EnvironmentStepError(f"the reward from {source} failed: {why}")
    if isinstance(value, Mapping) and "reward" in value:
        return Reward(
            float(value["reward"]), dict(value.get("breakdown") or {}), dict(value.get("info") or {})
        )
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    raise EnvironmentStepError(
        f'the reward from {source} must be a number or {{"reward": x}}, got {text[:200]!r}'
    )


async def _endpoint_reward(
    url: str, timeout_s: float, trajectory: Trajectory, episode: MCPEpisode
) -> float | Reward:
    import httpx

    body = {
        "episode_id": episode.id,
        "task": episode.task.to_dict(),
        "final_text": trajectory.final_text,
        "messages": trajectory.messages,
    }
    async with httpx.AsyncClient(timeout=timeout_s) as client:
        response = await client.post(url, json=body)
    if response.status_code != 200:
        raise EnvironmentStepError(
            f"reward endpoint {url} answered {response.status_code}: {response.text[:200]}"
        )
    return parse_reward_value(response.text, url)


def split_tasks(
    files: str | Mapping[str, str] | None,
    cache: dict[str, list[Task]],
    split: str,
    parse_row: Callable[[Any], Task] = Task.from_dict,
) -> list[Task]:
    """The tasks of ``split`` from ``files`` (one file for every split, or a file per split), read once;
    ``parse_row`` turns one JSON row into a Task (ConfigError for a bad row)."""
    if files is None:
        raise ConfigError("this environment has no tasks: pass 'tasks' (a JSONL file of task objects)")
    if split not in cache:
        if isinstance(files, Mapping):
            if split not in files:
                raise ConfigError(f"no {split!r} split in 'tasks'; it has {', '.join(files)}")
            cache[split] = read_task_file(files[split], parse_row)
        else:
            cache[split] = read_task_file(files, parse_row)
    return cache[split]


def read_task_file(
    path: str | os.PathLike[str], parse_row: Callable[[Any], Task] = Task.from_dict
) -> list[Task]:
    """Tasks from a JSONL file of task objects (``{"id", "prompt", "ground_truth"?, "metadata"?}``, or
    what ``parse_row`` reads)."""
    file = Path(path)
    if not file.is_file():
        raise ConfigError(f"task file {file} does not exist; write one JSON task object per line")
    tasks, ids = [], set()
    for number, line in enumerate(file.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            task = parse_row(json.loads(line))
        except (json.JSONDecodeError, ConfigError) as error:
            raise ConfigError(f"{file}:{number}: {error}") from error
        if task.id in ids:
            raise ConfigError(f"{file}:{number}: task id {task.id!r} appears twice")
        ids.add(task.id)
        tasks.append(task)
    if not tasks:
        raise ConfigError(f"task file {file} holds no tasks")
    return tasks
