"""The ``tau2`` environment: tau2-bench customer service (airline, retail) with a simulated customer.

One rollout = one tau2 task. The agent gets tau2's agent instruction and the domain policy as its
system prompt and the domain's real tools over a fresh copy of the domain database. In ``simulator``
mode a simulated customer (:mod:`agentboost.envs.tau2.simulator`) follows the task's hidden scenario
and talks to it; in ``ticket`` mode the scenario arrives as one written ticket and nobody answers.

How a conversation ends (termination reason, detail):

====================================  ============================  ======================================
what happened                         termination / detail          tau2 reward
====================================  ============================  ======================================
the customer says ###STOP###,         ``user_ended`` / the marker   evaluated
###TRANSFER### or ###OUT-OF-SCOPE###
the agent calls                       ``env_stopped`` /             evaluated
transfer_to_human_agents              ``transfer_to_human_agents``
ticket mode: the agent ends its turn  ``completed``                 evaluated
the customer spoke max_user_turns     ``user_ended`` /              0 (tau2 scores a conversation cut
times and the agent answered again    ``max_user_turns (N)``        short by a limit as 0)
a rollout limit (turns, tokens, time) that limit's reason           0 (same rule)
the simulator replied blank after     ``user_ended`` /              outcome ``unscorable`` (not the
its retries                           ``simulator_failed: ...``     agent's fault): rerun on resume
the simulator's engine failed         ``engine_error`` (the runner  none (retried)
                                      retries it)
the simulator failed to open the      ``env_error`` (from reset)    none
conversation
====================================  ============================  ======================================
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from agentboost.agent.limits import RolloutLimits
from agentboost.engines.base import Engine, SamplingParams, check_max_new_tokens
from agentboost.envs.base import Environment, Episode, Reward, Task, UserTurn
from agentboost.envs.tau2.baselines import baseline_rewards
from agentboost.envs.tau2.integrity import training_exclusion
from agentboost.envs.tau2.package import (
    SPLITS,
    Domain,
    agent_system_prompt,
    load_domain,
    pick,
    scenario_text,
)
from agentboost.envs.tau2.reward import call_arguments, score, to_tau2_messages
from agentboost.envs.tau2.simulator import AGENT_GREETING, SimulatorReply, UserSimulator
from agentboost.envs.tau2.tools import TRANSFER_TOOL, ToolLog, tau2_tools
from agentboost.errors import ConfigError, SimulatorEngineError, SimulatorFailed
from agentboost.tokens.messages import ChatMessage
from agentboost.tokens.tokenizer import Tokenizer, tokenizer_of
from agentboost.tokens.trajectory import TerminationReason, Trajectory

MODES = ("simulator", "ticket")
OPENING_PLACEHOLDER = "(the simulated customer's first message, written when the rollout starts)"
REWARDS = ("auto", "tau2", "strict", "toolrl")
"""``tau2``: tau2's own reward; ``strict``: tau2's reward, every gold action performed and no side
effect (:mod:`agentboost.envs.tau2.integrity`), on tasks the training split keeps (0 elsewhere);
``auto`` (the default): ``strict`` on tasks of the train split, ``tau2`` on every other split;
``toolrl``: the ToolRL-style score. See docs/tau2.md."""

TICKET_INSTRUCTION = (
    "This request arrived as a written support ticket. The customer cannot answer questions: act on "
    "what the ticket says, within the policy, and finish with a reply that tells the customer what "
    "you did and anything they asked to know."
)


def ticket_text(task: Any) -> str:
    """A task's scenario written as one customer ticket (tau2's own ticket when the task has one)."""
    if getattr(task, "ticket", None):
        return f"{TICKET_INSTRUCTION}\n\nTicket:\n{task.ticket}"
    instructions = task.user_scenario.instructions
    if isinstance(instructions, str):
        body = instructions
    else:
        parts = [("Request", instructions.reason_for_call), ("Customer details", instructions.known_info)]
        parts.append(("Customer's wishes and constraints", instructions.task_instructions))
        body = "\n\n".join(f"{title}:\n{text.strip()}" for title, text in parts if text and text.strip())
    return f"{TICKET_INSTRUCTION}\n\nTicket:\n{body}"


class Tau2Environment(Environment):
    """tau2-bench: ``domain`` airline | retail | mock, ``mode`` simulator | ticket, ``reward`` auto | tau2 |
    strict | toolrl (see :data:`REWARDS`). ``baselines`` (default on) records, beside every reward, what
    three scripted policies earn on the task under the same reward mode (do nothing; the gold's lookups
    then a transfer; the gold plus a read of another customer's profile): computed once per task per
    process, every mode at once (:func:`agentboost.envs.tau2.baselines.baseline_rewards`).

    The simulated customer runs on the agent's own engine unless ``simulator_engine`` names another:
    an :class:`~agentboost.engines.base.Engine` object, or ``"sglang"`` / ``"vllm"`` with
    ``simulator_url`` (and ``simulator_model`` for its tokenizer), or ``"local"`` with ``simulator_model``.
    """

    name = "tau2"
    limits = RolloutLimits(max_turns=40, max_new_tokens=512)

    def __init__(
        self,
        domain: str = "airline",
        mode: str = "simulator",
        reward: str = "auto",
        max_user_turns: int = 20,
        simulator_engine: str | Engine | None = None,
        simulator_url: str | list[str] | None = None,
        simulator_model: str | None = None,
        simulator_tokenizer: Tokenizer | None = None,
        simulator_template: str | None = None,
        simulator_temperature: float = 1.0,
        simulator_max_new_tokens: int = 256,
        simulator_retries: int = 2,
        baselines: bool = True,
    ) -> None:
        if mode not in MODES:
            raise ConfigError(f"tau2 mode must be one of {', '.join(MODES)}, got {mode!r}")
        if reward not in REWARDS:
            raise ConfigError(f"tau2 reward must be one of {', '.join(REWARDS)}, got {reward!r}")
        if max_user_turns < 1:
            raise ConfigError(f"max_user_turns must be >= 1, got {max_user_turns}")
        self.domain: Domain = load_domain(domain)
        self.mode = mode
        self.reward_kind = reward
        self.max_user_turns = max_user_turns
        self.system_prompt = agent_system_prompt(self.domain)
        self._simulator_spec = (simulator_engine, simulator_url, simulator_model, simulator_tokenizer)
        self._simulator_template = simulator_template
        self._simulator_sampling = SamplingParams(temperature=simulator_temperature)
        self._simulator_max_new_tokens = check_max_new_tokens(simulator_max_new_tokens)
        self._simulator_retries = simulator_retries
        self._simulator: UserSimulator | None = None
        self.baselines = baselines

    # --- tasks ------------------------------------------------------------------------------------

    def tasks(self, n: int | None = None, *, seed: int = 0, split: str = "train") -> list[Task]:
        if split not in SPLITS:
            raise ConfigError(f"tau2 split must be one of {', '.join(SPLITS)}, got {split!r}")
        ids = self.domain.task_ids(split)
        if self.reward_for(split) == "strict":  # tasks the training reward cannot judge teach nothing
            excluded = self.training_exclusions(split)
            ids = [task_id for task_id in ids if task_id not in excluded]
        return [self.task(task_id, split=split) for task_id in pick(ids, n, seed)]

    def training_exclusions(self, split: str = "train") -> dict[str, str]:
        """The tasks of ``split`` the training reward leaves out, tau2 id -> reason key (the reasons:
        :data:`agentboost.envs.tau2.integrity.EXCLUSIONS`); computed from the task data."""
        return {
            task_id: reason
            for task_id in self.domain.task_ids(split)
            if (reason := training_exclusion(self.domain, self.domain.task(task_id))) is not None
        }

    def reward_for(self, split: str | None) -> str:
        """The reward mode of a task drawn from ``split`` (``auto``: strict for train, else tau2)."""
        if self.reward_kind != "auto":
            return self.reward_kind
        return "strict" if split == "train" else "tau2"

    def task(self, tau2_id: str, *, split: str | None = None) -> Task:
        """The agentboost task for one tau2 task id (ids are stable: the same id is the same task)."""
        tau2_task = self.domain.task(tau2_id)
        criteria = tau2_task.evaluation_criteria
        gold = [
            {"name": action.name, "arguments": action.arguments}
            for action in (criteria.actions or [] if criteria else [])
            if action.requestor == "assistant"
        ]
        prompt: str | list[dict[str, Any]]
        if self.mode == "ticket":
            prompt = ticket_text(tau2_task)
        else:  # reset() replaces the placeholder with the simulated customer's own opening words
            prompt = [
                {"role": "assistant", "content": AGENT_GREETING},
                {"role": "user", "content": OPENING_PLACEHOLDER},
            ]
        return Task(
            id=f"{self.domain.name}-{tau2_id}",
            prompt=prompt,
            ground_truth=gold,
            metadata={"domain": self.domain.name, "tau2_id": tau2_id, "mode": self.mode, "split": split},
        )

    def _tau2_task(self, task: Task) -> Any:
        return self.domain.task(str(task.metadata.get("tau2_id", task.id)))

    # --- the simulated customer -------------------------------------------------------------------

    def simulator(self, episode: Episode) -> UserSimulator:
        """The simulator of ``episode``'s rollout: on its own engine (built once per environment and
        shared by every rollout) or, by default, on the engine the episode's agent runs on."""
        engine, url, model, tokenizer = self._simulator_spec
        if engine is None:
            if episode.engine is None:
                raise ConfigError(
                    "the tau2 simulator shares the agent's engine, which an episode carries only inside "
                    "run_episode() (from start on); pass simulator_engine to use it elsewhere"
                )
            agent_tokenizer = tokenizer if tokenizer is not None else episode.tokenizer
            if agent_tokenizer is None:
                raise ConfigError("the agent's engine carries no tokenizer: pass simulator_tokenizer")
            return self._make_simulator(episode.engine, agent_tokenizer)
        if self._simulator is not None:
            return self._simulator
        if isinstance(engine, str):
            from agentboost.engines.factory import make_engine
            from agentboost.models.tokenizers import load_tokenizer

            if model is None:
                raise ConfigError(f"simulator_engine={engine!r} needs simulator_model (for its tokenizer)")
            urls = [url] if isinstance(url, str) else list(url or [])
            engine = make_engine(engine, model=model, urls=urls)
            tokenizer = tokenizer if tokenizer is not None else tokenizer_of(engine)
            tokenizer = tokenizer if tokenizer is not None else load_tokenizer(model)
        else:
            tokenizer = tokenizer if tokenizer is not None else tokenizer_of(engine)
            if tokenizer is None:
                raise ConfigError("simulator_engine has no tokenizer: pass simulator_tokenizer")
        self._simulator = self._make_simulator(engine, tokenizer)
        return self._simulator

    def _make_simulator(self, engine: Engine, tokenizer: Tokenizer) -> UserSimulator:
        return UserSimulator(
            engine,
            tokenizer,
            template=self._simulator_template,
            sampling=self._simulator_sampling,
            max_new_tokens=self._simulator_max_new_tokens,
            retries=self._simulator_retries,
        )

    async def _customer_says(
        self, episode: Episode, conversation: Sequence[Mapping[str, Any]]
    ) -> SimulatorReply:
        record = episode.info.setdefault("simulator", {"turns": []})
        seed = (
            None
            if self._simulator_sampling.temperature == 0
            else episode.sample * 1_000_003 + len(record["turns"])
        )
        reply = await self.simulator(episode).reply(episode.state["scenario"], conversation, seed=seed)
        record["turns"].append(reply.to_dict())
        if reply.failure is not None and reply.failure.startswith("engine_error"):
            raise SimulatorEngineError(f"the user simulator's {reply.failure}")
        return reply

    # --- the episode ------------------------------------------------------------------------------

    async def reset(self, task: Task, *, sample: int = 0) -> Episode:
        tau2_task = self._tau2_task(task)
        environment = self.domain.task_environment(tau2_task)
        state = tau2_task.initial_state
        history = list(state.message_history or []) if state is not None else []
        episode = Episode(task, sample)
        episode.state.update(
            tau2_task=tau2_task,
            environment=environment,
            log=ToolLog(),
            history=history,
            scenario=scenario_text(tau2_task),
            user_turns=0,
        )
        episode.info["tau2"] = {"domain": self.domain.name, "task_id": tau2_task.id, "mode": self.mode}
        return episode

    async def start(self, episode: Episode) -> None:
        """In simulator mode the customer opens the conversation (on the episode's engine by default)."""
        if self.mode == "simulator":
            task = episode.task
            greeting = [{"role": "assistant", "content": AGENT_GREETING}]
            reply = await self._customer_says(episode, greeting)
            if reply.failure is not None or reply.marker is not None:
                raise SimulatorFailed(
                    f"the simulated customer could not open the conversation: "
                    f"{reply.failure or 'it ended at once with ' + str(reply.marker)}"
                )
            episode.state["user_turns"] = 1
            episode.task = dataclasses.replace(
                task, prompt=[*greeting, {"role": "user", "content": reply.text}]
            )

    def tools(self, episode: Episode) -> list[Any]:
        def on_call(name: str, tool_use_id: str, arguments: dict[str, Any], response: Any) -> None:
            if name == TRANSFER_TOOL and not response.error:
                episode.stop(TRANSFER_TOOL)

        return tau2_tools(episode.state["environment"], episode.state["log"], on_call=on_call)

    async def next_user_message(self, episode: Episode, messages: list[ChatMessage]) -> UserTurn | str | None:
        if self.mode == "ticket":
            return None
        if episode.state["user_turns"] >= self.max_user_turns:
            episode.info["tau2"]["cut_short"] = f"max_user_turns ({self.max_user_turns})"
            return UserTurn("", ends_conversation=True, detail=f"max_user_turns ({self.max_user_turns})")
        reply = await self._customer_says(episode, messages)
        episode.state["user_turns"] += 1
        if reply.failure is not None:
            episode.info["tau2"]["simulator_failed"] = reply.failure
            return UserTurn("", ends_conversation=True, detail=f"simulator_failed: {reply.failure}")
        if reply.marker is not None:
            return UserTurn(reply.text, ends_conversation=True, detail=reply.marker)
        return reply.text

    # --- reward -----------------------------------------------------------------------------------

    def ended_cleanly(self, trajectory: Trajectory, episode: Episode) -> bool:
        """Whether the conversation ended the way tau2 scores (not cut short by a limit or failure)."""
        reason, detail = trajectory.termination, trajectory.termination_detail or ""
        if reason is TerminationReason.USER_ENDED:
            return detail.startswith("###")
        if reason is TerminationReason.ENV_STOPPED:
            return detail == TRANSFER_TOOL
        return reason is TerminationReason.COMPLETED and self.mode == "ticket"

    def reward(self, trajectory: Trajectory, episode: Episode) -> Reward:
        failure = episode.info.get("tau2", {}).get("simulator_failed")
        if failure is not None:
            raise SimulatorFailed(f"the simulated customer failed ({failure}); this rollout is unscored")
        tau2_task = episode.state["tau2_task"]
        log: ToolLog = episode.state["log"]
        conversation = to_tau2_messages(episode_messages(trajectory), log, episode.state["history"])
        predicted = [
            (call["function"]["name"], call_arguments(call["function"].get("arguments")))
            for message in trajectory.messages
            if message.get("role") == "assistant"
            for call in message.get("tool_calls") or []
        ]
        well_formed = trajectory.metrics.get("parse_errors", 0) == 0 and trajectory.termination not in (
            TerminationReason.MAX_TOKENS,
        )
        breakdown, facts = score(
            self.domain,
            tau2_task,
            conversation,
            log,
            episode.state["environment"].tools.db,
            clean=self.ended_cleanly(trajectory, episode),
            predicted=predicted,
            well_formed=well_formed,
            ending=f"{trajectory.termination.value} ({trajectory.termination_detail})",
        )
        kind = self.reward_for(episode.task.metadata.get("split"))
        if self.baselines:
            for name, values in baseline_rewards(self.domain, tau2_task).items():
                breakdown[f"{name}_baseline"] = values[kind]
        return Reward(breakdown[kind], breakdown, {**facts, "reward": kind})


def episode_messages(trajectory: Trajectory) -> list[ChatMessage]:
    """The chat view to score: everything after the system prompt (the greeting included)."""
    return [message for message in trajectory.messages if message.get("role") != "system"]
