"""Environments from tools that live outside the agent: MCP servers and AEnvironment environments.

- :class:`~agentboost.envs.mcp.environment.MCPEnvironment` (registry name ``mcp``): tools from stdio
  and streamable HTTP MCP servers, per-episode connections.
- :class:`~agentboost.envs.mcp.aenv.AEnvEnvironment` (registry name ``aenv``): an AEnvironment
  environment directory served locally, or a remote AEnvironment instance.
- :mod:`agentboost.envs.mcp.serve`: any agentboost environment served as an MCP server.

Imported only when used, so ``import agentboost`` stays light.
"""
