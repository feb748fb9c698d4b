"""Token exactness of real multi-turn tool-calling rollouts on the embedded engine."""

from __future__ import annotations

import torch
from conftest import QUESTION, SYSTEM, add, multiply, run
from exactness_support import RecordingEngine, check_exactness, teacher_forced_logprobs
from transformers import AutoModelForCausalLM

from agentboost.agent.episode import run_agent
from agentboost.agent.limits import RolloutLimits
from agentboost.engines.base import SamplingParams
from agentboost.engines.embedded.engine import LocalEngine
from agentboost.engines.scripted import ScriptedEngine
from agentboost.tokens.templates import get_template
from agentboost.tokens.trajectory import TerminationReason


def rollout(model_dir, tokenizer, sampling):
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    engine = RecordingEngine(LocalEngine(model))
    trajectory = run(
        run_agent(
            engine,
            tokenizer,
            QUESTION,
            system_prompt=SYSTEM,
            tools=[add, multiply],
            template="qwen3",
            sampling=sampling,
            limits=RolloutLimits(max_turns=8, max_new_tokens=64),
        )
    )
    return model, engine, trajectory


def test_greedy_tool_rollout_is_token_exact(memorized_qwen3, qwen_tokenizer, scripted_trajectory):
    model, engine, trajectory = rollout(memorized_qwen3, qwen_tokenizer, SamplingParams(temperature=0))
    assert trajectory.termination is TerminationReason.COMPLETED
    assert trajectory.metrics["tool_calls"] == 2 and trajectory.metrics["parse_errors"] == 0
    # the model really called the tools and read their results
    tool_results = [m["content"] for m in trajectory.messages if m["role"] == "tool"]
    assert tool_results == ["42", "84"]
    assert trajectory.token_ids == scripted_trajectory.token_ids
    check_exactness(model, engine, trajectory, temperature=0)


def test_sampled_rollout_logprobs_match_teacher_forcing_at_temperature(memorized_qwen3, qwen_tokenizer):
    sampling = SamplingParams(temperature=0.7, top_p=0.95, top_k=50, seed=11)
    model, engine, trajectory = rollout(memorized_qwen3, qwen_tokenizer, sampling)
    check_exactness(model, engine, trajectory, temperature=0.7)
    # the tempered numbers differ from untempered ones: the convention is really applied
    untempered = teacher_forced_logprobs(model, trajectory.token_ids, 1.0)
    first = next(i for i, bit in enumerate(trajectory.loss_mask) if bit)
    assert abs(trajectory.logprobs[first] - float(untempered[first - 1])) > 1e-3


def test_decoded_ids_reproduce_the_template_rendering(scripted_trajectory, qwen_tokenizer):
    template = get_template("qwen3")
    tools = [{"type": "function", "function": spec} for spec in _openai_specs()]
    rendered = template.render(scripted_trajectory.messages, tools)
    decoded = qwen_tokenizer.decode(scripted_trajectory.token_ids)
    # the template closes the final turn with a newline the model never generates
    assert rendered == decoded + "\n"


def test_model_tokens_that_differ_from_a_rerendering_are_kept(qwen_tokenizer, say):
    """The model writes compact JSON; a re-rendering would re-serialise it. We keep the model's tokens."""
    compact = '<tool_call>\n{"name":"add","arguments":{"a":12,"b":30}}\n</tool_call>'
    engine = ScriptedEngine([say(compact), say("Answer: 42")])
    trajectory = run(
        run_agent(
            engine, qwen_tokenizer, QUESTION, system_prompt=SYSTEM, tools=[add, multiply], template="qwen3"
        )
    )
    decoded = qwen_tokenizer.decode(trajectory.token_ids)
    tools = [{"type": "function", "function": spec} for spec in _openai_specs()]
    rendered = get_template("qwen3").render(trajectory.messages, tools)
    assert compact in decoded and compact not in rendered
    canonical = '<tool_call>\n{"name": "add", "arguments": {"a": 12, "b": 30}}\n</tool_call>'
    assert rendered == decoded.replace(compact, canonical) + "\n"
    assert trajectory.messages[2]["raw"].startswith(compact)


def _openai_specs():
    from agentboost.tokens.templates import tool_specs_to_openai

    return [tool["function"] for tool in tool_specs_to_openai([add.tool_spec, multiply.tool_spec])]
