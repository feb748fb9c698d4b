"""``agentboost view``: one self-contained HTML file to inspect rollout results in a browser.

The page needs no server and no network. Data travels as JSON inside ``<script type="application/json">``
elements with every ``<``, ``>``, ``&`` and line separator escaped, so nothing a model wrote can close
the element or become markup; the page's script builds everything with ``textContent``, never
``innerHTML``. The list is paginated and each rollout's details are parsed only when opened, so
thousands of rollouts stay responsive.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from agentboost.envs.base import RolloutResult
from agentboost.eval.stats import tool_results, tool_usage_stats
from agentboost.tokens.tokenizer import Tokenizer
from agentboost.tokens.trajectory import Trajectory

_ASSETS = Path(__file__).parent


def embed_json(value: Any) -> str:
    """JSON text safe inside any HTML element: no ``<``, ``>``, ``&`` or JS line separators remain."""
    text = json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    return (
        text.replace("&", "\\u0026")
        .replace("<", "\\u003c")
        .replace(">", "\\u003e")
        .replace("\u2028", "\\u2028")
        .replace("\u2029", "\\u2029")
    )


def _finite(value: float | None) -> float | None:
    if value is None or value != value or value in (float("inf"), float("-inf")):
        return None
    return value


def _logprob(value: float | None) -> float | None:
    """Rounded for size; -inf (an impossible token) becomes -1000 so the JSON stays standard."""
    if value is None:
        return None
    finite = _finite(value)
    return round(finite, 4) if finite is not None else -1000.0


def _row(index: int, result: RolloutResult) -> dict[str, Any]:
    trajectory = result.trajectory
    metrics = trajectory.metrics
    facts = tool_results(result)
    return {
        "i": index,
        "task": result.task_id,
        "sample": result.sample,
        "reward": _finite(result.reward),
        "end": result.termination.value,
        "turns": int(metrics.get("turns") or 0),
        "calls": int(metrics.get("tool_calls") or 0),
        "perr": int(metrics.get("parse_errors") or 0),
        "gen": trajectory.generated_tokens,
        "drift": len(trajectory.info.get("gateway", {}).get("drift", ())),
        "tools": sorted({f"{fact['name']}:{fact['status']}" for fact in facts if fact["name"] is not None}),
    }


def _tokens(trajectory: Trajectory) -> dict[str, Any]:
    """One training row as the page shows it: messages, ids, mask, logprobs, segments."""
    return {
        "messages": trajectory.messages,
        "ids": trajectory.token_ids,
        "mask": trajectory.loss_mask,
        "lp": [_logprob(value) for value in trajectory.logprobs],
        "segments": [
            [s.role, s.start, s.end, s.turn, s.finish_reason, list(s.parse_errors)]
            for s in trajectory.segments
        ],
    }


def _detail(result: RolloutResult) -> dict[str, Any]:
    trajectory = result.trajectory
    gateway = trajectory.info.get("gateway") or {}
    return {
        **_tokens(trajectory),
        "forked": [_tokens(row) for row in trajectory.forked_rows],
        "drift": gateway.get("drift", []),
        "detail": trajectory.termination_detail,
        "breakdown": result.reward_breakdown,
        "reward_info": getattr(result, "reward_info", None) or {},
        "reward_error": result.reward_error,
        "metrics": trajectory.metrics,
        "info": trajectory.info,
    }


def token_pieces(tokenizer: Tokenizer, ids: Iterable[int]) -> dict[str, str]:
    """The text of each distinct token id, decoded on its own (partial UTF-8 shows as U+FFFD)."""
    return {str(token): tokenizer.decode([token]) for token in sorted(set(ids))}


def build_page(
    results: Sequence[RolloutResult],
    *,
    tokenizer: Tokenizer | None = None,
    threshold: float = 1.0,
    title: str = "agentboost rollouts",
) -> str:
    """The whole HTML page for ``results``."""
    stats = tool_usage_stats(results, threshold=threshold)
    vocab = (
        token_pieces(
            tokenizer,
            (token for r in results for row in r.trajectory.training_rows for token in row.token_ids),
        )
        if tokenizer
        else {}
    )
    summary = {
        "title": title,
        "threshold": threshold,
        "rows": [_row(index, result) for index, result in enumerate(results)],
        "stats": stats.to_dict(),
        "summary_line": stats.to_markdown().split("\n")[2],
        "vocab": vocab,
    }
    details = "\n".join(_data_element(f"r{index}", _detail(result)) for index, result in enumerate(results))
    template = (_ASSETS / "page.html").read_text(encoding="utf-8")
    return (
        template.replace("/*STYLE*/", (_ASSETS / "page.css").read_text(encoding="utf-8"))
        .replace("/*SCRIPT*/", (_ASSETS / "page.js").read_text(encoding="utf-8"))
        .replace("<!--TITLE-->", _escape_text(title))
        .replace(
            "<!--DATA-->", f'<script type="application/json" id="summary">{embed_json(summary)}</script>'
        )
        .replace("<!--DETAILS-->", details)
    )


def _data_element(element_id: str, value: Any) -> str:
    return f'<script type="application/json" id="{element_id}">{embed_json(value)}</script>'


def _escape_text(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;")


def _load_tokenizer(name: str | None, results: Sequence[RolloutResult]) -> Any:
    if name is None:
        models = {r.trajectory.info.get("model") for r in results if r.trajectory.info.get("model")}
        if len(models) != 1:
            return None
        name = str(models.pop())
    from agentboost.models.tokenizers import load_tokenizer

    return load_tokenizer(name)


def write_report(
    paths: Sequence[str | os.PathLike[str]],
    out: str | os.PathLike[str],
    *,
    tokenizer: Tokenizer | None = None,
    threshold: float = 1.0,
    title: str | None = None,
) -> int:
    """Read results files, write the page to ``out``; returns the number of rollouts.

    ``tokenizer``: a tokenizer object, or a model id / directory to load one from; None uses the
    results' recorded model when there is exactly one, else the token view shows ids.
    """
    from agentboost.rollout.results import read_results

    results = [result for path in paths for result in read_results(path)]
    if tokenizer is None or isinstance(tokenizer, str):
        tokenizer = _load_tokenizer(tokenizer, results)
    page = build_page(
        results,
        tokenizer=tokenizer,
        threshold=threshold,
        title=title or ", ".join(Path(path).name for path in paths),
    )
    target = Path(out)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(page, encoding="utf-8")
    return len(results)
