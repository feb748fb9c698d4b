"""Every malformed tool call and every limit ends as documented (scripted engine, real Qwen tokenizer)."""

from __future__ import annotations

import asyncio

import pytest
from conftest import QUESTION, SYSTEM, add, multiply, run

from agentboost.agent.episode import run_agent
from agentboost.agent.limits import RolloutLimits
from agentboost.engines.base import Generation
from agentboost.engines.scripted import ScriptedEngine
from agentboost.errors import EngineError
from agentboost.tokens.templates import ChatTemplate, get_template
from agentboost.tokens.trajectory import TerminationReason

ADD_CALL = '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'


def rollout(tokenizer, responses, *, limits=None, template="qwen3", parser="hermes", tools=(add, multiply)):
    engine = responses if not isinstance(responses, list) else ScriptedEngine(responses)
    return run(
        run_agent(
            engine,
            tokenizer,
            QUESTION,
            system_prompt=SYSTEM,
            tools=list(tools),
            template=template,
            parser=parser,
            limits=limits or RolloutLimits(max_turns=6),
        )
    )


@pytest.mark.parametrize(
    ("call", "kind", "says"),
    [
        (
            '<tool_call>\n{"name": "add", "arguments": {"a": 1,}}\n</tool_call>',
            "invalid_json",
            "not valid JSON",
        ),
        ('<tool_call>\n{"arguments": {"a": 1, "b": 2}}\n</tool_call>', "missing_name", 'no "name"'),
        (
            '<tool_call>\n{"name": "divide", "arguments": {}}\n</tool_call>',
            "unknown_tool",
            "no tool named 'divide'",
        ),
        ('<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n', "unclosed_tag", "never closed"),
        (ADD_CALL + "\nDone, I think.", "text_after_call", "text after the last"),
        (
            '<tool_call>\n{"name": "add", "arguments": "a=1"}\n</tool_call>',
            "bad_arguments",
            "must be a JSON object",
        ),
        ('{"name": "add"}\n</tool_call>', "unmatched_tag", "without a matching"),
    ],
)
def test_malformed_call_keeps_tokens_and_answers_with_an_error(qwen_tokenizer, say, call, kind, says):
    trajectory = rollout(qwen_tokenizer, [say(call), say("Answer: 3")])
    assert trajectory.termination is TerminationReason.COMPLETED
    first_turn = next(s for s in trajectory.segments if s.role == "assistant")
    assert first_turn.parse_errors == [kind]
    # the generated tokens stay exactly as generated
    assert trajectory.token_ids[first_turn.start : first_turn.end] == say(call)
    # the model read an error tool result that says what was wrong, and no tool ran
    error = next(m for m in trajectory.messages if m["role"] == "tool")
    assert error.get("error") is True and says in error["content"]
    assert trajectory.metrics["tool_calls"] == 0 and trajectory.metrics["parse_errors"] == 1
    assert qwen_tokenizer.decode(trajectory.token_ids).count(error["content"]) == 1


def test_a_bad_call_does_not_stop_a_good_call_in_the_same_turn(qwen_tokenizer, say):
    bad = '<tool_call>\n{"name": "nope", "arguments": {}}\n</tool_call>'
    trajectory = rollout(qwen_tokenizer, [say(ADD_CALL + "\n" + bad), say("Answer: 3")])
    results = [m for m in trajectory.messages if m["role"] == "tool"]
    assert results[0]["content"] == "3"
    assert results[1]["error"] and "no tool named 'nope'" in results[1]["content"]
    assert trajectory.metrics["tool_calls"] == 1 and trajectory.metrics["parse_errors"] == 1


def test_think_emitted_by_the_model_is_split_from_the_call(qwen_tokenizer, say):
    text = "<think>\nI should add.\n</think>\n\n" + ADD_CALL
    trajectory = rollout(qwen_tokenizer, [say(text), say("Answer: 3")])
    assistant = trajectory.messages[2]
    assert assistant["reasoning_content"] == "I should add."
    assert assistant["tool_calls"][0]["function"]["arguments"] == {"a": 1, "b": 2}
    assert trajectory.messages[3]["content"] == "3"


def test_think_opened_by_the_generation_prompt(qwen_tokenizer, say):
    template = get_template("qwen3", thinking="open")
    # the prompt ends with "<think>\n": the model continues its reasoning and closes it
    trajectory = rollout(
        qwen_tokenizer,
        [say("add them\n</think>\n\n" + ADD_CALL), say("ok\n</think>\n\nAnswer: 3")],
        template=template,
    )
    assert qwen_tokenizer.decode(trajectory.token_ids[: trajectory.prompt_length]).endswith("<think>\n")
    assert trajectory.messages[2]["reasoning_content"] == "add them"
    assert trajectory.messages[-1]["content"] == "Answer: 3"
    assert trajectory.final_text == "Answer: 3"
    # ending inside an unclosed think is reported, not a crash
    unclosed = rollout(qwen_tokenizer, [say("still thinking")], template=template)
    assert unclosed.segments[-1].parse_errors == ["unclosed_think"]
    assert unclosed.termination is TerminationReason.COMPLETED and unclosed.final_text == ""


def test_qwen3_coder_xml_calls_are_typed_by_the_schema(qwen_tokenizer, say):
    xml = (
        "<tool_call>\n<function=add>\n<parameter=a>\n4\n</parameter>\n"
        "<parameter=b>\n5\n</parameter>\n</function>\n</tool_call>"
    )
    trajectory = rollout(qwen_tokenizer, [say(xml), say("Answer: 9")], parser="qwen3_coder")
    assert trajectory.messages[2]["tool_calls"][0]["function"]["arguments"] == {"a": 4, "b": 5}
    assert trajectory.messages[3]["content"] == "9"


# --- limits ---------------------------------------------------------------------------------------


def test_max_turns_stops_after_the_last_turns_tools_ran(qwen_tokenizer, say):
    engine = ScriptedEngine([say(ADD_CALL)], cycle=True)
    trajectory = rollout(qwen_tokenizer, engine, limits=RolloutLimits(max_turns=3))
    assert trajectory.termination is TerminationReason.MAX_TURNS
    assert trajectory.metrics["turns"] == 3 == engine.calls
    assert [m["role"] for m in trajectory.messages].count("tool") == 3  # the third turn's call ran too


def test_max_tool_calls_runs_none_of_the_turn_that_would_exceed_it(qwen_tokenizer, say):
    two_calls = say(ADD_CALL + "\n" + ADD_CALL)
    engine = ScriptedEngine([say(ADD_CALL), two_calls, say("Answer: 3")])
    trajectory = rollout(qwen_tokenizer, engine, limits=RolloutLimits(max_tool_calls=2))
    assert trajectory.termination is TerminationReason.MAX_TOOL_CALLS
    assert trajectory.metrics["tool_calls"] == 1 and engine.calls == 2
    assert trajectory.segments[-1].role == "assistant"  # ends at a message boundary, on the model's turn
    assert trajectory.token_ids[-len(two_calls) :] == two_calls


def test_max_new_tokens_per_turn(qwen_tokenizer, say):
    trajectory = rollout(qwen_tokenizer, [say(ADD_CALL)], limits=RolloutLimits(max_new_tokens=5))
    assert trajectory.termination is TerminationReason.MAX_TOKENS
    assert trajectory.generated_tokens == 5 and trajectory.metrics["tool_calls"] == 0
    assert trajectory.segments[-1].finish_reason == "length"


def test_context_full_before_and_during_a_turn(qwen_tokenizer, say):
    full = rollout(qwen_tokenizer, [say(ADD_CALL)] * 3, limits=RolloutLimits(max_total_tokens=100))
    assert full.termination is TerminationReason.CONTEXT_FULL and full.generated_tokens == 0
    first = rollout(qwen_tokenizer, [say(ADD_CALL)], limits=RolloutLimits(max_turns=1))
    budget = first.prompt_length + 10  # room for 10 new tokens: the turn is clamped
    clamped = rollout(qwen_tokenizer, [say(ADD_CALL)], limits=RolloutLimits(max_total_tokens=budget))
    assert clamped.termination is TerminationReason.CONTEXT_FULL
    assert len(clamped.token_ids) == budget and clamped.generated_tokens == 10
    later = rollout(
        qwen_tokenizer,
        ScriptedEngine([say(ADD_CALL)], cycle=True),
        limits=RolloutLimits(max_total_tokens=first.prompt_length + 120, max_turns=50),
    )
    assert later.termination is TerminationReason.CONTEXT_FULL and later.metrics["turns"] >= 2


def test_response_budget_ends_cleanly(qwen_tokenizer, say):
    engine = ScriptedEngine([say(ADD_CALL)], cycle=True)
    trajectory = rollout(qwen_tokenizer, engine, limits=RolloutLimits(max_response_tokens=100, max_turns=50))
    assert trajectory.termination is TerminationReason.CONTEXT_FULL
    assert len(trajectory.token_ids) - trajectory.prompt_length <= 100
    assert trajectory.metrics["turns"] >= 2


class SlowEngine(ScriptedEngine):
    async def generate(self, prompt_ids, sampling, *, max_new_tokens) -> Generation:
        if self.calls >= 2:
            await asyncio.sleep(30)
        return await super().generate(prompt_ids, sampling, max_new_tokens=max_new_tokens)


def test_timeout_keeps_completed_turns(qwen_tokenizer, say):
    engine = SlowEngine([say(ADD_CALL)], cycle=True)
    trajectory = rollout(qwen_tokenizer, engine, limits=RolloutLimits(timeout_s=1.0))
    assert trajectory.termination is TerminationReason.TIMEOUT
    assert trajectory.metrics["turns"] == 2 and trajectory.metrics["tool_calls"] == 2
    assert sum(trajectory.loss_mask) == 2 * len(say(ADD_CALL))


class StalledEngine(ScriptedEngine):
    """An engine that never answers (an overloaded server or machine)."""

    async def generate(self, prompt_ids, sampling, *, max_new_tokens) -> Generation:
        await asyncio.sleep(30)
        raise AssertionError("unreachable: the rollout's timeout ends the wait")


def test_a_timeout_before_the_engine_answered_once_is_the_engines_failure_not_the_policys(
    qwen_tokenizer, say
):
    trajectory = rollout(qwen_tokenizer, StalledEngine([say(ADD_CALL)]), limits=RolloutLimits(timeout_s=0.5))
    assert trajectory.termination is TerminationReason.ENGINE_TIMEOUT
    assert trajectory.termination.failed and not trajectory.termination.trainable
    assert "before the engine answered once" in trajectory.termination_detail
    assert "raise --timeout or lower --concurrency" in trajectory.termination_detail
    assert trajectory.generated_tokens == 0


def test_engine_error_keeps_completed_turns(qwen_tokenizer, say):
    def script(prompt, index):
        if index == 1:
            raise EngineError("server unreachable")
        return say(ADD_CALL)

    trajectory = rollout(qwen_tokenizer, ScriptedEngine(script))
    assert trajectory.termination is TerminationReason.ENGINE_ERROR
    assert "server unreachable" in trajectory.termination_detail
    assert trajectory.metrics["turns"] == 1 and trajectory.generated_tokens == len(say(ADD_CALL))


def test_an_engine_context_error_is_context_full(qwen_tokenizer, say):
    from agentboost.errors import ContextLengthError

    def script(prompt, index):
        if index == 1:
            raise ContextLengthError("the server says the prompt is too long")
        return say(ADD_CALL)

    trajectory = rollout(qwen_tokenizer, ScriptedEngine(script))
    assert trajectory.termination is TerminationReason.CONTEXT_FULL
    assert trajectory.metrics["turns"] == 1


def test_a_template_that_is_not_prefix_preserving_is_refused(qwen_tokenizer, say):
    """Like Qwen3's own template: the last assistant turn opens with an empty think block that a later
    rendering drops once the turn is no longer last."""
    source = get_template("qwen3").source.replace(
        '{{ message.content or "" }}',
        '{% if loop.last %}<think>\n\n</think>\n\n{% endif %}{{ message.content or "" }}',
    )
    template = ChatTemplate("drops-context", source, {"thinking": "none"})
    trajectory = rollout(qwen_tokenizer, [say(ADD_CALL), say("Answer: 3")], template=template)
    assert trajectory.termination is TerminationReason.TEMPLATE_ERROR
    assert (
        "drops-context" in trajectory.termination_detail
        and "prefix-preserving" in trajectory.termination_detail
    )
    assert trajectory.metrics["turns"] == 1  # the first turn is kept


def test_a_thousand_turn_rollout_finishes_cleanly(qwen_tokenizer, say):
    engine = ScriptedEngine([say(ADD_CALL)], cycle=True)
    trajectory = rollout(qwen_tokenizer, engine, limits=RolloutLimits(max_turns=1000))
    assert trajectory.termination is TerminationReason.MAX_TURNS
    assert trajectory.metrics["turns"] == 1000 and trajectory.metrics["tool_calls"] == 1000
    assert sum(1 for s in trajectory.segments if s.role == "assistant") == 1000


@pytest.mark.parametrize(
    ("limits", "script", "reason"),
    [
        (RolloutLimits(max_turns=2), [ADD_CALL], TerminationReason.MAX_TURNS),
        (RolloutLimits(max_tool_calls=1), [ADD_CALL + "\n" + ADD_CALL], TerminationReason.MAX_TOOL_CALLS),
        (RolloutLimits(max_response_tokens=60, max_turns=50), [ADD_CALL], TerminationReason.CONTEXT_FULL),
    ],
)
def test_limits_stop_the_sdk_cleanly_without_errors_or_invented_text(
    qwen_tokenizer, say, caplog, limits, script, reason
):
    """Limits stop the agent through its hooks: the SDK logs no failure, and its own history holds only
    what the model generated and what the tools answered (no 'cancelled' or 'turn ended' text)."""
    strands_messages: list = []
    engine = ScriptedEngine([say(text) for text in script], cycle=True)
    with caplog.at_level("WARNING"):
        trajectory = run(
            run_agent(
                engine,
                qwen_tokenizer,
                QUESTION,
                system_prompt=SYSTEM,
                tools=[add, multiply],
                template="qwen3",
                limits=limits,
                strands_messages=strands_messages,
            )
        )
    assert trajectory.termination is reason
    assert not [r for r in caplog.records if r.name.startswith("strands") and r.levelname == "ERROR"]
    generated = [qwen_tokenizer.decode(say(text)[:-1]).strip() for text in script]
    for message in strands_messages:
        if message["role"] == "assistant":
            for block in message["content"]:
                if "text" in block:  # what the model wrote, or the start of it for a turn cut short
                    assert any(full.startswith(block["text"].strip()) for full in generated), block
    assert trajectory.segments[-1].role in ("assistant", "tool")
