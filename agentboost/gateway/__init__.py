"""A token-owning gateway: unmodified agents talk OpenAI or Anthropic, agentboost keeps exact tokens.

See docs/gateway.md. :class:`~agentboost.gateway.server.Gateway` serves sessions over HTTP;
:class:`~agentboost.gateway.environment.GatewayEnvironment` turns an agent that only knows a base URL
and an API key into ordinary agentboost rollouts.
"""
