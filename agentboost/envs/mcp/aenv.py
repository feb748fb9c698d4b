"""AEnvironment environments (PyPI ``aenvironment``, import ``aenv``) as agentboost environments.

An AEnvironment environment is a directory of Python files with ``@register_tool`` (served over MCP
streamable HTTP at ``/mcp``), ``@register_function`` (``POST /functions/<name>``), ``@register_reward``
(``POST /task/reward``) and ``@register_health`` (``GET /health``). agentboost talks to those
documented routes from its own environment: the ``aenvironment`` package pins ``mcp<2`` and an older
pydantic, which would break agentboost's install, so the server runs from its own virtual environment
(``python``, or ``AGENTBOOST_AENV_PYTHON``) as ``python -m aenv.main DIR --host 127.0.0.N --port 8081``
and nothing of ``aenv`` is imported here. The tools are reached through Strands' MCP client exactly as
in :class:`~agentboost.envs.mcp.environment.MCPEnvironment` (same bounds, metadata and failure rules).

Lifecycle, chosen for AEnvironment's model, where an instance is reset by a registered function and
its tool state is global to the server process:

- local (``directory``): a pool of server processes, one per concurrently running episode, each on
  its own loopback address (the aenv client addresses data routes on port 8081 whatever URL it is
  given, so parallel servers differ by address, not port). An episode leases a server, checks its
  health when the server is new, selects its task through ``reset_function`` (``task_id`` and
  ``metadata``), runs, is scored by ``/task/reward`` and gives the server back. A server is leased to
  one episode at a time, so two episodes never share state; one that failed is stopped, not reused.
  Starting a server takes seconds (Python imports of aenv and fastmcp), so the pool reuses them.
- remote (``url``): one running instance (e.g. one an AEnvironment scheduler created), leased to one
  episode at a time.

Servers are stopped when the process exits (and die with it: they get SIGTERM when their parent dies).
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import httpx

from agentboost.agent.limits import RolloutLimits
from agentboost.envs.base import Environment, Episode, Reward
from agentboost.envs.mcp.environment import MCPEpisode, parse_reward_value, split_tasks
from agentboost.envs.mcp.servers import _LIFECYCLE, EpisodeConnection, ServerSpec
from agentboost.envs.task import Task
from agentboost.errors import ConfigError, EnvironmentStepError
from agentboost.tokens.trajectory import TerminationReason, Trajectory

AENV_PYTHON_VARIABLE = "AGENTBOOST_AENV_PYTHON"
"""The Python of a virtual environment with ``aenvironment`` installed (it serves local directories)."""
_DATA_PORT = 8081  # the aenv client's fixed data-plane port


class AEnvServer:
    """One AEnvironment server: a local ``python -m aenv.main`` process, or a remote instance's URL."""

    def __init__(
        self, base_url: str, process: subprocess.Popen | None = None, log: Path | None = None
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.process = process
        self.log = log
        self.checked = False
        self.parameters: dict[str, set[str]] = {}
        """Declared parameter names of each registered function (from ``/functions/list``)."""
        self.reward_parameters: set[str] | None = None

    @property
    def alive(self) -> bool:
        return self.process is None or self.process.poll() is None

    @classmethod
    def start(cls, python: str, directory: Path, host: str, port: int, timeout_s: float) -> AEnvServer:
        """Start ``python -m aenv.main DIRECTORY`` on ``host:port`` and wait until its routes answer."""
        descriptor, name = tempfile.mkstemp(prefix=f"aenv-{host}-", suffix=".log")
        os.close(descriptor)
        log = Path(name)
        with log.open("wb") as output:
            process = subprocess.Popen(
                [
                    python,
                    "-m",
                    "aenv.main",
                    str(directory),
                    "--host",
                    host,
                    "--port",
                    str(port),
                    "--log-level",
                    "WARNING",
                    "--log-dir",
                    str(log.parent),
                ],
                stdout=output,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                preexec_fn=_die_with_parent if sys.platform == "linux" else None,
            )
        server = cls(f"http://{host}:{port}", process, log)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if process.poll() is not None:
                tail = log.read_text(errors="replace")[-800:]
                raise EnvironmentStepError(
                    f"the AEnvironment server for {directory} exited with {process.returncode} "
                    f"at start: {tail}"
                )
            try:
                if httpx.get(f"{server.base_url}/functions/list", timeout=1.0).status_code == 200:
                    return server
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        server.stop()
        raise EnvironmentStepError(
            f"the AEnvironment server for {directory} did not answer on {server.base_url} "
            f"within {timeout_s:g} s; its log: {log}"
        )

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=5)
        if self.log is not None:
            with contextlib.suppress(OSError):
                self.log.unlink()

    async def check(self, client: httpx.AsyncClient) -> None:
        """Health before first use: the health route answers, and the registered functions are known."""
        health = await client.get(f"{self.base_url}/health")
        body = health.json() if health.status_code == 200 else {}
        if not body.get("success"):
            raise EnvironmentStepError(
                f"AEnvironment health check at {self.base_url}/health failed: {health.text[:300]}"
            )
        listing = (await client.get(f"{self.base_url}/functions/list")).json().get("data") or {}
        for function in listing.get("functions") or []:
            self.parameters[function["name"]] = set(function.get("parameters") or {})
        for function in listing.get("reward") or []:
            self.reward_parameters = set(function.get("parameters") or {})
        # aenv's default health handler probes localhost:8081, which is another address than this
        # server's 127.0.0.N: its inner status is not used. Only a health function of the
        # environment's own must report healthy. The MCP route is checked when the tools are listed.
        own = [item for item in listing.get("health") or [] if item.get("name") != "default_health_handler"]
        status = (body.get("data") or {}).get("status")
        if own and status not in ("success", "healthy"):
            raise EnvironmentStepError(
                f"AEnvironment at {self.base_url} reports itself unhealthy: {body['data']}"
            )
        self.checked = True

    async def call(self, client: httpx.AsyncClient, route: str, arguments: Mapping[str, Any]) -> Any:
        """POST a function or reward route; its ``data``, or EnvironmentStepError with the server's error."""
        try:
            response = await client.post(f"{self.base_url}{route}", json=dict(arguments))
        except httpx.HTTPError as error:
            raise EnvironmentStepError(
                f"AEnvironment route {route} at {self.base_url} failed: {error!r}"
            ) from error
        try:
            body = response.json()
        except ValueError:
            body = {}
        if response.status_code != 200 or not body.get("success"):
            detail = body.get("error") or response.text[:300]
            raise EnvironmentStepError(
                f"AEnvironment route {route} answered {response.status_code}: {detail}"
            )
        return body.get("data")


def _die_with_parent() -> None:
    """In the child before exec: get SIGTERM when the parent dies (Linux), so no server outlives a crash."""
    import ctypes

    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class _Pool:
    """Servers leased to one episode at a time; local ones started on demand up to ``size``."""

    def __init__(self, make: Any, size: int) -> None:
        self._make = make
        self._size = size
        self._idle: list[AEnvServer] = []
        self._all: list[AEnvServer] = []
        self._starting = 0
        self._lock = threading.Lock()
        atexit.register(self.close)

    async def lease(self) -> AEnvServer:
        while True:
            with self._lock:
                while self._idle:
                    server = self._idle.pop()
                    if server.alive:
                        return server
                    self._forget(server)
                if len(self._all) + self._starting < self._size:
                    self._starting += 1
                    slot = len(self._all) + self._starting
                    break
            await asyncio.sleep(0.05)
        future = asyncio.get_running_loop().run_in_executor(_LIFECYCLE, self._make, slot)
        try:
            server = await asyncio.shield(future)
        except asyncio.CancelledError:
            future.add_done_callback(self._settle)  # the start goes on in its thread: pool what it makes
            raise
        except BaseException:
            with self._lock:
                self._starting -= 1
            raise
        with self._lock:
            self._starting -= 1
            self._all.append(server)
        return server

    def _settle(self, started: asyncio.Future) -> None:
        if started.exception() is None:
            self.give_back(started.result(), healthy=True)
        else:
            with self._lock:
                self._starting -= 1

    def give_back(self, server: AEnvServer, *, healthy: bool) -> None:
        with self._lock:
            if server not in self._all:
                self._all.append(server)
                self._starting -= 1
            if healthy and server.alive:
                self._idle.append(server)
                return
            self._forget(server)
        server.stop()

    def _forget(self, server: AEnvServer) -> None:
        if server in self._all:
            self._all.remove(server)

    def close(self) -> None:
        with self._lock:
            servers, self._all, self._idle = list(self._all), [], []
        for server in servers:
            server.stop()


class AEnvEnvironment(Environment):
    """An AEnvironment environment: a local directory served by agentboost, or a remote instance."""

    name = "aenv"

    def __init__(
        self,
        directory: str | None = None,
        url: str | None = None,
        tasks: str | Mapping[str, str] | None = None,
        python: str | None = None,
        system_prompt: str | None = None,
        reset_function: str | None = None,
        hidden_tools: list[str] | None = None,
        max_servers: int = 16,
        first_address: int = 2,
        port: int = _DATA_PORT,
        startup_timeout_s: float = 120.0,
        tool_timeout_s: float = 30.0,
        max_result_chars: int = 20_000,
        limits: Mapping[str, Any] | None = None,
        template: str | None = None,
        parser: str = "hermes",
    ) -> None:
        if (directory is None) == (url is None):
            raise ConfigError(
                "an AEnvironment environment needs exactly one of 'directory' (served locally) or 'url' "
                "(a running instance, e.g. http://10.0.0.5:8081)"
            )
        if not first_address >= 1 or first_address + max_servers > 255:
            raise ConfigError(f"loopback addresses 127.0.0.{first_address}.. must stay below 255")
        self.system_prompt = system_prompt
        self.task_files = tasks
        self.reset_function = reset_function
        self.hidden = set(hidden_tools or [])
        self.tool_timeout_s = float(tool_timeout_s)
        self.max_result_chars = int(max_result_chars)
        try:
            self.limits = RolloutLimits(**dict(limits or {}))
        except TypeError as error:
            raise ConfigError(f"bad 'limits' {dict(limits or {})}: {error}") from error
        self.template = template
        self.parser = parser
        self._tasks: dict[str, list[Task]] = {}
        if url is not None:
            if not url.startswith(("http://", "https://")):
                raise ConfigError(f"'url' must start with http:// or https://, got {url!r}")
            remote = AEnvServer(url)
            self._pool = _Pool(lambda slot: remote, 1)
            return
        folder = Path(directory)  # type: ignore[arg-type]
        if not folder.is_dir():
            raise ConfigError(f"AEnvironment directory {folder} does not exist")
        interpreter = python or os.environ.get(AENV_PYTHON_VARIABLE)
        if not interpreter or not Path(interpreter).exists():
            raise ConfigError(
                f"no Python with aenvironment to serve {folder}: pass 'python' or set {AENV_PYTHON_VARIABLE} "
                "(python3 -m venv V && V/bin/pip install aenvironment==0.1.7; then V/bin/python)"
            )

        def make(slot: int) -> AEnvServer:
            host = f"127.0.0.{first_address + slot - 1}"
            return AEnvServer.start(interpreter, folder.resolve(), host, port, startup_timeout_s)

        self._pool = _Pool(make, max_servers)

    def tasks(self, n: int | None = None, *, seed: int = 0, split: str = "train") -> list[Task]:
        return split_tasks(self.task_files, self._tasks, split)[:n]

    async def reset(self, task: Task, *, sample: int = 0) -> MCPEpisode:
        episode = MCPEpisode(task, sample)
        episode.info["mcp_episode"] = episode.id
        server = await self._pool.lease()
        episode.state["aenv_server"] = server
        episode.state["healthy"] = False
        episode.state["http"] = httpx.AsyncClient(timeout=self.tool_timeout_s)
        try:
            await self._begin(episode, server)
        except BaseException:  # a failed reset gets no cleanup call: release here
            await asyncio.shield(self.cleanup(episode))
            raise
        episode.state["healthy"] = True
        return episode

    async def _begin(self, episode: MCPEpisode, server: AEnvServer) -> None:
        """Health (a new server), task selection (the reset function), then the MCP connection."""
        client, task = episode.state["http"], episode.task
        if not server.checked:
            await server.check(client)
        if self.reset_function:
            declared = server.parameters.get(self.reset_function, {"task_id", "metadata"})
            offered = {"task_id": task.id, "metadata": task.metadata, "task": task.to_dict()}
            arguments = {key: value for key, value in offered.items() if key in declared}
            await server.call(client, f"/functions/{self.reset_function}", arguments)
        spec = ServerSpec(
            name="aenv",
            url=f"{server.base_url}/mcp",
            timeout_s=self.tool_timeout_s,
            max_result_chars=self.max_result_chars,
        )
        connection = EpisodeConnection(spec, episode.id, episode)
        episode.connections["aenv"] = connection
        await connection.open()

    def tools(self, episode: Episode) -> list[Any]:
        assert isinstance(episode, MCPEpisode)
        return episode.connections["aenv"].tools(self.hidden)

    async def reward(self, trajectory: Trajectory, episode: Episode) -> float | Reward:
        server: AEnvServer = episode.state["aenv_server"]
        arguments = {"task_id": episode.task.id, "final_text": trajectory.final_text}
        declared = server.reward_parameters if server.reward_parameters is not None else set(arguments)
        data = await server.call(
            episode.state["http"], "/task/reward", {k: v for k, v in arguments.items() if k in declared}
        )
        return parse_reward_value(json.dumps(data), f"{server.base_url}/task/reward")

    async def cleanup(self, episode: Episode) -> None:
        assert isinstance(episode, MCPEpisode)
        server: AEnvServer | None = episode.state.get("aenv_server")
        try:
            for connection in episode.connections.values():
                await connection.close()
            if "http" in episode.state:
                await episode.state["http"].aclose()
        finally:
            if server is not None:  # a server that failed its episode is stopped, never reused
                lost = episode.stop_signal.reason is TerminationReason.ENV_ERROR
                self._pool.give_back(server, healthy=bool(episode.state.get("healthy")) and not lost)

    def close(self) -> None:
        """Stop the local servers now (they are also stopped at exit)."""
        self._pool.close()
