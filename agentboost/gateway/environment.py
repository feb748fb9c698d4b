"""Gateway rollouts are ordinary rollouts: an agent that only knows a base URL and a key, as an Environment.

:class:`GatewayEnvironment` runs one gateway session per rollout. Its agent is either an async
function given an :class:`AgentContext`, or a command (any language, any framework) started with the
session in its environment variables:

=======================  ==========================================================
``OPENAI_BASE_URL``      ``http://127.0.0.1:<port>/s/<session>/v1``
``OPENAI_API_KEY``       the session name
``ANTHROPIC_BASE_URL``   ``http://127.0.0.1:<port>/s/<session>``
``ANTHROPIC_API_KEY``    the session name
``AGENTBOOST_TASK``      the task as JSON (:meth:`~agentboost.envs.task.Task.to_dict`)
``AGENTBOOST_SYSTEM``    the environment's system prompt ('' when it has none)
=======================  ==========================================================

Tasks, reward, reset and cleanup come from another environment (``tasks_from``), so an unmodified
agent trains on any existing task set. The rollout ends when the agent returns (``completed``),
when a limit ends the session (the agent is then stopped: its termination is the limit's), at
``timeout_s`` (``timeout``; ``engine_timeout`` when no model turn had come back), or when the agent
fails (``agent_error``, with its last output). An agent that fails after the model answered at least
once (e.g. on tool arguments the model wrote) is the policy's failure: the environment's failure rule
scores it (0.0 by default) instead of masking it.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import json
import os
import shlex
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agentboost.agent.episode import engine_timeout_detail
from agentboost.agent.limits import RolloutLimits
from agentboost.engines.base import Engine, RolloutKey, SamplingParams
from agentboost.envs.base import Environment, Episode, RolloutResult, _cleanup, _describe, _unscored
from agentboost.envs.registry import make_environment
from agentboost.envs.task import Task
from agentboost.errors import ConfigError
from agentboost.gateway.server import Gateway
from agentboost.gateway.session import DriftPolicy, GatewaySession, check_policy
from agentboost.outcomes import rollout_result
from agentboost.tokens.templates import ChatTemplate
from agentboost.tokens.tokenizer import tokenizer_of
from agentboost.tokens.trajectory import TerminationReason

_OUTPUT_TAIL = 2000


@dataclass(frozen=True)
class AgentContext:
    """What a gateway agent is given: its task and where its model lives."""

    task: Task
    base_url: str
    """OpenAI-style base URL of the session (``.../s/<session>/v1``)."""
    anthropic_base_url: str
    """Base URL for the Anthropic SDK (``.../s/<session>``)."""
    api_key: str
    """The session name; any client that sends it as its API key reaches the same session."""
    system_prompt: str | None = None


AgentFunction = Callable[[AgentContext], Awaitable[Any]]


class AgentCommandError(Exception):
    """The agent command exited with a non-zero status."""


class GatewayEnvironment(Environment):
    """Rollouts of an unmodified agent through the gateway, on another environment's tasks and reward."""

    name = "gateway"

    def __init__(
        self,
        agent: AgentFunction | str | None = None,
        *,
        command: Sequence[str] | str | None = None,
        tasks_from: Environment | str | None = None,
        tasks_kwargs: Mapping[str, Any] | None = None,
        policy: DriftPolicy | str = DriftPolicy.FORK,
        limits: RolloutLimits | Mapping[str, Any] | None = None,
    ) -> None:
        if (agent is None) == (command is None):
            raise ConfigError("give a gateway environment exactly one of agent= (a function) or command=")
        self.agent = _load_agent(agent) if isinstance(agent, str) else agent
        self.command = shlex.split(command) if isinstance(command, str) else list(command or ())
        if command is not None and not self.command:
            raise ConfigError("command= is empty; give the program to run and its arguments")
        self.inner = make_environment(tasks_from, tasks_kwargs) if isinstance(tasks_from, str) else tasks_from
        self.policy = check_policy(policy.value if isinstance(policy, DriftPolicy) else policy)
        if self.inner is not None:
            self.system_prompt = self.inner.system_prompt
            self.template, self.parser = self.inner.template, self.inner.parser
            self.limits = self.inner.limits
            self.failure_rule = self.inner.failure_rule  # a crashed agent scores the tasks' failure reward
        if limits is not None:
            self.limits = limits if isinstance(limits, RolloutLimits) else RolloutLimits(**limits)

    # --- the wrapped environment's tasks, lifecycle and reward ------------------------------------

    def tasks(self, n: int | None = None, *, seed: int = 0, split: str = "train") -> Sequence[Task]:
        if self.inner is None:
            raise ConfigError("this gateway environment has no tasks: pass tasks_from= (e.g. 'arithmetic')")
        return self.inner.tasks(n, seed=seed, split=split)

    async def reset(self, task: Task, *, sample: int = 0) -> Episode:
        return (
            await self.inner.reset(task, sample=sample) if self.inner is not None else Episode(task, sample)
        )

    def reward(self, trajectory: Any, episode: Episode) -> Any:
        if self.inner is not None and self.reward_fn is None:
            return self.inner.reward(trajectory, episode)
        return super().reward(trajectory, episode)

    async def cleanup(self, episode: Episode) -> None:
        if self.inner is not None:
            await self.inner.cleanup(episode)

    # --- one rollout ------------------------------------------------------------------------------

    async def run_episode(
        self,
        task: Task,
        engine: Engine,
        tokenizer: Any = None,
        *,
        sampling: SamplingParams | None = None,
        limits: RolloutLimits | None = None,
        template: ChatTemplate | str | None = None,
        sample: int = 0,
    ) -> RolloutResult:
        """Open a session, run the agent against it, score the session's trajectory. Never raises for
        a failed rollout; cancellation propagates after cleanup."""
        tokenizer = tokenizer if tokenizer is not None else tokenizer_of(engine)
        if tokenizer is None:
            raise ConfigError("no tokenizer: pass one, or use an engine that carries one")
        limits = limits or self.limits
        info: dict[str, Any] = {"environment": self.name, "sample": sample}
        if self.inner is not None:
            info["tasks_from"] = self.inner.name
        try:
            episode = await self.reset(task, sample=sample)
        except Exception as error:
            detail = f"{_describe(error)} (in {type(self).__name__}.reset)"
            return _unscored(task, sample, TerminationReason.ENV_ERROR, detail, info)
        gateway = Gateway(
            engine,
            tokenizer,
            template=template if template is not None else self.template,
            parser=self.parser,
            sampling=sampling,
            limits=limits,
            policy=self.policy,
            client_sampling=False,  # the trainer's sampling is the policy's: clients cannot change it
        )
        try:
            await gateway.start()
            session = gateway.open_session(rollout=RolloutKey(task.id, sample))
            context = AgentContext(
                task=episode.task,
                base_url=gateway.base_url(session.id),
                anthropic_base_url=gateway.anthropic_url(session.id),
                api_key=session.id,
                system_prompt=self.system_prompt,
            )
            reason, detail, output = await self._run(session, context, limits.timeout_s)
            if output:
                info["agent_output"] = output
            trajectory = session.trajectory(task.id, reason, detail, {**info, **episode.info})
            episode.messages = list(session.messages)
            if trajectory.termination.failed:  # masked, or scored by the failure rule if the policy's
                return rollout_result(trajectory, sample=sample, failure_rule=self.failure_rule)
            reward = await self.score(trajectory, episode)
            if isinstance(reward, str):
                return RolloutResult(task.id, sample, trajectory, None, reward_error=reward)
            return RolloutResult(task.id, sample, trajectory, reward.value, reward.breakdown, reward.info)
        finally:
            await gateway.aclose()
            await _cleanup(self, episode)

    async def _run(
        self, session: GatewaySession, context: AgentContext, timeout_s: float | None
    ) -> tuple[TerminationReason, str | None, str | None]:
        """Run the agent until it returns, the session ends or time runs out: (reason, detail, output)."""
        work = self.agent(context) if self.agent is not None else self._run_command(context)
        agent = asyncio.ensure_future(work)
        ended = asyncio.ensure_future(session.ended.wait())
        try:
            done, _ = await asyncio.wait(
                {agent, ended}, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            for task in (agent, ended):
                if not task.done():
                    task.cancel()
                    with contextlib.suppress(BaseException):
                        await task
        if session.termination is not None:
            return session.termination, session.termination_detail, _output(agent)
        if agent not in done:
            if session.turns == 0:  # not one generation came back: the engine's (or machine's) failure
                asked = "" if session.last_request is not None else " (the agent had sent no request yet)"
                return TerminationReason.ENGINE_TIMEOUT, engine_timeout_detail(timeout_s) + asked, None
            return TerminationReason.TIMEOUT, f"the rollout ran past {timeout_s} s", None
        error = agent.exception()
        if error is not None:
            return TerminationReason.AGENT_ERROR, f"the agent failed: {_describe(error)}", None
        if session.turns == 0:
            return (
                TerminationReason.AGENT_ERROR,
                "the agent returned without calling the model",
                _output(agent),
            )
        return TerminationReason.COMPLETED, None, _output(agent)

    async def _run_command(self, context: AgentContext) -> str:
        environment = {
            **os.environ,
            "OPENAI_BASE_URL": context.base_url,
            "OPENAI_API_KEY": context.api_key,
            "ANTHROPIC_BASE_URL": context.anthropic_base_url,
            "ANTHROPIC_API_KEY": context.api_key,
            "AGENTBOOST_TASK": json.dumps(context.task.to_dict(), ensure_ascii=False),
            "AGENTBOOST_SYSTEM": context.system_prompt or "",
        }
        try:
            process = await asyncio.create_subprocess_exec(
                *self.command,
                env=environment,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
        except OSError as error:
            raise AgentCommandError(f"cannot start the agent command {self.command[0]!r}: {error}") from error
        try:
            stdout, stderr = await process.communicate()
        except asyncio.CancelledError:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await process.wait()
            raise
        if process.returncode != 0:
            tail = stderr.decode(errors="replace")[-_OUTPUT_TAIL:].strip()
            raise AgentCommandError(f"the agent command exited with status {process.returncode}: {tail}")
        return stdout.decode(errors="replace")[-_OUTPUT_TAIL:]


def _output(agent: asyncio.Future[Any]) -> str | None:
    """What the agent returned (its last output), as text, when it returned normally."""
    if not agent.done() or agent.cancelled() or agent.exception() is not None:
        return None
    value = agent.result()
    return None if value is None else str(value)[-_OUTPUT_TAIL:]


def _load_agent(reference: str) -> AgentFunction:
    module_name, _, attribute = reference.partition(":")
    try:
        agent = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError, ValueError) as error:
        raise ConfigError(
            f"cannot import the agent {reference!r} (use 'package.module:function'): {error}"
        ) from error
    if not callable(agent):
        raise ConfigError(f"the agent {reference!r} is not callable")
    return agent
