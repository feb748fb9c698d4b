"""pass@k and pass^k against hand-computed values, and the report's per-task averaging."""

from __future__ import annotations

from math import comb

import pytest

from agentboost.errors import ConfigError
from agentboost.eval.evaluate import build_report
from agentboost.eval.passk import pass_at_k, pass_hat_k, pass_table, task_counts


@pytest.mark.parametrize(
    ("n", "c", "k", "expected"),
    [
        (5, 2, 1, 0.4),  # 1 - 3/5
        (5, 2, 2, 0.7),  # 1 - C(3,2)/C(5,2) = 1 - 3/10
        (5, 2, 3, 0.9),  # 1 - 1/10
        (5, 2, 4, 1.0),  # k > n - c: every draw of 4 holds a success
        (5, 2, 5, 1.0),  # k = n
        (5, 0, 5, 0.0),
        (1, 1, 1, 1.0),
        (10, 1, 1, 0.1),
    ],
)
def test_pass_at_k_hand_values(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("n", "c", "k", "expected"),
    [
        (5, 2, 1, 0.4),
        (5, 2, 2, 0.1),  # C(2,2)/C(5,2)
        (5, 2, 3, 0.0),  # k > correct count: not all three can succeed
        (5, 5, 5, 1.0),  # k = n, all correct
        (5, 4, 5, 0.0),  # k = n, one failure
        (4, 3, 2, 0.5),  # C(3,2)/C(4,2) = 3/6
    ],
)
def test_pass_hat_k_hand_values(n, c, k, expected):
    assert pass_hat_k(n, c, k) == pytest.approx(expected)


def test_estimators_match_brute_force_over_all_subsets():
    from itertools import combinations

    outcomes = [1, 0, 1, 1, 0, 0, 1]
    n, c = len(outcomes), sum(outcomes)
    for k in range(1, n + 1):
        subsets = list(combinations(outcomes, k))
        assert len(subsets) == comb(n, k)
        assert pass_at_k(n, c, k) == pytest.approx(sum(any(s) for s in subsets) / len(subsets))
        assert pass_hat_k(n, c, k) == pytest.approx(sum(all(s) for s in subsets) / len(subsets))


def test_k_outside_one_to_n_is_an_error():
    with pytest.raises(ConfigError, match="between 1 and the number of samples"):
        pass_at_k(3, 1, 4)
    with pytest.raises(ConfigError):
        pass_hat_k(3, 1, 0)
    with pytest.raises(ConfigError, match="correct"):
        pass_at_k(3, 4, 1)


def test_unscored_samples_are_not_counted_as_wrong():
    outcomes = [("A", 1.0), ("A", 0.0), ("A", 1.0), ("A", 0.0)]
    outcomes += [("B", 0.0)] * 4
    outcomes += [("C", 1.0), ("C", 1.0), ("C", None), ("C", 1.0)]  # one unscored sample
    counts = task_counts(outcomes, threshold=1.0)
    assert counts == {"A": (4, 2), "B": (4, 0), "C": (3, 3)}
    table = pass_table(counts, 4)
    assert table["pass@k"][1] == pytest.approx((0.5 + 0 + 1) / 3)
    assert table["pass@k"][2] == pytest.approx((5 / 6 + 0 + 1) / 3)
    assert table["pass@k"][3] == pytest.approx((1 + 0 + 1) / 3)
    assert table["pass@k"][4] == pytest.approx((1 + 0) / 2)  # C has 3 scored samples: left out of k=4
    assert table["tasks"] == {1: 3, 2: 3, 3: 3, 4: 2}
    assert table["pass^k"][2] == pytest.approx((1 / 6 + 0 + 1) / 3)
    assert table["pass^k"][3] == pytest.approx((0 + 0 + 1) / 3)
    assert table["pass^k"][4] == 0.0


def test_threshold_decides_success_for_fractional_rewards():
    counts = task_counts([("A", 0.5), ("A", 1.0), ("A", 0.9)], threshold=0.9)
    assert counts == {"A": (3, 2)}


def test_report_from_hand_built_results():
    from results_support import coding_fixture

    report = build_report(coding_fixture(), samples=2)
    # a: rewards 1, 0 -> c=1 of 2; b: 0, 1 -> 1 of 2; c: None, 0 -> 0 of 1 (one unscored)
    assert report["pass@k"] == {"1": pytest.approx((0.5 + 0.5 + 0) / 3), "2": pytest.approx(1.0)}
    assert report["pass^k"] == {"1": pytest.approx(1 / 3), "2": 0.0}
    assert report["tasks_per_k"] == {"1": 3, "2": 2}
    assert report["unscored"] == 1 and report["scored"] == 5
    assert report["tools"]["run_tests"]["statuses"]["passed"] == 2
    assert report["terminations"] == {"completed": 4, "max_turns": 1, "engine_error": 1}
    # a/0, b/0, b/1 and c/1 call a tool; a/1 and c/0 do not
    assert report["tool_use_rate"] == pytest.approx(4 / 6)
    assert report["tools"]["run_tests"]["rollouts"] == 3


def test_comparison_reports_the_share_of_rollouts_calling_each_tool():
    from results_support import coding_fixture

    from agentboost.eval.evaluate import compare_metrics

    results = coding_fixture()
    before = build_report(results[:2], samples=2)  # task a: one rollout calls run_tests
    after = build_report(results, samples=2)
    metrics = {name: (left, right) for name, left, right in compare_metrics(before, after)}
    assert metrics["rollouts calling a tool (share)"] == (pytest.approx(0.5), pytest.approx(4 / 6))
    assert metrics["tool run_tests: rollouts calling it (share)"] == (pytest.approx(0.5), pytest.approx(0.5))
    # read_file and the engine_error ending appear only in B: a share of 0 in A, not a missing value
    assert metrics["tool read_file: rollouts calling it (share)"] == (0.0, pytest.approx(2 / 6))
    assert metrics["tool read_file: calls per rollout"] == (0.0, pytest.approx(2 / 6))
    assert metrics["tool read_file: error rate"][0] is None
    assert metrics["termination engine_error (share)"] == (0.0, pytest.approx(1 / 6))
