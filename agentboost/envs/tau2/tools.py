"""tau2's domain tools as Strands tools, executing against one rollout's copy of the domain database.

Every call goes through tau2's own ``Environment.get_response``, so the model sees exactly what a
tau2 agent sees (JSON results, ``Error: ...`` texts for bad arguments, unknown ids or policy
violations the tools enforce) and the database changes exactly as in tau2. Each executed call and
its tau2 ``ToolMessage`` are logged in order: the reward replays that log, never re-parsed text.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from strands.tools.tools import PythonAgentTool
from strands.types.tools import ToolSpec

from agentboost.envs.tau2.package import tau2_module
from agentboost.errors import ConfigError

TRANSFER_TOOL = "transfer_to_human_agents"


def resolve_refs(schema: Mapping[str, Any]) -> dict[str, Any]:
    """A JSON schema with every local ``$ref`` (``#/$defs/X``, ``#/definitions/X``) inlined and the
    ``$defs`` table dropped, so templates that render schemas verbatim show the whole structure.

    Raises ConfigError for a reference that is not local, does not exist, or is recursive.
    """
    definitions = {**schema.get("definitions", {}), **schema.get("$defs", {})}

    def inline(node: Any, trail: tuple[str, ...]) -> Any:
        if isinstance(node, list):
            return [inline(item, trail) for item in node]
        if not isinstance(node, Mapping):
            return node
        if "$ref" in node:
            reference = node["$ref"]
            prefix = next((p for p in ("#/$defs/", "#/definitions/") if reference.startswith(p)), None)
            if prefix is None:
                raise ConfigError(f"tool schema reference {reference!r} is not a local #/$defs/ reference")
            name = reference[len(prefix) :]
            if name not in definitions:
                raise ConfigError(f"tool schema reference {reference!r} names no definition")
            if name in trail:
                raise ConfigError(f"tool schema definition {name!r} is recursive and cannot be inlined")
            siblings = {key: value for key, value in node.items() if key != "$ref"}
            return {**inline(definitions[name], (*trail, name)), **inline(siblings, trail)}
        return {
            key: inline(value, trail) for key, value in node.items() if key not in ("$defs", "definitions")
        }

    return inline(copy.deepcopy(dict(schema)), ())


@dataclass
class ToolLog:
    """The tau2 tool calls one rollout executed, in order, with tau2's own responses."""

    calls: list[Any] = field(default_factory=list)
    """tau2 ``ToolCall`` objects (ids are the Strands toolUseIds, which the trajectory also carries)."""
    responses: dict[str, Any] = field(default_factory=dict)
    """toolUseId -> tau2 ``ToolMessage``."""

    @property
    def calls_by_id(self) -> dict[str, Any]:
        return {call.id: call for call in self.calls}


def tau2_tools(
    environment: Any,
    log: ToolLog,
    *,
    on_call: Callable[[str, str, dict[str, Any], Any], None] | None = None,
) -> list[PythonAgentTool]:
    """Strands tools for every tool of a tau2 ``environment`` (one rollout's), recording into ``log``.

    ``on_call(name, tool_use_id, arguments, tool_message)`` runs after each call (e.g. to end the
    rollout on a transfer to a human).
    """
    message_types = tau2_module("tau2.data_model.message")
    tools = []
    for tau2_tool in environment.get_tools():
        function = tau2_tool.openai_schema["function"]
        spec: ToolSpec = {
            "name": function["name"],
            "description": function.get("description", ""),
            "inputSchema": {"json": resolve_refs(function.get("parameters", {"type": "object"}))},
        }

        async def run(tool_use: Mapping[str, Any], *_args: Any, _name: str = function["name"], **_state: Any):
            arguments = tool_use.get("input") or {}
            if not isinstance(arguments, dict):
                arguments = {"input": arguments}
            call = message_types.ToolCall(
                id=tool_use["toolUseId"], name=_name, arguments=arguments, requestor="assistant"
            )
            response = environment.get_response(call)  # tau2 turns every exception into an error message
            log.calls.append(call)
            log.responses[call.id] = response
            if on_call is not None:
                on_call(_name, call.id, arguments, response)
            return {
                "toolUseId": call.id,
                "status": "error" if response.error else "success",
                "content": [{"text": response.content if response.content is not None else ""}],
            }

        tools.append(PythonAgentTool(function["name"], spec, run))
    return tools
