"""DeepCoder-style coding: normalized tasks, dataset preparation, grading in the sandbox, the environment.

    from agentboost.envs.coding import CodingEnvironment   # imports Strands and the Environment API
    from agentboost.envs.coding.data import prepare_tasks   # dataset preparation only

See docs/coding.md for the task format, the submission rule and the reward.
"""

from typing import Any

from agentboost.envs.coding.task import TEST_TYPES, CodingTask

__all__ = ["TEST_TYPES", "CodingEnvironment", "CodingTask"]


def __getattr__(name: str) -> Any:
    if name == "CodingEnvironment":  # imported on use: data preparation needs neither Strands nor the SDK
        from agentboost.envs.coding.environment import CodingEnvironment

        return CodingEnvironment
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
