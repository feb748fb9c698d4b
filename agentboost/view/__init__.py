"""A self-contained HTML report of rollout results (``agentboost view``)."""

from agentboost.view.html import build_page, embed_json, write_report

__all__ = ["build_page", "embed_json", "write_report"]
