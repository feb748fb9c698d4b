"""Evaluation: pass@k / pass^k over rollout results, tool-usage statistics, and comparing reports."""
