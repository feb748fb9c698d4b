"""Environments: a system prompt, tools, a per-rollout lifecycle, limits and a reward.

An environment is configuration shared by every rollout (it is built once per process from its
registry name and keyword arguments); what belongs to ONE rollout lives in an :class:`Episode`. The
lifecycle of one rollout (an *episode*: one agent, one task, once), run by :meth:`Environment.run_episode`::

    episode = await env.reset(task, sample=...)     # per-rollout state: a DB copy, a sandbox lease...
    episode.engine, .tokenizer, .limits are set        # what this rollout runs on
    await env.start(episode)                          # e.g. a simulated user's opening words
    trajectory = await env.act(episode)               # the one step kinds of environment differ in;
        by default a Strands agent with env.tools(episode), env.hooks(episode), and each time it
        ends a turn without tool calls: await env.next_user_message(episode, messages)
    reward = await env.score(trajectory, episode)     # env.reward (or its RewardFunction), checked
    return rollout_result(trajectory, reward)         # the one way a rollout is recorded
    await env.cleanup(episode)                        # always: success, failure or cancellation

A minimal environment::

    class Capitals(Environment):
        name = "capitals"
        system_prompt = "Answer with the capital city only."
        def tasks(self, n=None, *, seed=0, split="train"):
            return [Task("fr", "What is the capital of France?", ground_truth="Paris")][:n]
        def reward(self, trajectory, episode):
            return float(trajectory.final_text.strip() == episode.task.ground_truth)

Compared with strands-env (the peer many users know): there an environment object is one episode
(``reset``/``step``/``cleanup`` on the instance) and ``step`` returns messages plus SGLang tokens; here
one environment serves thousands of concurrent rollouts, each with its own :class:`Episode`, and a
rollout returns agentboost's token-exact :class:`~agentboost.tokens.trajectory.Trajectory`. Both
offer tools and Strands hooks per episode, a typed task and a reusable reward-function object.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import math
import warnings
from collections.abc import Awaitable, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from agentboost.agent.episode import StopSignal, UserTurn, run_agent
from agentboost.agent.limits import RolloutLimits
from agentboost.engines.base import Engine, SamplingParams
from agentboost.envs.resources import ActorResources
from agentboost.envs.task import Task
from agentboost.errors import ConfigError, EnvironmentStepError, UnscorableError, describe_error
from agentboost.outcomes import (
    DEFAULT_FAILURE_RULE,
    REWARD_ERROR,
    FailureRule,
    Outcome,
    Reward,
    RewardFailure,
    RolloutResult,
    rollout_result,
)
from agentboost.tables import Table
from agentboost.tokens.messages import ChatMessage
from agentboost.tokens.templates import ChatTemplate
from agentboost.tokens.tokenizer import Tokenizer, tokenizer_of
from agentboost.tokens.trajectory import TerminationReason, Trajectory

if TYPE_CHECKING:
    from strands.types.content import Messages

logger = logging.getLogger(__name__)

__all__ = [
    "REWARD_ERROR",
    "ActorResources",
    "Environment",
    "Episode",
    "FailureRule",
    "Outcome",
    "Reward",
    "RewardFailure",
    "RewardFunction",
    "RolloutResult",
    "Task",
    "UserTurn",
]


class RewardFunction:
    """A reusable reward: subclass and implement ``__call__`` (sync or async), then set it as an
    environment's ``reward_fn``. It reads the token-exact trajectory and the episode (its task, the
    environment's per-rollout state, and ``episode.messages``: the Strands SDK's own messages)."""

    def __call__(
        self, trajectory: Trajectory, episode: Episode
    ) -> float | Reward | Awaitable[float | Reward]:
        raise NotImplementedError(f"{type(self).__name__} does not define __call__()")


class Episode:
    """One rollout of one task: the environment's per-rollout state, made by ``reset`` and closed by
    ``cleanup``. Subclass it, or keep objects in :attr:`state`.

    From :meth:`Environment.start` on it also carries what the rollout runs on: :attr:`engine`,
    :attr:`tokenizer`, :attr:`limits`, :attr:`sampling` and :attr:`template` (set by
    :meth:`Environment.run_episode` after ``reset``), so an environment can reach the rollout's own
    engine, e.g. for a simulated user that shares it, and :meth:`Environment.act` needs nothing else."""

    def __init__(self, task: Task, sample: int = 0) -> None:
        self.task = task
        self.sample = sample
        self.engine: Engine | None = None
        """The engine this rollout's agent generates with (None before ``start``)."""
        self.tokenizer: Tokenizer | None = None
        """The tokenizer of this rollout's agent (None before ``start``)."""
        self.limits: RolloutLimits | None = None
        """The limits this rollout runs under (None before ``start``)."""
        self.sampling: SamplingParams | None = None
        """How this rollout samples (None: the engine's defaults)."""
        self.template: ChatTemplate | str | None = None
        """The chat template this rollout's agent uses (None: picked from the tokenizer)."""
        self.state: dict[str, Any] = {}
        """The environment's per-rollout objects (a database copy, a sandbox lease, a simulator)."""
        self.info: dict[str, Any] = {}
        """Merged into ``trajectory.info`` (JSON-serialisable), e.g. a user simulator's own tokens; from
        ``start`` on it holds the rollout's ``environment`` and ``sample`` too."""
        self.messages: Messages = []
        """The Strands SDK's message list once the agent ran (for rewards that read it)."""
        self.tool_metadata: dict[str, dict[str, Any]] = {}
        """Facts a tool recorded about one call, by tool-use id; they appear as that call's tool
        message ``metadata`` in the trajectory."""
        self.stop_signal = StopSignal()

    def annotate_tool(self, call: Any, **metadata: Any) -> None:
        """Record facts about one tool call (e.g. ``status="passed"``) for statistics and viewers.

        ``call`` is the tool-use id or the Strands ``ToolContext`` (declare the tool with
        ``@tool(context=True)`` and pass ``tool_context``). Reports read these, never the tool's text.
        """
        tool_use = getattr(call, "tool_use", None)
        tool_use_id = tool_use["toolUseId"] if tool_use is not None else call
        if not isinstance(tool_use_id, str):
            raise ConfigError(f"annotate_tool needs a tool-use id or a ToolContext, got {call!r}")
        self.tool_metadata.setdefault(tool_use_id, {}).update(metadata)

    def stop(self, detail: str) -> None:
        """End the rollout once the current turn's tools have run (termination ``env_stopped``)."""
        self.stop_signal.set(TerminationReason.ENV_STOPPED, detail)


class Environment:
    """Subclass it: set ``name`` and ``system_prompt`` (and ``limits``); implement ``tasks`` and
    ``reward`` (or set ``reward_fn``); override the lifecycle methods an environment needs."""

    name: ClassVar[str] = "environment"
    system_prompt: str | None = None
    """A task whose starting conversation opens with a system message uses that one instead."""
    limits: RolloutLimits = RolloutLimits()
    template: str | None = None
    """Chat template name (``qwen3``, ``chatml``, ``tokenizer``); None picks one from the tokenizer."""
    parser: str = "hermes"
    """Tool-call format (see :mod:`agentboost.tokens.parsers`)."""
    reward_fn: RewardFunction | None = None
    """The reward used by the default :meth:`reward`."""
    failure_rule: FailureRule = DEFAULT_FAILURE_RULE
    """Which failed endings are the policy's and what they score (default: an ``agent_error`` after the
    policy generated scores 0.0; every other failure is infrastructure's and masked). See
    :class:`~agentboost.outcomes.FailureRule`."""
    resources: ActorResources = ActorResources()
    """What one rollout actor needs from a Ray node under ``--workers ray`` (default 1 CPU); see
    :class:`~agentboost.envs.resources.ActorResources`."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        legacy = cls.__dict__.get("rollout")
        if legacy is not None and "run_episode" not in cls.__dict__:  # written for the old name
            _warn_rollout_renamed(f"{cls.__qualname__} overrides Environment.rollout")
            cls.run_episode = legacy  # type: ignore[method-assign]

    async def rollout(self, *args: Any, **kwargs: Any) -> RolloutResult:
        """Deprecated name of :meth:`run_episode` (warns once); it runs :meth:`run_episode`."""
        _warn_rollout_renamed("Environment.rollout() was called")
        for klass in type(self).__mro__:  # the nearest run_episode that is not an old override's alias
            episode = vars(klass).get("run_episode")
            if episode is not None and (klass is Environment or "rollout" not in vars(klass)):
                return await episode(self, *args, **kwargs)
        raise AssertionError("unreachable: Environment defines run_episode")

    # --- tasks ----------------------------------------------------------------------------------

    def tasks(self, n: int | None = None, *, seed: int = 0, split: str = "train") -> Sequence[Task]:
        raise NotImplementedError(f"{type(self).__name__} does not define tasks()")

    # --- one rollout's lifecycle ------------------------------------------------------------------

    async def reset(self, task: Task, *, sample: int = 0) -> Episode:
        """Set up one rollout of ``task``. Override to create per-rollout state (return an Episode).

        The agent starts from ``episode.task.messages``: reset may replace ``episode.task`` with one
        whose starting conversation it wrote (e.g. a simulated customer's opening words)."""
        return Episode(task, sample)

    async def start(self, episode: Episode) -> None:
        """Called after ``reset``, once ``episode`` carries the rollout's engine, tokenizer and limits,
        before the agent runs. Override to do what needs them, e.g. let a simulated user that shares
        the agent's engine open the conversation (replace ``episode.task``)."""

    def tools(self, episode: Episode) -> list[Any]:
        """Strands tools for ONE rollout (fresh objects when a tool keeps state; may close over it)."""
        return []

    def hooks(self, episode: Episode) -> list[Any]:
        """Strands hook providers for ONE rollout (metrics, guards, custom stops)."""
        return []

    async def next_user_message(self, episode: Episode, messages: list[ChatMessage]) -> UserTurn | str | None:
        """Called when the agent ends a turn without calling a tool: the user's next message, or None
        to end the rollout (``completed``). ``messages`` is the conversation so far (trajectory form).
        A returned message is appended token-exactly, with loss mask 0."""
        return None

    def reward(self, trajectory: Trajectory, episode: Episode) -> float | Reward | Awaitable[float | Reward]:
        """A float, a :class:`Reward`, or an awaitable of either. Default: ``self.reward_fn``."""
        if self.reward_fn is None:
            raise NotImplementedError(f"{type(self).__name__} defines neither reward() nor reward_fn")
        return self.reward_fn(trajectory, episode)

    async def cleanup(self, episode: Episode) -> None:
        """Release what ``reset`` took. Always called once per rollout, whatever happened."""

    # --- reports ----------------------------------------------------------------------------------

    @classmethod
    def report_tables(
        cls,
        results: Sequence[RolloutResult],
        *,
        threshold: float,
        summary: dict[str, Any],
        test_tool: str | set[str] | None = None,
    ) -> list[Table]:
        """Tables about this environment's own rollouts, added to ``agentboost stats``, ``eval`` and
        ``view`` after the tables every environment gets (build them with
        :class:`~agentboost.tables.Table`; give them a ``section`` heading). ``summary`` is the
        report's summary, to which an environment may add its own entry; ``test_tool`` names the
        tool(s) that run tests (``--test-tool``, else the tools that record a status). Default: none.
        """
        return []

    # --- running ----------------------------------------------------------------------------------

    async def score(self, trajectory: Trajectory, episode: Episode) -> Reward | RewardFailure:
        """Run the reward: a :class:`Reward`, or why there is none (it raised or returned garbage).

        A reward that returns NaN or infinity, or raises anything but UnscorableError, is a bug in
        the environment: the rollout's outcome is ``failed`` (``reward_error``), counted in reports
        and training metrics. A reward must be total over model output (malformed answers score 0).
        """
        where = f"(in {type(self).__name__}.reward)"
        try:
            outcome = self.reward(trajectory, episode)
            if inspect.isawaitable(outcome):
                outcome = await outcome
            if isinstance(outcome, Reward):
                reward = Reward(
                    float(outcome.value),
                    {key: float(value) for key, value in outcome.breakdown.items()},
                    dict(outcome.info),
                )
            elif isinstance(outcome, bool) or not isinstance(outcome, int | float):
                raise TypeError(f"reward() returned {type(outcome).__name__}; return a float or a Reward")
            else:
                reward = Reward(float(outcome))
            if not math.isfinite(reward.value):
                raise ValueError(f"reward() returned {reward.value}; return a finite number")
            return reward
        except UnscorableError as error:
            return RewardFailure(f"{describe_error(error)} {where}", unscorable=True)
        except Exception as error:
            return RewardFailure(f"{describe_error(error)} {where}", unscorable=False)

    async def run_episode(
        self,
        task: Task,
        engine: Engine,
        tokenizer: Tokenizer | None = None,
        *,
        sampling: SamplingParams | None = None,
        limits: RolloutLimits | None = None,
        template: ChatTemplate | str | None = None,
        sample: int = 0,
    ) -> RolloutResult:
        """Run one task once and score it: reset, start, act, score, cleanup (the one episode template:
        override :meth:`act` to run another kind of agent, never this method).

        Never raises for a failed rollout, a failed environment step or a failed reward: each is
        recorded (termination ``env_error``, ``reward_error``, unscorable). A :class:`ConfigError` from
        :meth:`act` propagates (the run's settings are wrong: every rollout would fail alike), and so
        does cancellation, after cleanup.
        """
        tokenizer = tokenizer if tokenizer is not None else tokenizer_of(engine)
        if tokenizer is None:
            raise ConfigError(
                "no tokenizer: pass one, or use an engine that carries one (LocalEngine.from_pretrained)"
            )
        if not isinstance(task, Task):
            raise ConfigError(
                f"{type(self).__name__}.run_episode() takes a Task, got {type(task).__name__}; "
                "build tasks with agentboost.envs.task.Task (Task.from_dict for JSON rows)"
            )
        info = {"environment": self.name, "sample": sample}
        try:
            episode = await self.reset(task, sample=sample)
        except Exception as error:
            return self._env_error(
                task, sample, f"{describe_error(error)} (in {type(self).__name__}.reset)", info
            )
        episode.engine, episode.tokenizer, episode.limits = engine, tokenizer, limits or self.limits
        episode.sampling = sampling
        episode.template = template if template is not None else self.template
        episode.info = {**info, **episode.info}
        try:
            try:
                await self.start(episode)
            except Exception as error:
                detail = f"{describe_error(error)} (in {type(self).__name__}.start)"
                return self._env_error(task, sample, detail, episode.info)
            try:
                trajectory = await self.act(episode)
            except ConfigError:
                raise
            except EnvironmentStepError as error:  # the step is named in its message
                return self._env_error(task, sample, str(error), episode.info)
            except Exception as error:
                detail = f"{describe_error(error)} (in {type(self).__name__}.act)"
                return self._env_error(task, sample, detail, episode.info)
            if trajectory.task_id != task.id:
                detail = (
                    f"{type(self).__name__}.act returned a trajectory of task {trajectory.task_id!r} "
                    f"for task {task.id!r}"
                )
                return self._env_error(task, sample, detail, episode.info)
            trajectory.info.update(episode.info)
            if trajectory.termination.failed:  # masked, or scored by the failure rule if the policy's
                return rollout_result(trajectory, sample=sample, failure_rule=self.failure_rule)
            reward = await self.score(trajectory, episode)
            return rollout_result(trajectory, reward, sample=sample, failure_rule=self.failure_rule)
        finally:
            await _cleanup(self, episode)

    async def act(self, episode: Episode) -> Trajectory:
        """The one step environments differ in: run the agent on ``episode`` and return its trajectory.

        ``episode`` carries the task, the engine, tokenizer, limits, sampling and template. The default
        runs a Strands agent with this environment's system prompt, :meth:`tools`, :meth:`hooks` and
        :meth:`next_user_message` (the gateway environment runs an unmodified agent instead). An
        exception is recorded as termination ``env_error``; a :class:`ConfigError` propagates.
        """
        assert episode.engine is not None and episode.tokenizer is not None  # set by run_episode
        try:
            tools, hooks = self.tools(episode), self.hooks(episode)
        except Exception as error:
            raise EnvironmentStepError(
                f"{describe_error(error)} (in {type(self).__name__}.tools/hooks)"
            ) from error
        return await run_agent(
            episode.engine,
            episode.tokenizer,
            episode.task.messages,  # reset or start may have opened the conversation (a simulated user)
            system_prompt=self.system_prompt,
            tools=tools,
            hooks=hooks,
            template=episode.template,
            parser=self.parser,
            sampling=episode.sampling,
            limits=episode.limits,
            task_id=episode.task.id,
            sample=episode.sample,
            next_user_message=(
                None
                if type(self).next_user_message is Environment.next_user_message
                else lambda messages: self.next_user_message(episode, messages)
            ),
            stop=episode.stop_signal,
            tool_metadata=episode.tool_metadata,
            strands_messages=episode.messages,
        )

    @staticmethod
    def _env_error(task: Task, sample: int, detail: str, info: dict[str, Any]) -> RolloutResult:
        """The result of a rollout whose environment failed before the agent's trajectory was made."""
        trajectory = Trajectory.empty(task.id, TerminationReason.ENV_ERROR, detail, info=info)
        return rollout_result(trajectory, sample=sample)


_ROLLOUT_RENAMED_WARNED: set[str] = set()


def _warn_rollout_renamed(what: str) -> None:
    """One DeprecationWarning per cause: ``Environment.rollout`` is now ``run_episode``."""
    if what in _ROLLOUT_RENAMED_WARNED:
        return
    _ROLLOUT_RENAMED_WARNED.add(what)
    warnings.warn(
        f"{what}: Environment.rollout is now Environment.run_episode (the old name keeps working for "
        "now; rename the method or the call)",
        DeprecationWarning,
        stacklevel=3,
    )


async def _cleanup(environment: Environment, episode: Episode) -> None:
    """Run ``cleanup`` to the end even when the rollout is being cancelled; log (not raise) its errors."""
    try:
        await asyncio.shield(environment.cleanup(episode))
    except asyncio.CancelledError:
        raise
    except Exception as error:  # a failing cleanup must not turn a finished rollout into a crash
        logger.warning(
            "%s.cleanup failed for task %r: %s",
            type(environment).__name__,
            episode.task.id,
            describe_error(error),
        )
