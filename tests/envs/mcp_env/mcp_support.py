"""Real MCP servers on loopback for the tests: start, wait until they answer, stop (and check they did)."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

HERE = Path(__file__).parent
FAULT_SERVER = HERE / "fault_server.py"
STORE_SERVER = HERE.parents[2] / "examples" / "mcp" / "store_server.py"
STORE_KWARGS = {
    "servers": [{"name": "store", "command": [sys.executable, str(STORE_SERVER)]}],
    "tasks": str(STORE_SERVER.parent / "tasks_train.jsonl"),
    "reset_tool": "start_task",
    "release_tool": "end_task",
    "reward": {"tool": "check_task"},
    "template": "qwen3",
}
"""The example's shop over stdio, as JSON environment kwargs."""


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]


def wait_until_up(url: str, process: subprocess.Popen, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the server exited with {process.returncode} before answering {url}")
        try:
            httpx.get(url, timeout=1.0)
            return
        except httpx.HTTPError:
            time.sleep(0.1)
    raise RuntimeError(f"nothing answered {url} within {timeout_s} s")


@contextlib.contextmanager
def http_server(script: Path) -> Iterator[tuple[str, subprocess.Popen]]:
    """Serve ``script`` over streamable HTTP on a free loopback port; yields (url, process)."""
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, str(script), "--http", f"127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_until_up(f"http://127.0.0.1:{port}/mcp", process)
        yield f"http://127.0.0.1:{port}/mcp", process
    finally:
        process.kill()
        process.wait(timeout=10)


def stdio(script: Path, name: str = "tools", **extra) -> dict:
    return {"name": name, "command": [sys.executable, str(script)], **extra}


def descendants() -> set[int]:
    """Process ids of this test process's live children (zombies excluded)."""
    import psutil

    alive = set()
    for child in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.NoSuchProcess):
            if child.status() != psutil.STATUS_ZOMBIE:
                alive.add(child.pid)
    return alive


async def counter_reward(trajectory, episode) -> float:
    """A Python reward that reads the server's state through a tool call of its own."""
    return float(await episode.call_tool("bump"))


def constant_reward(trajectory, episode) -> float:
    """A Python reward for servers that have no reward tool of their own."""
    return 0.0
