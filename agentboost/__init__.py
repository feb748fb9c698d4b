"""agentboost: train tool-using Strands agents with reinforcement learning, token-exact.

What a user needs is importable from here: ``from agentboost import Environment, RunSpec,
run_rollouts``. Each name is imported on first use, so ``import agentboost`` stays light (no torch,
transformers or Strands until a name that needs them is touched).
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

from agentboost.lazy_names import lazy_getattr

try:
    __version__ = version("agentboost")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0+unknown"

_PUBLIC: dict[str, str] = {
    # writing an environment
    "Environment": "agentboost.envs.base",
    "Episode": "agentboost.envs.base",
    "Task": "agentboost.envs.task",
    "Reward": "agentboost.outcomes",
    "FailureRule": "agentboost.outcomes",
    "RewardFunction": "agentboost.envs.base",
    "UserTurn": "agentboost.agent.episode",
    "RolloutLimits": "agentboost.agent.limits",
    "register_environment": "agentboost.envs.registry",
    "make_environment": "agentboost.envs.registry",
    # running and reading rollouts
    "RunSpec": "agentboost.rollout.spec",
    "run_rollouts": "agentboost.rollout.run",
    "run_rollouts_async": "agentboost.rollout.run",
    "RunSummary": "agentboost.rollout.runner",
    "RolloutResult": "agentboost.outcomes",
    "read_results": "agentboost.rollout.results",
    "Trajectory": "agentboost.tokens.trajectory",
    "TerminationReason": "agentboost.tokens.trajectory",
    "SamplingParams": "agentboost.engines.base",
    "Tokenizer": "agentboost.tokens.tokenizer",
    "make_engine": "agentboost.engines.factory",
    "load_tokenizer": "agentboost.models.tokenizers",
    "run_agent": "agentboost.agent.episode",
    # evaluating
    "evaluate_run": "agentboost.eval.evaluate",
    "build_report": "agentboost.eval.evaluate",
    # training
    "TrainConfig": "agentboost.train.config",
    "Trainer": "agentboost.train.trainer",
    "SFTConfig": "agentboost.train.sft",
    "SFTTrainer": "agentboost.train.sft",
    # errors
    "AgentBoostError": "agentboost.errors",
    "ConfigError": "agentboost.errors",
}
"""Public name -> the module that defines it (imported when the name is first used)."""

__all__ = [
    "AgentBoostError",
    "ConfigError",
    "Environment",
    "Episode",
    "FailureRule",
    "Reward",
    "RewardFunction",
    "RolloutLimits",
    "RolloutResult",
    "RunSpec",
    "RunSummary",
    "SFTConfig",
    "SFTTrainer",
    "SamplingParams",
    "Task",
    "TerminationReason",
    "Tokenizer",
    "TrainConfig",
    "Trainer",
    "Trajectory",
    "UserTurn",
    "__version__",
    "build_report",
    "evaluate_run",
    "load_tokenizer",
    "make_engine",
    "make_environment",
    "read_results",
    "register_environment",
    "run_agent",
    "run_rollouts",
    "run_rollouts_async",
]
"""The public names (each in :data:`_PUBLIC`, with its module)."""


__getattr__ = lazy_getattr(__name__, _PUBLIC, globals())


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_PUBLIC))


TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (type checkers know the idiom)
if TYPE_CHECKING:  # what type checkers and editors see; at run time __getattr__ imports on demand
    from agentboost.agent.episode import UserTurn, run_agent
    from agentboost.agent.limits import RolloutLimits
    from agentboost.engines.base import SamplingParams
    from agentboost.engines.factory import make_engine
    from agentboost.envs.base import Environment, Episode, RewardFunction
    from agentboost.envs.registry import make_environment, register_environment
    from agentboost.envs.task import Task
    from agentboost.errors import AgentBoostError, ConfigError
    from agentboost.eval.evaluate import build_report, evaluate_run
    from agentboost.models.tokenizers import load_tokenizer
    from agentboost.outcomes import FailureRule, Reward, RolloutResult
    from agentboost.rollout.results import read_results
    from agentboost.rollout.run import run_rollouts, run_rollouts_async
    from agentboost.rollout.runner import RunSummary
    from agentboost.rollout.spec import RunSpec
    from agentboost.tokens.tokenizer import Tokenizer
    from agentboost.tokens.trajectory import TerminationReason, Trajectory
    from agentboost.train.config import TrainConfig
    from agentboost.train.sft import SFTConfig, SFTTrainer
    from agentboost.train.trainer import Trainer
