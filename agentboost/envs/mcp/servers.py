"""One episode's connections to MCP servers, through Strands' :class:`~strands.tools.mcp.MCPClient`.

A :class:`ServerSpec` is plain data (so worker processes and veRL workers rebuild it from JSON): a stdio
command or a streamable HTTP URL. :class:`EpisodeConnection` is one episode's live connection to one
server; its tools are Strands tools that also

- record per-call facts like built-in tools do (``episode.annotate_tool``: server, outcome, latency,
  whether the text was truncated), shown as the tool message's ``metadata`` in the trajectory;
- turn a tool error or an MCP error (bad arguments, unknown tool, a timeout) into an error tool result
  the model reads, and a dead server (connection closed, process gone) into termination ``env_error``
  after the current turn's tools ran;
- bound the text a call returns (``max_result_chars``) and the time it may take (``timeout_s``).

Every call carries the episode's id in the request's ``_meta`` (key :data:`EPISODE_META_KEY`) and, over
HTTP, in the :data:`EPISODE_HEADER` header, so one shared server can keep state per episode.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
import os
import re
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, TextIO

from strands.tools.mcp import MCPClient
from strands.tools.mcp.mcp_agent_tool import MCPAgentTool
from strands.types._events import ToolResultEvent
from strands.types.exceptions import MCPClientInitializationError
from strands.types.tools import ToolResult, ToolResultStatus

from agentboost.errors import ConfigError, EnvironmentStepError
from agentboost.tokens.trajectory import TerminationReason

logger = logging.getLogger(__name__)

EPISODE_META_KEY = "agentboost/episode"
"""``_meta`` key of every tool call: the episode's id (a server keeps per-episode state under it)."""
EPISODE_HEADER = "Agentboost-Episode"
"""HTTP header with the episode's id (streamable HTTP servers only)."""
EPISODE_PLACEHOLDERS = ("{episode_dir}", "{episode_id}")
"""What a stdio server's ``cwd`` and ``env`` values may name: the episode's own fresh directory (made
before its servers start, removed after they stop) and its id."""

_CONNECTION_CLOSED = -32000  # JSON-RPC codes the mcp SDK uses (mcp_types.jsonrpc)
_REQUEST_TIMEOUT = -32001

_LIFECYCLE = concurrent.futures.ThreadPoolExecutor(max_workers=64, thread_name_prefix="agentboost-mcp")
"""MCPClient.start/stop block (they wait for the client's own thread): they run here, not in the event
loop's default pool, which Strands' sync tools share and which has only cores+4 threads."""


@dataclass(frozen=True)
class ServerSpec:
    """One MCP server: a stdio ``command`` (started per connection) or a streamable HTTP ``url``."""

    name: str
    command: tuple[str, ...] | None = None
    url: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    """Extra environment variables of a stdio server (added to the minimal default environment); values
    may name :data:`EPISODE_PLACEHOLDERS`."""
    cwd: str | None = None
    """A stdio server's working directory; may name :data:`EPISODE_PLACEHOLDERS`."""
    headers: Mapping[str, str] = field(default_factory=dict)
    timeout_s: float = 30.0
    """Longest a tool call may take; a slower call is answered with an error tool result."""
    startup_timeout_s: int = 30
    max_result_chars: int = 20_000
    """Longest tool text the model sees; longer text is cut and marked (``truncated`` in the metadata)."""

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ServerSpec:
        """Validate a JSON server entry such as ``{"name": "store", "command": ["python", "server.py"]}``."""
        if not isinstance(data, Mapping):
            raise ConfigError(f"an MCP server must be a JSON object, got {type(data).__name__}")
        known = {field_name for field_name in cls.__dataclass_fields__}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(
                f"MCP server {data.get('name')!r} has unknown keys {unknown}; known: {sorted(known)}"
            )
        name = data.get("name")
        if not isinstance(name, str) or not name.isidentifier():
            raise ConfigError(f"an MCP server needs a 'name' made of letters, digits and _, got {name!r}")
        command, url = data.get("command"), data.get("url")
        if (command is None) == (url is None):
            raise ConfigError(
                f"MCP server {name!r} needs exactly one of 'command' (a stdio server, e.g. "
                '["python", "server.py"]) or \'url\' (streamable HTTP, e.g. "http://127.0.0.1:8000/mcp")'
            )
        if command is not None:
            if isinstance(command, str) or not command or not all(isinstance(part, str) for part in command):
                raise ConfigError(f"MCP server {name!r}: 'command' must be a non-empty list of strings")
            command = tuple(command)
        if url is not None and (not isinstance(url, str) or not url.startswith(("http://", "https://"))):
            raise ConfigError(f"MCP server {name!r}: 'url' must start with http:// or https://, got {url!r}")
        env, cwd = data.get("env") or {}, data.get("cwd")
        if not isinstance(env, Mapping) or not all(
            isinstance(key, str) and isinstance(value, str) for key, value in env.items()
        ):
            raise ConfigError(f"MCP server {name!r}: 'env' must map names to strings, got {env!r}")
        if cwd is not None and not isinstance(cwd, str):
            raise ConfigError(f"MCP server {name!r}: 'cwd' must be a path string, got {cwd!r}")
        for text in (cwd or "", *env.values()):
            for placeholder in re.findall(r"\{episode_\w*\}", text):
                if placeholder not in EPISODE_PLACEHOLDERS:
                    raise ConfigError(
                        f"MCP server {name!r}: unknown placeholder {placeholder} in {text!r}; "
                        f"known: {', '.join(EPISODE_PLACEHOLDERS)}"
                    )
        for key in ("timeout_s", "startup_timeout_s", "max_result_chars"):
            value = data.get(key, getattr(cls, key))
            if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
                raise ConfigError(f"MCP server {name!r}: {key!r} must be a positive number, got {value!r}")
        return cls(
            name=name,
            command=command,
            url=url,
            env=dict(env),
            cwd=cwd,
            headers=dict(data.get("headers") or {}),
            timeout_s=float(data.get("timeout_s", cls.timeout_s)),
            startup_timeout_s=int(data.get("startup_timeout_s", cls.startup_timeout_s)),
            max_result_chars=int(data.get("max_result_chars", cls.max_result_chars)),
        )

    @property
    def uses_episode_dir(self) -> bool:
        """Whether this server's ``cwd`` or ``env`` names ``{episode_dir}`` (the episode needs one)."""
        return any("{episode_dir}" in text for text in (self.cwd or "", *self.env.values()))

    def client(self, episode_id: str, episode_dir: str | None = None) -> _RecordingClient:
        """A new (not yet started) Strands MCP client for one episode (``episode_dir`` fills the
        ``{episode_dir}`` placeholder; it must be given when the spec names it)."""
        if self.uses_episode_dir and episode_dir is None:
            raise ConfigError(f"MCP server {self.name!r} names {{episode_dir}}: give the episode a directory")
        values = {"{episode_id}": episode_id, "{episode_dir}": episode_dir or ""}

        def fill(text: str) -> str:
            for placeholder, value in values.items():
                text = text.replace(placeholder, value)
            return text

        meta = {EPISODE_META_KEY: episode_id}
        if self.url is not None:
            headers = {**self.headers, EPISODE_HEADER: episode_id}
            return _RecordingClient(
                url=self.url, headers=headers, startup_timeout=self.startup_timeout_s, meta=meta
            )
        from mcp import StdioServerParameters
        from mcp.client.stdio import stdio_client

        assert self.command is not None
        parameters = StdioServerParameters(
            command=self.command[0],
            args=list(self.command[1:]),
            env={**_inherited_environment(), **{key: fill(value) for key, value in self.env.items()}},
            cwd=fill(self.cwd) if self.cwd is not None else None,
        )
        return _RecordingClient(
            lambda: stdio_client(parameters, errlog=_server_errlog()),
            startup_timeout=self.startup_timeout_s,
            meta=meta,
        )


def _server_errlog() -> TextIO:
    """Where a stdio server's stderr goes: this process's stderr as it is now, if it is a real file.

    The mcp SDK's default is the ``sys.stderr`` of the moment ``mcp.client.stdio`` was imported; imported
    while pytest's ``capsys`` (or a notebook) had replaced it by a stream with no file descriptor, every
    server start failed with ``UnsupportedOperation: fileno``. Such a stream cannot take a child's output,
    so the process's original stderr does, or nothing.
    """
    for stream in (sys.stderr, sys.__stderr__):
        try:
            if stream is not None and stream.fileno() >= 0:
                return stream
        except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation is both
            continue
    global _DEVNULL
    if _DEVNULL is None:
        _DEVNULL = open(os.devnull, "w")  # noqa: SIM115 - kept open for every later server
    return _DEVNULL


_DEVNULL: TextIO | None = None


def _inherited_environment() -> dict[str, str]:
    """What a stdio server inherits: the mcp SDK's safe default set plus PATH-like Python settings."""
    from mcp.client.stdio import get_default_environment

    inherited = get_default_environment()
    for key in ("PYTHONPATH", "VIRTUAL_ENV", "AGENTBOOST_HOME"):
        if key in os.environ:
            inherited[key] = os.environ[key]
    return inherited


class _RecordingClient(MCPClient):
    """Strands' MCP client that keeps the exception behind each failed call, so it can be classified.

    ``call_tool_async`` turns every exception into an error result whose only trace is text; the typed
    exception is what tells a dead server from a bad argument.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.failures: dict[str, Exception] = {}

    def _handle_tool_execution_error(self, tool_use_id: str, exception: Exception) -> Any:
        self.failures[tool_use_id] = exception
        return super()._handle_tool_execution_error(tool_use_id, exception)

    def map_mcp_content_to_tool_result_content(self, content: Any) -> Any:
        """Strands' mapping, except that a part it would drop (a resource link, audio, a binary
        resource, a kind newer than this SDK) becomes a text naming it, so the model knows it was there."""
        mapped = super().map_mcp_content_to_tool_result_content(content)
        return mapped if mapped is not None else {"text": omitted_content_note(content)}


def omitted_content_note(content: Any) -> str:
    """The text that stands for an MCP content part the model cannot read (only text reaches it)."""
    kind = getattr(content, "type", None) or type(content).__name__
    if kind == "resource_link":
        title = getattr(content, "title", None) or getattr(content, "name", "")
        uri = getattr(content, "uri", "")
        return f"[resource_link {title!r} ({uri}) omitted: only text reaches the model]"
    if kind == "resource":
        resource = getattr(content, "resource", None)
        mime = getattr(resource, "mime_type", None) or "unknown type"
        return f"[resource {getattr(resource, 'uri', '')} ({mime}) omitted: only text reaches the model]"
    mime = getattr(content, "mime_type", None)
    return f"[{kind} content{f' ({mime})' if mime else ''} omitted: only text reaches the model]"


def _exception_chain(error: BaseException) -> Iterator[BaseException]:
    """``error``, its causes and contexts, and the members of every exception group among them (depth
    first: anyio and Strands wrap the real cause in groups and cancellations)."""
    pending, seen = [error], set()
    while pending:
        current = pending.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        following = current.__cause__ or current.__context__
        if following is not None:
            pending.append(following)
        members = getattr(current, "exceptions", None)  # an exception group (Python 3.11+, or its backport)
        if isinstance(members, tuple):
            pending.extend(reversed(members))


_CONNECTION_ERRORS = (
    "ClosedResourceError",
    "BrokenResourceError",
    "EndOfStream",
    "ConnectError",
    "ReadError",
)


def _is_connection_lost(error: BaseException) -> bool:
    """The server is gone (its process died, the connection closed or was refused): not the model's doing."""
    code = getattr(getattr(error, "error", None), "code", None)
    if code == _CONNECTION_CLOSED:
        return True
    if code is not None:
        return False
    for current in _exception_chain(error):
        if type(current).__name__ in _CONNECTION_ERRORS:
            return True
        if isinstance(current, RuntimeError) and "closed" in str(current).lower():
            return True
        if isinstance(current, MCPClientInitializationError):
            return True
    return False


def _is_timeout(error: BaseException) -> bool:
    return getattr(getattr(error, "error", None), "code", None) == _REQUEST_TIMEOUT


def result_text(content: Sequence[Mapping[str, Any]]) -> str:
    """A tool result's content as the one text the model reads (non-text parts are named, not dropped)."""
    parts = []
    for block in content:
        if "text" in block:
            parts.append(block["text"])
        elif "json" in block:
            parts.append(json.dumps(block["json"], ensure_ascii=False))
        else:
            kind = next(iter(block), "unknown")
            parts.append(f"[{kind} content omitted: only text reaches the model]")
    return "\n".join(parts)


def truncate(text: str, limit: int) -> tuple[str, bool]:
    """``text`` cut to ``limit`` characters with a note saying how much was left out."""
    if len(text) <= limit:
        return text, False
    return f"{text[:limit]}\n[... {len(text) - limit} more characters truncated]", True


class EpisodeTool(MCPAgentTool):
    """One MCP tool for one episode: bounded, classified and annotated calls (see the module docstring)."""

    def __init__(self, connection: EpisodeConnection, mcp_tool: Any) -> None:
        super().__init__(mcp_tool, connection.client, timeout=timedelta(seconds=connection.spec.timeout_s))
        self.connection = connection

    async def stream(self, tool_use: Any, invocation_state: dict[str, Any], **kwargs: Any) -> Any:
        result = await self.connection.call(self.mcp_tool.name, tool_use["input"], tool_use["toolUseId"])
        yield ToolResultEvent(result)


class EpisodeConnection:
    """One episode's live connection to one MCP server (opened by :meth:`open`, closed by :meth:`close`)."""

    def __init__(
        self, spec: ServerSpec, episode_id: str, episode: Any = None, episode_dir: str | None = None
    ) -> None:
        self.spec = spec
        self.episode_id = episode_id
        self.episode = episode
        self.client = spec.client(episode_id, episode_dir)
        self.mcp_tools: dict[str, Any] = {}
        self._started = False

    async def open(self) -> None:
        """Connect and list the tools; EnvironmentStepError naming the server when it cannot be reached."""
        loop = asyncio.get_running_loop()
        start = loop.run_in_executor(_LIFECYCLE, self.client.start)
        try:
            await asyncio.shield(start)
        except asyncio.CancelledError:
            # the start goes on in its thread: stop the client as soon as it is up, so nothing leaks
            start.add_done_callback(lambda done: done.exception() or _LIFECYCLE.submit(self._stop_quietly))
            raise
        except Exception as error:
            where = " ".join(self.spec.command) if self.spec.command else self.spec.url
            raise EnvironmentStepError(
                f"cannot connect to MCP server {self.spec.name!r} ({where}): {_root_message(error)}; "
                "check that it starts (run the command by hand) or that the URL answers"
            ) from error
        self._started = True
        try:
            listed = await loop.run_in_executor(_LIFECYCLE, self._list_all_tools)
        except Exception as error:
            raise EnvironmentStepError(
                f"MCP server {self.spec.name!r} did not list its tools: {_root_message(error)}"
            ) from error
        self.mcp_tools = {tool.name: tool for tool in listed}

    def _list_all_tools(self) -> list[Any]:
        tools: list[Any] = []
        token: str | None = None
        while True:
            page = self.client.list_tools_sync(pagination_token=token)
            tools.extend(agent_tool.mcp_tool for agent_tool in page)
            token = page.pagination_token
            if not token:
                return tools

    async def close(self) -> None:
        """Disconnect (a stdio server's process ends with it); never raises."""
        if self._started:
            self._started = False
            await asyncio.get_running_loop().run_in_executor(_LIFECYCLE, self._stop_quietly)

    def _stop_quietly(self) -> None:
        try:
            self.client.stop(None, None, None)
        except Exception as error:  # the server died earlier: that was reported when it happened
            logger.debug("MCP server %r closed with %s", self.spec.name, error)

    def tools(self, hidden: set[str]) -> list[EpisodeTool]:
        """The agent-visible tools: all listed except ``hidden`` (reward, reset and release tools)."""
        return [EpisodeTool(self, tool) for name, tool in self.mcp_tools.items() if name not in hidden]

    async def call(self, name: str, arguments: Mapping[str, Any] | None, tool_use_id: str) -> ToolResult:
        """Call one tool: a Strands tool result (text only, bounded), annotated on the episode."""
        started = time.perf_counter()
        try:
            raw = await self.client.call_tool_async(
                tool_use_id,
                name,
                dict(arguments or {}),
                read_timeout_seconds=timedelta(seconds=self.spec.timeout_s),
            )
            failure = self.client.failures.pop(tool_use_id, None)
        except Exception as error:  # the session is no longer running
            raw, failure = (
                {
                    "toolUseId": tool_use_id,
                    "status": "error",
                    "content": [{"text": f"Tool execution failed: {error}"}],
                },
                error,
            )
        if failure is None:
            outcome = "tool_error" if raw.get("status") == "error" else "ok"
            text = result_text(raw.get("content") or [])
        elif _is_timeout(failure):
            outcome = "timeout"
            text = f"the tool {name!r} did not answer within {self.spec.timeout_s:g} s"
        elif _is_connection_lost(failure):
            outcome = "server_lost"
            text = f"the MCP server {self.spec.name!r} is no longer reachable"
        else:
            outcome = "mcp_error"
            text = _root_message(failure)
        text, truncated = truncate(text, self.spec.max_result_chars)
        if self.episode is not None:
            self.episode.annotate_tool(
                tool_use_id,
                server=self.spec.name,
                mcp_outcome=outcome,
                latency_s=round(time.perf_counter() - started, 6),
                **({"truncated": True} if truncated else {}),
            )
            if outcome == "server_lost":
                assert failure is not None  # server_lost is a failure's outcome
                self.episode.stop_signal.set(
                    TerminationReason.ENV_ERROR,
                    f"MCP server {self.spec.name!r} was lost during tool {name!r}: {_root_message(failure)}",
                )
        status: ToolResultStatus = "success" if outcome == "ok" else "error"
        return {"toolUseId": tool_use_id, "status": status, "content": [{"text": text}]}

    async def call_hidden(self, name: str, arguments: Mapping[str, Any] | None = None) -> str:
        """Call a tool the agent does not see (reset, reward, release): its text, or EnvironmentStepError."""
        if name not in self.mcp_tools:
            raise EnvironmentStepError(
                f"MCP server {self.spec.name!r} has no tool {name!r}; it offers {sorted(self.mcp_tools)}"
            )
        tool_use_id = f"agentboost-{name}-{time.monotonic_ns()}"
        raw = await self.client.call_tool_async(
            tool_use_id,
            name,
            dict(arguments or {}),
            read_timeout_seconds=timedelta(seconds=self.spec.timeout_s),
        )
        failure = self.client.failures.pop(tool_use_id, None)
        text = result_text(raw.get("content") or [])
        if failure is not None or raw.get("status") == "error":
            raise EnvironmentStepError(f"MCP tool {self.spec.name}.{name} failed: {text}")
        return text


_NOISE = ("WouldBlock", "CancelledError")
"""Exceptions anyio raises while unwinding a failure: never the cause a person should read."""


def _root_message(error: BaseException) -> str:
    """The message of the exception that caused ``error`` (Strands and anyio wrap the real cause in
    groups and cancellations): a failed connection is named as one, else the innermost exception."""
    chain = [current for current in _exception_chain(error) if type(current).__name__ not in _NOISE]
    for current in chain:
        name = type(current).__name__
        if name in ("ConnectError", "ConnectTimeout") or isinstance(current, ConnectionError):
            return f"connection failed ({name}: {current})"
    innermost = chain[-1] if chain else error
    return f"{type(innermost).__name__}: {innermost}" if str(innermost) else type(innermost).__name__
