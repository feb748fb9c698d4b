"""agentboost's veRL agent loop: a Strands agent rollout, token-exact, as veRL's ``AgentLoopOutput``.

veRL's agent-loop worker instantiates :class:`AgentBoostAgentLoop` from ``agent_loop.yaml`` once per
trajectory and awaits :meth:`~AgentBoostAgentLoop.run` with the dataset row's fields. The loop rebuilds the
row's environment and task (:func:`~agentboost.integrations.verl.data.read_row`), runs the environment's
rollout over :class:`~agentboost.integrations.verl.engine.VerlServerEngine` and turns the trajectory into
veRL's output:

    prompt_ids         the rendered first prompt (system, tools, task), <= rollout.prompt_length
    response_ids       what follows, up to the policy's last generated token, <= rollout.response_length
    response_mask      1 exactly where the policy generated the token (tool results and templates are 0)
    response_logprobs  the server's log-probability where the mask is 1, 0.0 elsewhere
    reward_score       the environment's reward (veRL's reward manager is then skipped)
    num_turns          chat messages after the system prompt (user, assistant and tool messages)
    metrics            generation time, time outside generation, reward time, preemptions
    extra_fields       "agentboost": termination, error, task id, reward breakdown, trajectory metrics,
                       a gateway session's drift record;
                       "reward_extra_info": failed, policy_failure, turns, tool_calls, parse_errors,
                       forked_rows (numbers veRL logs)

Any environment runs here, a :class:`~agentboost.gateway.environment.GatewayEnvironment` included: its
rollout starts an in-process gateway in front of this loop's engine, so an unmodified agent's turns go
to veRL's servers under the rollout's request id. veRL takes one sequence per trajectory, so a gateway
session that forked trains its last row (the one its reward judged, with the rollout's reward); the
earlier rows are counted in ``forked_rows`` and left to ``agentboost export`` or the local trainer,
which train every row (docs/gateway.md).

Budgets: the rollout gets ``max_response_tokens = rollout.response_length``, so it ends at a message boundary
with ``context_full`` instead of being cut mid-turn; tool results appended after the last generated token
carry no training signal and are left out of the response. A first prompt longer than
``rollout.prompt_length`` is refused before any generation.

Failures follow the one rule the local trainer follows (:class:`~agentboost.outcomes.FailureRule`, the
environment's ``failure_rule``). A failure the policy caused (by default an ``agent_error`` after the
policy generated, e.g. a gateway agent that crashed on tool arguments the model wrote) is a scored
rollout: its real response mask and the environment's failure reward (0.0 by default), with
``reward_extra_info["policy_failure"] = 1``. Every other failure (engine error or timeout, a crashed
agent before any model turn, a failed reward, an overlong prompt, a bad row, no generated token) is
infrastructure's. ``run`` never raises (veRL would drop the rollout's whole group, or the whole batch):
such a rollout becomes a valid output with an all-zero response mask, reward 0.0 and the error in
``extra_fields["agentboost"]["error"]``. The one difference from the local trainer, which veRL forces:
veRL cannot remove a member from its GRPO group (every output of a prompt enters the group's mean and
std), so the masked member still counts there with reward 0.0, where the local trainer leaves it out
of the group (docs/verl.md, "Failed rollouts").
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping
from typing import Any
from uuid import uuid4

from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopOutput
from verl.utils.rollout_trace import rollout_trace_op

from agentboost.agent.limits import resolve_limits
from agentboost.engines.base import SamplingParams
from agentboost.envs.base import Environment
from agentboost.envs.registry import make_environment
from agentboost.envs.task import Task
from agentboost.integrations.verl.data import RowTask, read_row
from agentboost.integrations.verl.engine import VerlServerEngine
from agentboost.outcomes import Outcome, RolloutResult
from agentboost.tokens.trajectory import Trajectory

logger = logging.getLogger(__name__)

_ENVIRONMENTS: dict[tuple[str, str], Environment] = {}
"""This worker's environments by (reference, kwargs JSON). Rollouts share them; tools are per rollout."""

_VERL_SAMPLING_KEYS = frozenset({"temperature", "top_p", "top_k", "logprobs"})


def _environment(row: RowTask) -> Environment:
    key = (row.environment, json.dumps(row.environment_kwargs, sort_keys=True))
    environment = _ENVIRONMENTS.get(key)
    if environment is None:
        environment = make_environment(row.environment, row.environment_kwargs)
        _ENVIRONMENTS[key] = environment
    return environment


def _generated_end(trajectory: Trajectory) -> int:
    """Index just past the policy's last generated token (the prompt's end if it generated nothing)."""
    ends = [segment.end for segment in trajectory.segments if segment.role == "assistant"]
    return max(ends) if ends else trajectory.prompt_length


class AgentBoostAgentLoop(AgentLoopBase):
    """Runs one agentboost environment rollout per veRL trajectory (see the module docstring)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        rollout = self.rollout_config
        self.prompt_length = int(rollout.prompt_length)
        self.response_length = int(rollout.response_length)
        self.backend = str(rollout.get("name") or "vllm")
        max_model_len = rollout.get("max_model_len")
        self.max_model_len = int(max_model_len) if max_model_len else None
        multi_turn = rollout.get("multi_turn") or {}
        max_assistant_turns = multi_turn.get("max_assistant_turns")
        self.max_assistant_turns = int(max_assistant_turns) if max_assistant_turns else None
        self.full_determinism = bool(rollout.get("full_determinism", False))

    @rollout_trace_op
    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        started = time.perf_counter()
        try:
            return await self._run(sampling_params, kwargs, started)
        except Exception as error:  # never out of run(): veRL would drop the group or the batch
            detail = f"{type(error).__name__}: {error}"
            extra_info = kwargs.get("extra_info")
            task_id = str(extra_info.get("task_id", "")) if isinstance(extra_info, Mapping) else ""
            logger.warning("agentboost rollout of task %r failed: %s", task_id, detail)
            return self._failed_output(None, None, error=detail, task_id=task_id, started=started)

    async def _run(
        self, sampling_params: dict[str, Any], row: dict[str, Any], started: float
    ) -> AgentLoopOutput:
        spec = read_row(row)
        environment = _environment(spec)
        task = Task.from_dict(spec.task)
        limits = resolve_limits(
            environment.limits,
            caps={"max_response_tokens": self.response_length, "max_turns": self.max_assistant_turns},
        )
        engine = VerlServerEngine(
            self.server_manager,
            request_id=self._request_id(row),
            backend=self.backend,
            context_length=self.max_model_len,
            max_prompt_tokens=self.prompt_length,
            extra_sampling={k: v for k, v in sampling_params.items() if k not in _VERL_SAMPLING_KEYS},
            generate_kwargs={"priority": int(row["priority"])} if row.get("priority") else None,
        )
        result = await environment.run_episode(
            task,
            engine,
            self.tokenizer,
            sampling=self._sampling(sampling_params),
            limits=limits,
            sample=int(row.get("session_id") or 0),
        )
        return self._output(result, engine, spec, started)

    # --- settings from veRL ---------------------------------------------------------------------

    @staticmethod
    def _sampling(sampling_params: Mapping[str, Any]) -> SamplingParams:
        """veRL's sampling dict (validation passes temperature 0: greedy) as agentboost SamplingParams."""
        top_k = sampling_params.get("top_k")
        return SamplingParams(
            temperature=float(sampling_params.get("temperature", 1.0)),
            top_p=float(sampling_params.get("top_p", 1.0)),
            top_k=max(int(top_k), 0) if top_k is not None else 0,  # veRL's -1 is agentboost's 0: off
        )

    def _request_id(self, row: Mapping[str, Any]) -> str:
        """One id per rollout, so veRL routes every turn to the same server (prefix cache)."""
        if self.full_determinism:  # stable across runs, as veRL's own loops do under full determinism
            return f"det-{row.get('index', 0)}-{row.get('session_id', 0)}-{row.get('priority', 0)}"
        return uuid4().hex

    # --- outputs ----------------------------------------------------------------------------------

    def _output(
        self, result: RolloutResult, engine: VerlServerEngine, spec: RowTask, started: float
    ) -> AgentLoopOutput:
        trajectory = result.trajectory
        prompt_end = trajectory.prompt_length
        response_end = _generated_end(trajectory)
        error = self._error(result, prompt_end, response_end)
        if error is not None:
            logger.warning("agentboost rollout of task %r failed: %s", result.task_id, error)
            return self._failed_output(
                result, engine, error=error, task_id=result.task_id, started=started, spec=spec
            )
        response_mask = trajectory.loss_mask[prompt_end:response_end]
        logprobs = trajectory.logprobs[prompt_end:response_end]
        return AgentLoopOutput(
            prompt_ids=trajectory.token_ids[:prompt_end],
            response_ids=trajectory.token_ids[prompt_end:response_end],
            response_mask=response_mask,
            response_logprobs=[
                float(value) if mask and value is not None else 0.0
                for mask, value in zip(response_mask, logprobs, strict=True)
            ],
            reward_score=float(result.reward) if result.reward is not None else 0.0,
            num_turns=_num_turns(trajectory),
            metrics=self._metrics(trajectory, engine, started),
            extra_fields=self._extra_fields(result, engine, spec, error=None),
        )

    def _error(self, result: RolloutResult, prompt_end: int, response_end: int) -> str | None:
        """Why this rollout cannot train the policy, or None (a scored rollout, a policy failure included)."""
        trajectory = result.trajectory
        if result.outcome is not Outcome.SCORED:
            if trajectory.termination.failed:
                return f"{trajectory.termination.value}: {trajectory.termination_detail}"
            return f"reward failed: {result.reward_error} (the rollout ended {trajectory.termination.value})"
        if prompt_end > self.prompt_length:
            return f"the prompt has {prompt_end} tokens; rollout.prompt_length is {self.prompt_length}"
        ending = f"{trajectory.termination.value}: {trajectory.termination_detail}"
        if response_end == prompt_end:
            return f"the policy generated no token ({ending})"
        if response_end - prompt_end > self.response_length:  # the limits above make this impossible
            length = response_end - prompt_end
            return f"the response has {length} tokens; rollout.response_length is {self.response_length}"
        return None

    def _failed_output(
        self,
        result: RolloutResult | None,
        engine: VerlServerEngine | None,
        *,
        error: str,
        task_id: str,
        started: float,
        spec: RowTask | None = None,
    ) -> AgentLoopOutput:
        """A valid output that trains nothing: all-zero mask, reward 0.0, the error in extra_fields.

        It keeps the rollout's tokens where they fit (left-truncating an overlong prompt, as veRL does), and
        at least one prompt and one response token, which veRL's padding and reward placement need.
        """
        trajectory = result.trajectory if result is not None else None
        filler = self._filler_token()
        prompt_ids: list[int] = []
        response_ids: list[int] = []
        if trajectory is not None:
            prompt_end = trajectory.prompt_length
            prompt_ids = trajectory.token_ids[:prompt_end][-self.prompt_length :]
            response_ids = trajectory.token_ids[prompt_end : prompt_end + self.response_length]
        prompt_ids = prompt_ids or [filler]
        response_ids = response_ids or [filler]
        extra_fields = self._extra_fields(result, engine, spec, error=error, task_id=task_id)
        return AgentLoopOutput(
            prompt_ids=prompt_ids,
            response_ids=response_ids,
            response_mask=[0] * len(response_ids),
            response_logprobs=[0.0] * len(response_ids),
            reward_score=0.0,
            num_turns=_num_turns(trajectory) if trajectory is not None else 0,
            metrics=self._metrics(trajectory, engine, started),
            extra_fields=extra_fields,
        )

    def _filler_token(self) -> int:
        for token in (self.tokenizer.pad_token_id, self.tokenizer.eos_token_id):
            if token is not None:
                return int(token)
        return 0

    @staticmethod
    def _metrics(
        trajectory: Trajectory | None, engine: VerlServerEngine | None, started: float
    ) -> dict[str, float]:
        """veRL's per-sample timing metrics (AgentLoopMetrics)."""
        total = time.perf_counter() - started
        generate = engine.generate_s if engine is not None else 0.0
        agent = float(trajectory.metrics.get("latency_s", 0.0)) if trajectory is not None else 0.0
        return {
            "generate_sequences": generate,
            "tool_calls": max(agent - generate, 0.0),  # everything in the rollout outside generation
            "compute_score": max(total - agent, 0.0) if trajectory is not None else 0.0,
            "num_preempted": engine.num_preempted
            if engine is not None and engine.num_preempted is not None
            else -1,
        }

    @staticmethod
    def _extra_fields(
        result: RolloutResult | None,
        engine: VerlServerEngine | None,
        spec: RowTask | None,
        *,
        error: str | None,
        task_id: str = "",
    ) -> dict[str, Any]:
        trajectory = result.trajectory if result is not None else None
        metrics = dict(trajectory.metrics) if trajectory is not None else {}
        policy_failure = error is None and result is not None and result.policy_failure  # scored, trained
        extra: dict[str, Any] = {
            "agentboost": {
                "task_id": result.task_id if result is not None else task_id,
                "environment": spec.environment if spec is not None else None,
                "termination": trajectory.termination.value if trajectory is not None else None,
                "termination_detail": trajectory.termination_detail if trajectory is not None else None,
                "error": error,
                "reward": result.reward if result is not None else None,
                "reward_breakdown": dict(result.reward_breakdown) if result is not None else {},
                "metrics": metrics,
                "drift": list(trajectory.info.get("gateway", {}).get("drift", ())) if trajectory else [],
            },
            # numbers only, the same keys for every sample: veRL logs them per data source
            "reward_extra_info": {
                "failed": 1.0 if error is not None else 0.0,
                "policy_failure": 1.0 if policy_failure else 0.0,
                "turns": float(metrics.get("turns", 0)),
                "tool_calls": float(metrics.get("tool_calls", 0)),
                "parse_errors": float(metrics.get("parse_errors", 0)),
                "forked_rows": float(len(trajectory.forked_rows)) if trajectory is not None else 0.0,
            },
        }
        if engine is not None and engine.min_global_steps is not None:
            extra["min_global_steps"] = engine.min_global_steps
            extra["max_global_steps"] = engine.max_global_steps
        return extra


def _num_turns(trajectory: Trajectory) -> int:
    return sum(1 for message in trajectory.messages if message.get("role") != "system")
