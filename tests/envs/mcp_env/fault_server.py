"""A real MCP server for the tests: arithmetic tools, per-process state, and tools that misbehave.

``python fault_server.py`` serves stdio; ``python fault_server.py --http HOST:PORT`` serves streamable
HTTP at /mcp. ``add`` and ``multiply`` carry the same docstrings as the built-in test tools.
"""

from __future__ import annotations

import asyncio
import os
import sys

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

app = MCPServer("faults", log_level="CRITICAL")
_state = {"counter": 0}


@app.tool()
def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first integer.
        b: The second integer.
    """
    return a + b


@app.tool()
def multiply(a: int, b: int) -> int:
    """Multiply two integers.

    Args:
        a: The first integer.
        b: The second integer.
    """
    return a * b


@app.tool()
def bump() -> str:
    """Add one to this process's counter and return it."""
    _state["counter"] += 1
    return str(_state["counter"])


@app.tool()
def pid() -> str:
    """This server's process id."""
    return str(os.getpid())


@app.tool()
def refuse() -> str:
    """Always fails with a tool error."""
    raise ToolError("the shelf is locked")


@app.tool()
def crash() -> str:
    """Kill this server's process."""
    os._exit(3)


@app.tool()
async def hang() -> str:
    """Never answers."""
    await asyncio.sleep(3600)
    return "late"


@app.tool()
def flood(size: int) -> str:
    """Return ``size`` characters."""
    return "x" * size


@app.tool()
def secret_reward() -> str:
    """A reward tool the agent must not see."""
    return '{"reward": 0.5, "breakdown": {"half": 0.5}}'


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--http":
        host, _, port = sys.argv[2].rpartition(":")
        app.run("streamable-http", host=host, port=int(port))
    else:
        app.run()
