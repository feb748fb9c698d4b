"""Evaluation: pass@k / pass^k over rollout results, tool-usage statistics, reports and comparisons.

``agentboost eval`` / ``stats`` run these from the command line (docs/evaluation.md).
"""

from agentboost.eval.passk import pass_at_k, pass_hat_k, pass_table, task_counts
from agentboost.eval.stats import Stats, Table, tool_usage_stats

__all__ = ["Stats", "Table", "pass_at_k", "pass_hat_k", "pass_table", "task_counts", "tool_usage_stats"]
