"""An agentboost environment packaged as an AEnvironment directory (``environment.json`` names it).

Served by ``python -m aenv.main examples/mcp/aenv_arithmetic`` from an AEnvironment virtual environment
that can import agentboost's environments (``pip install aenvironment==0.1.7 strands-agents==1.62.0
pyyaml jinja2`` there, and agentboost's source on ``PYTHONPATH``; see docs/mcp.md). It registers:

- every tool of the environment (``@register_tool``), each running in the current episode;
- ``start_task(task_id)`` (``@register_function``): end the current episode, begin one on that task;
- the reward (``@register_reward``): the environment's own reward on ``final_text``, then release.

One server process is one AEnvironment instance, so one episode at a time, as AEnvironment expects.
"""

import asyncio
import inspect
import json
from pathlib import Path

from aenv import register_function, register_reward, register_tool

from agentboost.envs.mcp.serve import EnvironmentServer
from agentboost.envs.registry import make_environment

_CONFIG = json.loads((Path(__file__).parent / "environment.json").read_text())
_STATE = EnvironmentServer(
    make_environment(_CONFIG["name"], _CONFIG.get("kwargs") or {}), split=_CONFIG.get("split", "train")
)
asyncio.run(_STATE.describe_tools())
_SESSION = "aenv"
_TYPES = {"string": str, "integer": int, "number": float, "boolean": bool, "array": list, "object": dict}


def _tool(spec: dict):
    """An async function with the tool's name, description and parameters, calling it in the episode."""
    name, schema = spec["name"], spec["inputSchema"].get("json", spec["inputSchema"])
    required = set(schema.get("required") or [])
    parameters, annotations = [], {"return": str}
    for parameter, details in (schema.get("properties") or {}).items():
        annotation = _TYPES.get(details.get("type"), str)
        default = inspect.Parameter.empty if parameter in required else None
        parameters.append(inspect.Parameter(parameter, inspect.Parameter.KEYWORD_ONLY, default=default))
        annotations[parameter] = annotation if parameter in required else annotation | None
    parameters.sort(key=lambda p: p.default is not inspect.Parameter.empty)

    async def call(**arguments):
        text, error = await _STATE.call(_SESSION, name, {k: v for k, v in arguments.items() if v is not None})
        if error:
            raise ValueError(text)  # the MCP server turns it into an error tool result with this text
        return text

    call.__name__, call.__doc__ = name, spec.get("description") or name
    call.__signature__ = inspect.Signature(parameters, return_annotation=str)
    call.__annotations__ = annotations
    return call


for _spec in _STATE.specs:
    register_tool(_tool(_spec))


@register_function
async def start_task(task_id: str = "") -> dict:
    """Begin a new episode on a task of the environment (by id; empty: the first task)."""
    session = await _STATE.start(_SESSION, task_id)
    return {"task_id": session.episode.task.id, "prompt": session.episode.task.text}


@register_reward
async def reward(final_text: str = "") -> dict:
    """The environment's reward on the agent's final answer; releases the episode."""
    return json.loads(await _STATE.score(_SESSION, final_text))
