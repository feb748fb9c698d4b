"""Gateway rollouts are ordinary rollouts: environment, limits, evaluation, results files and the trainer."""

from __future__ import annotations

import asyncio
import runpy
import sys
from pathlib import Path
from types import SimpleNamespace

import openai
import pytest
from conftest import TOOL_SCRIPT, run
from gateway_support import Calculation, forking_agent, openai_agent

from agentboost.agent.limits import RolloutLimits
from agentboost.engines.scripted import ScriptedEngine
from agentboost.envs.base import RolloutResult
from agentboost.envs.registry import make_environment
from agentboost.envs.task import Task
from agentboost.eval.evaluate import evaluate
from agentboost.gateway.environment import AgentContext, GatewayEnvironment
from agentboost.outcomes import FailureRule, Outcome
from agentboost.rollout.results import read_results
from agentboost.tokens.trajectory import TerminationReason
from agentboost.train.config import AlgorithmConfig, RolloutConfig
from agentboost.train.trainer import Trainer

EXAMPLE_AGENT = Path(__file__).parents[2] / "examples" / "gateway" / "openai_agent.py"


async def sdk_agent(context: AgentContext):
    messages = await openai_agent(context.base_url, context.api_key)
    return messages[-1]["content"]


def rollout(environment, engine, tokenizer, **options):
    return run(
        environment.run_episode(
            Task(id="t0", prompt="What is (12 + 30) * 2?", ground_truth="84"), engine, tokenizer, **options
        )
    )


def test_an_async_sdk_agent_is_an_ordinary_scored_rollout(qwen_tokenizer, say):
    environment = GatewayEnvironment(sdk_agent, tasks_from=Calculation())
    result = rollout(
        environment, ScriptedEngine([say(text) for text in TOOL_SCRIPT]), qwen_tokenizer, template="qwen3"
    )
    assert result.reward == 1.0 and result.termination is TerminationReason.COMPLETED
    trajectory = result.trajectory
    assert trajectory.metrics["turns"] == 3 and trajectory.metrics["tool_calls"] == 2
    assert trajectory.info["gateway"]["rows"] == 1 and trajectory.info["tasks_from"] == "calculation"
    assert trajectory.info["agent_output"] == "The result is 84.\nAnswer: 84"


def test_a_command_agent_gets_the_session_in_its_environment(qwen_tokenizer, say):
    """The example's unmodified OpenAI-SDK script, run as a subprocess, through a real tool call."""
    script = [
        '<tool_call>\n{"name": "calculator", "arguments": {"expression": "(12 + 30) * 2"}}\n</tool_call>',
        "Answer: 84",
    ]
    environment = GatewayEnvironment(command=[sys.executable, str(EXAMPLE_AGENT)], tasks_from=Calculation())
    result = rollout(
        environment, ScriptedEngine([say(text) for text in script]), qwen_tokenizer, template="qwen3"
    )
    assert result.termination is TerminationReason.COMPLETED, result.trajectory.termination_detail
    assert result.reward == 1.0
    tool_messages = [m for m in result.trajectory.messages if m["role"] == "tool"]
    assert [m["content"] for m in tool_messages] == ["84"] and tool_messages[0]["name"] == "calculator"


def test_a_failing_command_is_an_agent_error_with_its_output(qwen_tokenizer, say):
    environment = GatewayEnvironment(
        command=[sys.executable, "-c", "import sys; sys.exit('no model for me')"], tasks_from=Calculation()
    )
    result = rollout(environment, ScriptedEngine([say("hi")]), qwen_tokenizer, template="qwen3")
    assert result.termination is TerminationReason.AGENT_ERROR and result.reward is None
    assert result.outcome is Outcome.FAILED  # it never reached the model: not the policy's failure
    assert "no model for me" in result.trajectory.termination_detail


def test_an_agent_that_crashes_after_a_model_turn_is_scored_with_the_failure_reward(qwen_tokenizer, say):
    """The escape the audit found: an agent crash the model can provoke must not take its rollout out of
    its group. It scores the wrapped environment's failure reward and keeps its real loss mask."""

    async def crashes_on_the_answer(context: AgentContext):
        async with openai.AsyncOpenAI(
            base_url=context.base_url, api_key=context.api_key, max_retries=0
        ) as client:
            await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
        raise RecursionError("maximum recursion depth exceeded")  # e.g. its calculator on a deep expression

    environment = GatewayEnvironment(crashes_on_the_answer, tasks_from=Calculation())
    result = rollout(environment, ScriptedEngine([say("Answer: 84")]), qwen_tokenizer, template="qwen3")
    assert result.termination is TerminationReason.AGENT_ERROR
    assert "RecursionError" in result.trajectory.termination_detail
    assert result.outcome is Outcome.SCORED and result.reward == 0.0 and result.failure is None
    assert result.reward_info == {"policy_failure": "agent_error"}
    assert result.trajectory.generated_tokens == len(say("Answer: 84"))  # trained on, with its real mask

    class Punishing(Calculation):
        failure_rule = FailureRule(reward=-1.0)

    environment = GatewayEnvironment(crashes_on_the_answer, tasks_from=Punishing())
    assert rollout(environment, ScriptedEngine([say("ok")]), qwen_tokenizer, template="qwen3").reward == -1.0


def test_a_never_ending_agent_is_stopped_by_the_rollouts_limits(qwen_tokenizer, say):
    async def chatterbox(context: AgentContext):
        client = openai.AsyncOpenAI(base_url=context.base_url, api_key=context.api_key, max_retries=0)
        messages = [{"role": "user", "content": "talk"}]
        while True:  # never returns on its own
            reply = await client.chat.completions.create(model="m", messages=messages)
            messages += [
                reply.choices[0].message.model_dump(exclude_none=True),
                {"role": "user", "content": "more"},
            ]

    environment = GatewayEnvironment(chatterbox, tasks_from=Calculation(), limits=RolloutLimits(max_turns=3))
    result = rollout(environment, ScriptedEngine([say("ok")], cycle=True), qwen_tokenizer, template="qwen3")
    assert result.termination is TerminationReason.MAX_TURNS
    assert result.trajectory.metrics["turns"] == 3 and result.trajectory.info["gateway"]["drift"] == []

    async def sleeper(context: AgentContext):
        async with openai.AsyncOpenAI(
            base_url=context.base_url, api_key=context.api_key, max_retries=0
        ) as client:
            await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
            await asyncio.sleep(3600)

    environment = GatewayEnvironment(sleeper, tasks_from=Calculation(), limits=RolloutLimits(timeout_s=1))
    result = rollout(environment, ScriptedEngine([say("ok")], cycle=True), qwen_tokenizer, template="qwen3")
    assert result.termination is TerminationReason.TIMEOUT and result.trajectory.metrics["turns"] == 1


def test_a_session_whose_engine_never_answered_before_the_timeout_is_an_engine_failure(qwen_tokenizer, say):
    class Stalled(ScriptedEngine):  # answers only after the rollout's timeout (the gateway waits for it)
        async def generate(self, prompt_ids, sampling, *, max_new_tokens):
            await asyncio.sleep(2)
            return await super().generate(prompt_ids, sampling, max_new_tokens=max_new_tokens)

    async def patient(context: AgentContext):
        async with openai.AsyncOpenAI(
            base_url=context.base_url, api_key=context.api_key, max_retries=0, timeout=60
        ) as client:
            await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])

    environment = GatewayEnvironment(patient, tasks_from=Calculation(), limits=RolloutLimits(timeout_s=0.5))
    result = rollout(environment, Stalled([say("ok")]), qwen_tokenizer, template="qwen3")
    assert result.termination is TerminationReason.ENGINE_TIMEOUT, result.trajectory.termination_detail
    assert "before the engine answered once" in result.trajectory.termination_detail
    assert result.reward is None and result.failure == "engine_timeout"


def test_the_example_agent_reads_its_own_crashing_calculator_calls_as_tool_errors(qwen_tokenizer, say):
    """The two calls that crashed the shipped agent (RecursionError, OverflowError in float()) are
    answered with an error the model reads; the rollout goes on and is scored."""
    deep, huge = "-" * 1500 + "1", " * ".join(["9" * 20] * 20)
    calls = "\n".join(
        f'<tool_call>\n{{"name": "calculator", "arguments": {{"expression": "{expression}"}}}}\n</tool_call>'
        for expression in (deep, huge)
    )
    environment = GatewayEnvironment(command=[sys.executable, str(EXAMPLE_AGENT)], tasks_from=Calculation())
    engine = ScriptedEngine([say(calls), say("Answer: 84")])
    result = rollout(environment, engine, qwen_tokenizer, template="qwen3")
    assert result.termination is TerminationReason.COMPLETED, result.trajectory.termination_detail
    assert result.reward == 1.0
    tool_messages = [m["content"] for m in result.trajectory.messages if m["role"] == "tool"]
    assert tool_messages == [
        "Error: the expression nests more than 100 operations",
        "Error: a value has more than 300 digits",
    ]


@pytest.mark.parametrize(
    ("expression", "says"),
    [
        ("-" * 1500 + "1", "nests more than 100 operations"),  # was RecursionError
        (" * ".join(["9" * 20] * 20), "more than 300 digits"),  # was OverflowError in float()
        ("1e200 * 1e200", "more than 300 digits"),  # inf
        ("-" * 200_000 + "1", "nests more than 100 operations"),  # the parser's own MemoryError
        ("9" * 5000, "Exceeds the limit"),  # int-string conversion limit
        ("(12 + 30) * 2 / 0", "division by zero"),
    ],
)
def test_the_example_calculator_answers_arguments_that_crashed_it_with_an_error(expression, says):
    calculate = runpy.run_path(str(EXAMPLE_AGENT))["calculate"]
    answer = calculate(expression)
    assert answer.startswith("Error: ") and says in answer


def test_forked_rows_survive_evaluation_and_each_trains_with_the_rollouts_advantage(
    qwen_tokenizer, say, tmp_path
):
    environment = GatewayEnvironment(forking_agent, tasks_from=Calculation())
    engine = ScriptedEngine([say(TOOL_SCRIPT[0]), say("Answer: 84"), say(TOOL_SCRIPT[0]), say("Answer: 41")])
    tasks = environment.tasks(2)
    report, _ = run(
        evaluate(
            environment,
            engine,
            qwen_tokenizer,
            tasks,
            out=tmp_path / "r.jsonl",
            concurrency=1,
            progress=False,
        )
    )
    assert report["gateway"] == {
        "sessions": 2,
        "rows": 4,
        "forked_rollouts": 2,
        "drift": {"assistant_edited": 2},
    }
    results = list(read_results(tmp_path / "r.jsonl"))
    assert sorted(r.reward for r in results) == [0.0, 1.0]
    assert all(len(r.trajectory.training_rows) == 2 for r in results)
    # one GRPO group of two rollouts: four rows, each with its rollout's advantage
    group = [RolloutResult("same", r.sample, r.trajectory, r.reward) for r in results]
    trainer = SimpleNamespace(config=SimpleNamespace(algorithm=AlgorithmConfig(), rollout=RolloutConfig()))
    samples, _ = Trainer.make_samples(trainer, group)
    assert len(samples) == 4 and [s.index for s in samples] == [0, 1, 2, 3]
    by_reward = {}
    for sample in samples:
        by_reward.setdefault(sample.reward, set()).add(sample.advantage)
    assert {reward: len(advantages) for reward, advantages in by_reward.items()} == {0.0: 1, 1.0: 1}
    assert by_reward[1.0].pop() > 0 > by_reward[0.0].pop()
    rows = [row for r in group for row in r.trajectory.training_rows]
    assert [s.input_ids.tolist() for s in samples] == [row.token_ids[:-1] for row in rows]


def test_the_registry_builds_it_from_json_kwargs():
    environment = make_environment(
        "gateway", {"command": "python agent.py", "tasks_from": "arithmetic", "policy": "reset"}
    )
    assert environment.command == ["python", "agent.py"] and environment.policy.value == "reset"
    assert environment.system_prompt == environment.inner.system_prompt and len(environment.tasks(3)) == 3


def test_the_examples_config_builds_a_gateway_environment_on_arithmetic_tasks():
    from agentboost.train.config import load_config

    config = load_config(Path(__file__).parents[2] / "examples" / "gateway" / "train.yaml")
    environment = make_environment(config.environment.name, config.environment.kwargs)
    assert isinstance(environment, GatewayEnvironment) and environment.inner.name == "arithmetic"
    assert environment.command[-1] == "examples/gateway/openai_agent.py"
    assert (Path(__file__).parents[2] / environment.command[-1]).is_file()
