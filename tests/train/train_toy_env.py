"""A toy task a tiny random model learns in seconds: reward 1 when the reply's first token is a given id.

With the tiny Qwen3 of the trainer tests and the line-break token as the target, an untrained model
starts its reply that way about 14% of the time (its tied embeddings make it echo the prompt's last
token, a line break); a policy that learned the task does it nearly always. The reward reads the
Trajectory's token ids, never its text.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from agentboost.agent.limits import RolloutLimits
from agentboost.envs.base import Environment, Episode, Task
from agentboost.tokens.trajectory import Trajectory

TOPICS = ["rain", "bread", "chess", "rivers", "owls", "glass", "maps", "tea", "bees", "clocks", "snow", "ink"]


def save_toy_model(directory: Path, tokenizer) -> Path:
    """A tiny random Qwen3 saved with the real Qwen3 vocabulary, loaded by path like any model.

    Its (tied) embeddings are scaled up 9x so that, like a trained model and unlike a freshly
    initialised one, it prefers some tokens: it echoes the prompt's last token, a line break, with
    probability ~0.14, instead of spreading its mass evenly over 151k tokens.
    """
    from conftest import tiny_qwen3  # here: the CLI subprocesses that load this module need no model

    model = tiny_qwen3(seed=0, hidden=64)
    with torch.no_grad():
        model.get_input_embeddings().weight.mul_(9.0)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


class FirstToken(Environment):
    name = "first-token"
    system_prompt = "Reply with one word."
    template = "qwen3"
    limits = RolloutLimits(max_turns=1, max_new_tokens=1)

    def __init__(self, target_id: int) -> None:
        self.target_id = target_id

    def tasks(self, n: int | None = None, *, seed: int = 0, split: str = "train") -> list[Task]:
        start = 0 if split == "train" else 500
        count = 16 if n is None else n
        return [
            Task(
                f"{split}-{seed}-{index}",
                f"Name something about {TOPICS[index % len(TOPICS)]} {start + index}.",
            )
            for index in range(count)
        ]

    def reward(self, trajectory: Trajectory, episode: Episode) -> float:
        return float(trajectory.token_ids[trajectory.prompt_length] == self.target_id)


class SimulatedKill(BaseException):
    """Stands in for SIGKILL in the middle of a step: nothing after it runs (not an Exception, so the
    environment's reward guard does not catch it)."""


class KilledAfter(FirstToken):
    """Dies on the ``calls``-th reward, i.e. in the middle of some step's collection. Without ``calls``:
    on the ``TOY_KILL_AFTER_REWARDS``-th, or never when that is unset (so a command run killed and one
    resuming it name the same environment settings)."""

    def __init__(self, target_id: int, calls: int | None = None) -> None:
        super().__init__(target_id)
        self.calls_left = calls if calls is not None else int(os.environ.get("TOY_KILL_AFTER_REWARDS", "0"))

    def reward(self, trajectory: Trajectory, episode: Episode) -> float:
        self.calls_left -= 1
        if self.calls_left == 0:
            raise SimulatedKill()
        return super().reward(trajectory, episode)


class BrokenRewards(FirstToken):
    """FirstToken whose reward raises (an environment bug) on sample 0 of ``buggy`` tasks and whose
    judge is down (UnscorableError) on sample 1 of ``down`` tasks."""

    def __init__(self, target_id: int, *, buggy: set[str], down: set[str]) -> None:
        super().__init__(target_id)
        self.buggy, self.down = buggy, down

    def reward(self, trajectory: Trajectory, episode: Episode) -> float:
        from agentboost.errors import UnscorableError

        if episode.sample == 0 and episode.task.id in self.buggy:
            raise KeyError("a bug in the reward")
        if episode.sample == 1 and episode.task.id in self.down:
            raise UnscorableError("the judge is down")
        return super().reward(trajectory, episode)


class LongReply(FirstToken):
    """FirstToken with replies of up to 192 tokens (a random tiny model rarely stops early), so each
    phase of a step lasts long enough to be interrupted in."""

    limits = RolloutLimits(max_turns=1, max_new_tokens=192)
