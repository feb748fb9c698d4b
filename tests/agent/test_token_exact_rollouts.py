"""Token exactness of real multi-turn tool-calling rollouts on the embedded engine."""

from __future__ import annotations

import torch
from conftest import QUESTION, SYSTEM, add, multiply, run
from transformers import AutoModelForCausalLM

from agentboost.agent.limits import RolloutLimits
from agentboost.agent.rollout import run_agent
from agentboost.engines.base import SamplingParams
from agentboost.engines.local import LocalEngine
from agentboost.engines.scripted import ScriptedEngine
from agentboost.tokens.templates import get_template
from agentboost.tokens.trajectory import TerminationReason


class RecordingEngine:
    """Delegates to an engine and keeps a copy of every prompt it was sent."""

    def __init__(self, engine):
        self.engine = engine
        self.prompts: list[list[int]] = []

    @property
    def context_length(self):
        return self.engine.context_length

    async def generate(self, prompt_ids, sampling):
        self.prompts.append(list(prompt_ids))
        return await self.engine.generate(prompt_ids, sampling)

    async def aclose(self):
        await self.engine.aclose()


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


def teacher_forced_logprobs(model, token_ids, temperature):
    """log_softmax(logits / T) of each token given all before it, from one forward pass."""
    with torch.no_grad():
        logits = model(torch.tensor([token_ids])).logits[0].float()
    scale = temperature or 1.0
    logprobs = torch.log_softmax(logits[:-1] / scale, dim=-1)
    return logprobs.gather(1, torch.tensor(token_ids[1:])[:, None])[:, 0]


def check_exactness(model, engine, trajectory, temperature):
    ids, mask, logprobs = trajectory.token_ids, trajectory.loss_mask, trajectory.logprobs
    # each turn's prompt is a prefix of the next turn's, and of the final sequence
    assert len(engine.prompts) == trajectory.metrics["turns"] >= 2
    for earlier, later in zip(engine.prompts, [*engine.prompts[1:], ids], strict=True):
        assert later[: len(earlier)] == earlier
    # the mask is 1 on exactly the generated tokens: the ids each turn added after its prompt
    generated_positions = []
    for prompt, following in zip(engine.prompts, [*engine.prompts[1:], ids], strict=True):
        assistant = next(s for s in trajectory.segments if s.role == "assistant" and s.start == len(prompt))
        generated_positions.extend(range(assistant.start, assistant.end))
        assert assistant.end <= len(following)
    assert [i for i, bit in enumerate(mask) if bit] == generated_positions
    assert all((value is None) == (bit == 0) for value, bit in zip(logprobs, mask, strict=False))
    # rollout logprobs equal a teacher-forced forward pass at the masked positions
    reference = teacher_forced_logprobs(model, ids, temperature)
    gaps = [abs(logprobs[i] - float(reference[i - 1])) for i in generated_positions]
    assert max(gaps) <= 1e-4


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
