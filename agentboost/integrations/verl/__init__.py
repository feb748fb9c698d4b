"""Train agentboost environments with veRL through its agent-loop extension point.

veRL loads ``agent_loop.yaml`` (shipped in this package) in every agent-loop worker; rows whose
``agent_name`` is :data:`AGENT_LOOP_NAME` run
:class:`~agentboost.integrations.verl.agent_loop.AgentBoostAgentLoop`.
Nothing here imports veRL: only ``agent_loop`` does, and only veRL's workers import it.
See ``docs/verl.md``.
"""

from __future__ import annotations

from importlib import resources

AGENT_LOOP_NAME = "agentboost"
"""The ``agent_name`` that dataset rows use to pick agentboost's loop."""

AGENT_LOOP_TARGET = "agentboost.integrations.verl.agent_loop.AgentBoostAgentLoop"

AGENT_LOOP_CONFIG_RELATIVE_PATH = "agentboost/integrations/verl/agent_loop.yaml"
"""The config's path relative to site-packages: veRL resolves relative paths there on every node."""


def agent_loop_config_path() -> str:
    """The shipped agent-loop config's absolute path: the value of
    ``actor_rollout_ref.rollout.agent.agent_loop_config_path``."""
    return str(resources.files(__name__).joinpath("agent_loop.yaml"))
