"""The Environment API: per-rollout lifecycle, multi-turn users, stops, tool metadata, typed tasks.

Scripted engine (exact ids, no model) and the real Qwen3 tokenizer and template.
"""

from __future__ import annotations

import asyncio
import json

import pytest
from conftest import add, run
from strands import tool
from strands.hooks import AfterToolCallEvent, BeforeModelCallEvent, HookProvider, HookRegistry

from agentboost.agent.episode import run_agent
from agentboost.agent.limits import RolloutLimits, resolve_limits
from agentboost.engines.base import Generation, OneBackend, RolloutKey, SamplingParams
from agentboost.engines.scripted import ScriptedEngine
from agentboost.envs.base import Environment, Episode, Reward, RewardFunction, RolloutResult, Task, UserTurn
from agentboost.errors import ConfigError, EngineError
from agentboost.tokens.trajectory import TERMINATIONS, TerminationReason, Trajectory

ADD_CALL = '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'


class Recording(Environment):
    """Records every lifecycle call; behaviour is switched by the task's metadata."""

    name = "recording"
    system_prompt = "You are helpful."
    template = "qwen3"
    limits = RolloutLimits(max_turns=8)

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    def tasks(self, n=None, *, seed=0, split="train"):
        return [Task("t0", "What is 1 + 2?", ground_truth=3)]

    async def reset(self, task, *, sample=0):
        self.calls.append(("reset", task.id))
        if task.metadata.get("reset_fails"):
            raise RuntimeError("database copy failed")
        episode = Episode(task, sample)
        episode.state["resource"] = "open"
        return episode

    def tools(self, episode):
        self.calls.append(("tools", episode.task.id))
        if episode.task.metadata.get("tools_fail"):
            raise RuntimeError("no tools today")
        return [add]

    async def cleanup(self, episode):
        self.calls.append(("cleanup", episode.task.id))
        episode.state["resource"] = "closed"

    def reward(self, trajectory, episode):
        return Reward(1.0, {"parts": 2.0}, {"note": "fine"})


def rollout(environment, engine, tokenizer, task, **kwargs):
    return run(environment.run_episode(task, engine, tokenizer, **kwargs))


def test_the_lifecycle_runs_reset_tools_reward_cleanup_once_each(qwen_tokenizer, say):
    environment = Recording()
    engine = ScriptedEngine([say(ADD_CALL), say("Answer: 3")])
    result = rollout(environment, engine, qwen_tokenizer, Task("t0", "What is 1 + 2?"))
    assert environment.calls == [("reset", "t0"), ("tools", "t0"), ("cleanup", "t0")]
    assert result.termination is TerminationReason.COMPLETED
    assert (result.reward, result.reward_breakdown, result.reward_info) == (
        1.0,
        {"parts": 2.0},
        {"note": "fine"},
    )
    assert RolloutResult.from_dict(json.loads(json.dumps(result.to_dict()))).reward_info == {"note": "fine"}


def test_cleanup_runs_after_a_failed_rollout_and_failures_are_recorded_not_raised(qwen_tokenizer, say):
    environment = Recording()
    result = rollout(environment, ScriptedEngine([]), qwen_tokenizer, Task("t0", "hi"))
    assert result.termination is TerminationReason.ENGINE_ERROR and result.reward is None
    assert "no reward" in result.reward_error and result.failed
    assert environment.calls[-1] == ("cleanup", "t0")

    environment = Recording()
    broken = Task("t1", "hi", metadata={"tools_fail": True})
    result = rollout(environment, ScriptedEngine([]), qwen_tokenizer, broken)
    assert result.termination is TerminationReason.ENV_ERROR
    assert "no tools today" in result.trajectory.termination_detail
    assert environment.calls == [("reset", "t1"), ("tools", "t1"), ("cleanup", "t1")]

    environment = Recording()
    result = rollout(
        environment, ScriptedEngine([]), qwen_tokenizer, Task("t2", "hi", metadata={"reset_fails": True})
    )
    assert result.termination is TerminationReason.ENV_ERROR and result.failed
    assert "database copy failed" in result.trajectory.termination_detail
    assert environment.calls == [("reset", "t2")]  # no episode: nothing to clean up


class Hanging(OneBackend):
    """An engine whose first generation never returns, until cancelled."""

    context_length = None

    def __init__(self) -> None:
        self.started = asyncio.Event()

    async def generate(self, prompt_ids, sampling, *, max_new_tokens):
        self.started.set()
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    async def aclose(self):
        return None


def test_cleanup_runs_when_the_rollout_is_cancelled(qwen_tokenizer):
    environment = Recording()
    engine = Hanging()

    async def cancel_midway():
        task = asyncio.create_task(environment.run_episode(Task("t0", "hi"), engine, qwen_tokenizer))
        await engine.started.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    run(cancel_midway())
    assert environment.calls[-1] == ("cleanup", "t0")


class Customer(Environment):
    """A scripted customer: two messages, then a last word that ends the conversation."""

    name = "customer"
    template = "qwen3"

    def __init__(self, replies):
        self.replies = replies
        self.seen: list[list[dict]] = []

    def tasks(self, n=None, *, seed=0, split="train"):
        return [Task("c0", "My order is late.")]

    async def next_user_message(self, episode, messages):
        self.seen.append(messages)
        reply = self.replies[len(self.seen) - 1]
        if isinstance(reply, Exception):
            raise reply
        return reply

    def reward(self, trajectory, episode):
        return 1.0


def test_a_multi_turn_user_is_appended_token_exactly_with_loss_mask_zero(qwen_tokenizer, say):
    replies = ["It was order 17.", UserTurn("Thanks, bye!", ends_conversation=True, detail="###STOP###")]
    environment = Customer(replies)
    answers = ["Which order?", "It ships tomorrow."]
    engine = ScriptedEngine([say(text) for text in answers])
    result = rollout(environment, engine, qwen_tokenizer, environment.tasks()[0])
    trajectory = result.trajectory

    assert trajectory.termination is TerminationReason.USER_ENDED
    assert trajectory.termination_detail == "###STOP###"
    roles = [m["role"] for m in trajectory.messages]
    assert roles == ["user", "assistant", "user", "assistant", "user"]
    assert trajectory.messages[-1]["content"] == "Thanks, bye!"
    # the environment saw the conversation so far each time
    assert [m["content"] for m in environment.seen[1]][-1] == "It ships tomorrow."

    # tokens: the user's middle message is in the sequence with mask 0; the last word has no tokens
    text = qwen_tokenizer.decode(trajectory.token_ids)
    assert "It was order 17." in text and "Thanks, bye!" not in text
    user_segments = [s for s in trajectory.segments if s.role == "user"]
    assert len(user_segments) == 1
    assert all(trajectory.loss_mask[i] == 0 for s in user_segments for i in range(s.start, s.end))
    generated = [t for t, m in zip(trajectory.token_ids, trajectory.loss_mask, strict=True) if m]
    assert generated == say(answers[0]) + say(answers[1])
    assert all(lp is not None for lp, m in zip(trajectory.logprobs, trajectory.loss_mask, strict=True) if m)
    # the whole sequence is what the template renders for the conversation (no drift)
    assert trajectory.token_ids[-1] == qwen_tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert engine.calls == 2


def test_a_user_that_says_nothing_more_completes_and_a_raising_user_is_an_env_error(qwen_tokenizer, say):
    result = rollout(Customer([None]), ScriptedEngine([say("Hello!")]), qwen_tokenizer, Task("c", "hi"))
    assert result.termination is TerminationReason.COMPLETED and result.reward == 1.0

    result = rollout(
        Customer([RuntimeError("simulator crashed")]),
        ScriptedEngine([say("Hello!")]),
        qwen_tokenizer,
        Task("c", "hi"),
    )
    assert result.termination is TerminationReason.ENV_ERROR and result.reward is None
    assert "simulator crashed" in result.trajectory.termination_detail
    assert result.trajectory.messages[-1]["content"] == "Hello!"  # what was done is kept

    result = rollout(
        Customer([EngineError("simulator's server is down")]),
        ScriptedEngine([say("Hello!")]),
        qwen_tokenizer,
        Task("c", "hi"),
    )
    assert result.termination is TerminationReason.ENGINE_ERROR and result.termination.retryable

    result = rollout(Customer([42]), ScriptedEngine([say("Hello!")]), qwen_tokenizer, Task("c", "hi"))
    assert result.termination is TerminationReason.ENV_ERROR
    assert "must return text, a UserTurn or None" in result.trajectory.termination_detail


def test_a_chatty_user_is_stopped_by_max_turns(qwen_tokenizer, say):
    environment = Customer(["more"] * 10)
    environment.limits = RolloutLimits(max_turns=3)
    result = rollout(environment, ScriptedEngine([say("ok")], cycle=True), qwen_tokenizer, Task("c", "hi"))
    assert result.termination is TerminationReason.MAX_TURNS
    assert [m["role"] for m in result.trajectory.messages].count("assistant") == 3


class Transfers(Environment):
    """A tool that hands the customer to a human: the rollout ends after the tool ran."""

    name = "transfers"
    template = "qwen3"

    def tasks(self, n=None, *, seed=0, split="train"):
        return [Task("x", "I want a human.")]

    def tools(self, episode):
        @tool(context=True)
        def transfer_to_human(summary: str, tool_context) -> str:
            """Transfer the customer to a human agent.

            Args:
                summary: What the customer needs.
            """
            episode.annotate_tool(tool_context, status="transferred", length=len(summary))
            episode.stop("transferred to a human agent")
            return "Transfer successful."

        return [transfer_to_human]

    def reward(self, trajectory, episode):
        return 0.5


def test_an_environment_stop_ends_the_rollout_after_the_tools_ran_and_tool_metadata_is_kept(
    qwen_tokenizer, say
):
    call = '<tool_call>\n{"name": "transfer_to_human", "arguments": {"summary": "refund"}}\n</tool_call>'
    engine = ScriptedEngine([say(call), say("never generated")])
    result = rollout(Transfers(), engine, qwen_tokenizer, Task("x", "I want a human."))
    trajectory = result.trajectory
    assert trajectory.termination is TerminationReason.ENV_STOPPED
    assert trajectory.termination_detail == "transferred to a human agent"
    assert engine.calls == 1 and result.reward == 0.5
    tool_message = trajectory.messages[-1]
    assert tool_message["role"] == "tool" and tool_message["content"] == "Transfer successful."
    assert tool_message["metadata"] == {"status": "transferred", "length": 6}
    # the sequence ends on the model's turn: the tool result is in the chat view only
    assert trajectory.segments[-1].role == "assistant"
    assert trajectory.token_ids[-1] == qwen_tokenizer.convert_tokens_to_ids("<|im_end|>")


class Counting(HookProvider):
    def __init__(self) -> None:
        self.model_calls = 0
        self.tool_calls: list[str] = []

    def register_hooks(self, registry: HookRegistry, **kwargs) -> None:
        registry.add_callback(BeforeModelCallEvent, self._model)
        registry.add_callback(AfterToolCallEvent, self._tool)

    def _model(self, event) -> None:
        self.model_calls += 1

    def _tool(self, event) -> None:
        self.tool_calls.append(event.tool_use["name"])


class ReadsStrandsMessages(RewardFunction):
    """A reusable reward that reads the SDK's own messages (tool results as the SDK recorded them)."""

    def __call__(self, trajectory: Trajectory, episode: Episode) -> Reward:
        results = [
            block["toolResult"]
            for message in episode.messages
            for block in message["content"]
            if "toolResult" in block
        ]
        correct = any(result["content"][0].get("text") == "3" for result in results)
        return Reward(float(correct), {"tool_results": float(len(results))})


class Hooked(Environment):
    name = "hooked"
    template = "qwen3"
    reward_fn = ReadsStrandsMessages()

    def __init__(self) -> None:
        self.hooks_made: list[Counting] = []

    def tasks(self, n=None, *, seed=0, split="train"):
        return [Task("h", "What is 1 + 2?")]

    def tools(self, episode):
        return [add]

    def hooks(self, episode):
        hook = Counting()
        self.hooks_made.append(hook)
        return [hook]


def test_hooks_come_from_the_environment_and_a_reward_function_reads_strands_messages(qwen_tokenizer, say):
    environment = Hooked()
    engine = ScriptedEngine([say(ADD_CALL), say("Answer: 3")])
    result = rollout(environment, engine, qwen_tokenizer, Task("h", "What is 1 + 2?"))
    (hook,) = environment.hooks_made
    assert hook.model_calls == 2 and hook.tool_calls == ["add"]
    assert result.reward == 1.0 and result.reward_breakdown == {"tool_results": 1.0}


def test_a_starting_conversation_is_prompt_tokens_and_its_system_message_wins(qwen_tokenizer, say):
    task = Task(
        "s",
        [
            {"role": "system", "content": "You are a pirate."},
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Arr, hello."},
            {"role": "user", "content": "Where is the treasure?"},
        ],
    )
    environment = Recording()
    result = rollout(environment, ScriptedEngine([say("Under the palm.")]), qwen_tokenizer, task)
    trajectory = result.trajectory
    prompt_text = qwen_tokenizer.decode(trajectory.token_ids[: trajectory.prompt_length])
    assert "You are a pirate." in prompt_text and "You are helpful." not in prompt_text
    assert "Arr, hello." in prompt_text and prompt_text.rstrip().endswith("<|im_start|>assistant")
    assert sum(trajectory.loss_mask) == len(say("Under the palm."))
    assert [m["role"] for m in trajectory.messages] == ["system", "user", "assistant", "user", "assistant"]


def test_tasks_round_trip_through_json_and_parquet_rows(tmp_path):
    pq = pytest.importorskip("pyarrow.parquet")
    import pyarrow as pa

    tasks = [
        Task("a", "plain text", ground_truth=3, metadata={"tests": [{"input": "1\n", "output": "2\n"}]}),
        Task("b", [{"role": "user", "content": "hello"}], ground_truth={"actions": ["x"]}),
        Task("c", "no truth"),
    ]
    for task in tasks:
        assert Task.from_dict(json.loads(json.dumps(task.to_dict()))) == task
    pq.write_table(pa.Table.from_pylist([task.to_row() for task in tasks]), tmp_path / "tasks.parquet")
    rows = pq.read_table(tmp_path / "tasks.parquet").to_pylist()
    assert [Task.from_row(row) for row in rows] == tasks


@pytest.mark.parametrize(
    ("data", "says"),
    [
        ({"prompt": "x"}, "lacks id"),
        ({"id": "", "prompt": "x"}, "non-empty string"),
        ({"id": "a", "prompt": []}, "non-empty list"),
        ({"id": "a", "prompt": [{"role": "assistant", "content": "x"}]}, "must end with a user message"),
        ({"id": "a", "prompt": [{"role": "tool", "content": "x"}]}, "must be"),
        ({"id": "a", "prompt": "x", "answer": 3}, "unknown fields ['answer']"),
        ({"id": "a", "prompt": "x", "metadata": {"when": object()}}, "not JSON-serialisable"),
    ],
)
def test_bad_task_rows_are_typed_errors_that_say_what_to_fix(data, says):
    with pytest.raises(ConfigError, match=None) as raised:
        Task.from_dict(data).to_dict()
    assert says in str(raised.value)


def test_the_termination_table_covers_every_reason_and_says_what_each_means():
    assert set(TERMINATIONS) == set(TerminationReason)
    retryable = {reason for reason in TerminationReason if reason.retryable}
    assert retryable == {TerminationReason.ENGINE_ERROR, TerminationReason.WORKER_CRASHED}
    assert all(reason.failed for reason in retryable)
    assert not any(reason.trainable for reason in TerminationReason if reason.failed)
    assert TerminationReason.MAX_TOKENS.truncated and not TerminationReason.USER_ENDED.truncated


def test_limits_resolve_in_one_place_and_explicit_zeros_are_rejected_not_replaced():
    environment = RolloutLimits(max_turns=6, max_new_tokens=256, timeout_s=30)
    assert resolve_limits(environment, {"max_turns": None, "max_new_tokens": 64}) == RolloutLimits(
        max_turns=6, max_new_tokens=64, timeout_s=30
    )
    with pytest.raises(ConfigError, match="max_new_tokens must be an integer >= 1"):
        resolve_limits(environment, {"max_new_tokens": 0})
    with pytest.raises(ConfigError, match="timeout_s must be > 0"):
        resolve_limits(environment, {"timeout_s": 0})
    with pytest.raises(ConfigError, match="unknown rollout limit 'max_turn'"):
        resolve_limits(environment, {"max_turn": 3})
    capped = resolve_limits(
        environment, caps={"max_turns": 4, "max_response_tokens": 100, "max_tool_calls": None}
    )
    assert (capped.max_turns, capped.max_response_tokens, capped.max_tool_calls) == (4, 100, None)


def test_the_per_turn_budget_has_one_owner(qwen_tokenizer, say):
    with pytest.raises(TypeError, match="max_new_tokens"):  # sampling has no token budget to slip past
        SamplingParams(max_new_tokens=7)

    class Budget(OneBackend):
        context_length = None

        def __init__(self) -> None:
            self.seen: list[int] = []

        async def generate(self, prompt_ids, sampling, *, max_new_tokens):
            self.seen.append(max_new_tokens)
            ids = say("ok")
            return Generation(ids, [-0.1] * len(ids), "stop", len(prompt_ids))

        async def aclose(self):
            return None

    engine = Budget()
    run(run_agent(engine, qwen_tokenizer, "hi", template="qwen3", limits=RolloutLimits(max_new_tokens=33)))
    assert engine.seen == [33]


def test_grpo_siblings_get_their_own_server_binding(qwen_tokenizer, say):
    bound_keys: list[RolloutKey] = []
    released: list[RolloutKey] = []

    class Bindable(ScriptedEngine):
        def bind(self, key):
            bound_keys.append(key)
            return self

        def unbind(self, key):
            released.append(key)

    engine = Bindable([say("a"), say("b")])
    environment = Recording()
    for sample in (0, 1):
        rollout(environment, engine, qwen_tokenizer, Task("t0", "hi"), sample=sample)
    assert bound_keys == released == [RolloutKey("t0", 0), RolloutKey("t0", 1)]


def test_an_environment_written_for_the_old_rollout_name_still_runs_and_is_told_once(
    qwen_tokenizer, say, monkeypatch
):
    """``Environment.rollout`` is now ``run_episode``: an old override is what the runner calls (its
    ``super().rollout()`` runs the base episode), with one DeprecationWarning per class and per caller."""
    import warnings

    from agentboost.envs import base

    monkeypatch.setattr(base, "_ROLLOUT_RENAMED_WARNED", set())  # what earlier tests were told
    with pytest.warns(DeprecationWarning, match=r"Legacy overrides Environment\.rollout.*run_episode"):

        class Legacy(Recording):
            async def rollout(self, task, engine, tokenizer=None, **options):
                self.calls.append(("legacy", task.id))
                return await super().rollout(task, engine, tokenizer, **options)

    environment = Legacy()
    with pytest.warns(DeprecationWarning, match=r"Environment\.rollout\(\) was called"):
        result = rollout(environment, ScriptedEngine([say("Answer: 3")]), qwen_tokenizer, Task("t0", "hi"))
    assert environment.calls == [("legacy", "t0"), ("reset", "t0"), ("tools", "t0"), ("cleanup", "t0")]
    assert result.termination is TerminationReason.COMPLETED and result.reward == 1.0

    current = Recording()  # a caller still using the old name on a current environment
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            result = run(current.rollout(Task("t0", "hi"), ScriptedEngine([say("3")]), qwen_tokenizer))
    assert result.termination is TerminationReason.COMPLETED
    assert current.calls == [("reset", "t0"), ("tools", "t0"), ("cleanup", "t0")] * 2
    assert [w.category for w in caught] == []  # told once per process, and that was above
