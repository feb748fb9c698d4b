"""pass@k and pass^k from per-task sample counts (formulas and sources in docs/evaluation.md).

For a task with ``n`` scored samples of which ``c`` succeeded:

- pass@k = 1 - C(n - c, k) / C(n, k): the unbiased estimate of "at least one of k samples succeeds"
  (Chen et al., 2021), averaged over tasks;
- pass^k = C(c, k) / C(n, k): the unbiased estimate of "all k of k samples succeed" (tau-bench's
  consistency measure), averaged over tasks.

Both need k <= n; a task with fewer scored samples than k is left out of that k (the report says
how many tasks each k averages over). Unscored samples (no reward) are not samples here at all.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from math import comb

from agentboost.errors import ConfigError


def _check(n: int, c: int, k: int) -> None:
    if not 0 <= c <= n:
        raise ConfigError(f"need 0 <= correct <= samples, got correct={c}, samples={n}")
    if not 1 <= k <= n:
        raise ConfigError(f"k must be between 1 and the number of samples ({n}), got {k}")


def pass_at_k(n: int, c: int, k: int) -> float:
    """Probability that at least one of k samples drawn without replacement from n succeeds."""
    _check(n, c, k)
    return 1.0 - comb(n - c, k) / comb(n, k)


def pass_hat_k(n: int, c: int, k: int) -> float:
    """Probability that all k samples drawn without replacement from n succeed."""
    _check(n, c, k)
    return comb(c, k) / comb(n, k)


def task_counts(outcomes: Iterable[tuple[str, float | None]], threshold: float) -> dict[str, tuple[int, int]]:
    """(task_id, reward) pairs -> {task_id: (scored samples, successes)}; None rewards are skipped."""
    counts: dict[str, list[int]] = {}
    for task_id, reward in outcomes:
        entry = counts.setdefault(task_id, [0, 0])
        if reward is None:
            continue
        entry[0] += 1
        entry[1] += int(reward >= threshold)
    return {task_id: (n, c) for task_id, (n, c) in counts.items()}


def pass_table(counts: Mapping[str, tuple[int, int]], max_k: int) -> dict[str, dict[int, float | int | None]]:
    """pass@k, pass^k and the number of tasks averaged, for k = 1..max_k."""
    table: dict[str, dict[int, float | int | None]] = {"pass@k": {}, "pass^k": {}, "tasks": {}}
    for k in range(1, max_k + 1):
        usable = [(n, c) for n, c in counts.values() if n >= k]
        table["tasks"][k] = len(usable)
        table["pass@k"][k] = sum(pass_at_k(n, c, k) for n, c in usable) / len(usable) if usable else None
        table["pass^k"][k] = sum(pass_hat_k(n, c, k) for n, c in usable) / len(usable) if usable else None
    return table
