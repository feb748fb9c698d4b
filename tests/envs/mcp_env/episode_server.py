"""A stdio MCP server for the per-episode tests: where it runs, and a result with an audio part.

Kept apart from fault_server.py, whose tool list the token-exact tests' memorised conversation holds.
"""

from __future__ import annotations

import json
import os

from mcp.server.mcpserver import MCPServer
from mcp.types import AudioContent, TextContent

app = MCPServer("episode", log_level="CRITICAL")


@app.tool()
def where() -> str:
    """This server's working directory and its EPISODE variable, as JSON."""
    return json.dumps([os.getcwd(), os.environ.get("EPISODE")])


@app.tool()
def clip() -> list:
    """Return a text part and an audio part."""
    return [
        TextContent(type="text", text="here it is"),
        AudioContent(type="audio", data="AAAA", mime_type="audio/wav"),
    ]


@app.tool()
def reward() -> str:
    """A reward tool the agent does not see."""
    return "0.0"


if __name__ == "__main__":
    app.run()
