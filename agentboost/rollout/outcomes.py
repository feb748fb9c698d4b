"""The reward summary's old home: it lives in :mod:`agentboost.outcomes` (below environments, runner
and evaluator); these names keep working from here."""

from agentboost.outcomes import MEAN_REWARD_DEFINITION, RewardSummary, reward_summary

__all__ = ["MEAN_REWARD_DEFINITION", "RewardSummary", "reward_summary"]
