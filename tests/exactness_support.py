"""Independent checks that a rollout is token-exact: shared by every test that produces rollouts."""

from __future__ import annotations

import torch

from agentboost.engines.base import OneBackend


class RecordingEngine(OneBackend):
    """Delegates to an engine and keeps a copy of every prompt it was sent (rollouts bind to the recorder
    itself, so every turn passes through it)."""

    def __init__(self, engine):
        self.engine = engine
        self.prompts: list[list[int]] = []

    @property
    def context_length(self):
        return self.engine.context_length

    async def generate(self, prompt_ids, sampling, *, max_new_tokens):
        self.prompts.append(list(prompt_ids))
        return await self.engine.generate(prompt_ids, sampling, max_new_tokens=max_new_tokens)

    async def aclose(self):
        await self.engine.aclose()


def teacher_forced_logprobs(model, token_ids, temperature):
    """log_softmax(logits / T) of each token given all before it, from one forward pass."""
    device = next(model.parameters()).device
    with torch.no_grad():
        logits = model(torch.tensor([token_ids], device=device)).logits[0].float()
    scale = temperature or 1.0
    logprobs = torch.log_softmax(logits[:-1] / scale, dim=-1)
    return logprobs.gather(1, torch.tensor(token_ids[1:], device=device)[:, None])[:, 0]


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
