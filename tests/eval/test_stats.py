"""Statistics tables equal hand counts on a hand-built fixture; `agentboost stats` writes them."""

from __future__ import annotations

import json

import pytest
from results_support import coding_fixture, scripted_results

from agentboost.cli import main
from agentboost.eval.stats import tool_usage_stats
from agentboost.rollout.results import ResultStore


def rows(stats, name):
    return stats.table(name).rows


def test_generic_tables_equal_hand_counts():
    stats = tool_usage_stats(coding_fixture())
    summary = stats.summary
    assert (summary["rollouts"], summary["tasks"], summary["scored"], summary["unscored"]) == (6, 3, 5, 1)
    assert (summary["unscorable"], summary["failed"], summary["failures"]) == (0, 1, {"engine_error": 1})
    assert summary["coverage"] == pytest.approx(5 / 6)
    assert summary["mean_reward"] == pytest.approx(0.4)
    assert summary["success_rate"] == pytest.approx(0.4)
    assert summary["parse_errors_total"] == 3 and summary["rollouts_with_parse_errors"] == 2
    assert summary["tool_calls_total"] == 8
    assert rows(stats, "terminations") == [
        ["completed", 4, 4 / 6, 0.5, 0.5, 1.0],
        ["engine_error", 1, 1 / 6, None, None, 0.0],  # failed: no reward, not a zero
        ["max_turns", 1, 1 / 6, 0.0, 0.0, 1.0],
    ]
    assert rows(stats, "tools") == [
        ["run_tests", 6, 1, 1 / 6, 3, 1.0],
        ["read_file", 2, 1, 0.5, 2, None],
    ]
    assert rows(stats, "tool_status") == [
        ["run_tests", "passed", 2, 2 / 6],
        ["run_tests", "compile_error", 1, 1 / 6],
        ["run_tests", "runtime_error", 1, 1 / 6],
        ["run_tests", "timeout", 1, 1 / 6],
        ["run_tests", "wrong_output", 1, 1 / 6],
        ["read_file", "error", 1, 0.5],
        ["read_file", "ok", 1, 0.5],
    ]
    assert rows(stats, "calls_per_rollout") == [
        ["0", 2, 2 / 6, 0.0, 0.0, 0.5],
        ["1", 2, 2 / 6, 0.0, 0.0, 1.0],
        ["2", 1, 1 / 6, 1.0, 1.0, 1.0],
        ["3", 0, 0.0, None, None, None],
        ["4", 1, 1 / 6, 1.0, 1.0, 1.0],
        ["5-9", 0, 0.0, None, None, None],
        ["10+", 0, 0.0, None, None, None],
    ]
    assert rows(stats, "parse_errors") == [["bad_json", 2, 2], ["unknown_tool", 1, 1]]


def test_coding_tables_equal_hand_counts():
    stats = tool_usage_stats(coding_fixture())
    assert rows(stats, "coding_submissions") == [
        ["no submission", 1, 0.2, 0.0, 0.0, 1.0],
        ["submitted without testing", 2, 0.4, 0.0, 0.0, 1.0],
        ["submitted after testing", 2, 0.4, 1.0, 1.0, 1.0],
    ]
    assert stats.summary["coding"]["test_tools"] == ["run_tests"]  # the tool that records a status
    assert rows(stats, "coding_test_calls") == [
        ["passed", 2, 2 / 6],
        ["compile_error", 1, 1 / 6],
        ["runtime_error", 1, 1 / 6],
        ["timeout", 1, 1 / 6],
        ["wrong_output", 1, 1 / 6],
    ]
    assert rows(stats, "coding_test_calls_per_rollout")[:4] == [
        ["0", 2, 0.4, 0.0, 0.0, 1.0],
        ["1", 1, 0.2, 0.0, 0.0, 1.0],
        ["2", 1, 0.2, 1.0, 1.0, 1.0],
        ["3", 1, 0.2, 1.0, 1.0, 1.0],
    ]
    assert rows(stats, "coding_first_failure") == [
        ["none (all passed)", 2, 0.5],
        ["runtime_error", 1, 0.25],
        ["wrong_output", 1, 0.25],
    ]
    assert stats.table("coding_first_failure").note == "hidden tests passed: 10 of 17 (58.8%)"
    # an explicit test tool overrides the guess
    assert tool_usage_stats(coding_fixture(), test_tool="read_file").table("coding_test_calls").rows == [
        ["error", 1, 0.5],
        ["ok", 1, 0.5],
    ]


def test_environments_without_coding_fields_get_no_coding_section(qwen_tokenizer, tmp_path):
    path = scripted_results(qwen_tokenizer, tmp_path / "r.jsonl")
    from agentboost.rollout.results import read_results

    stats = tool_usage_stats(read_results(path))
    assert not any(table.name.startswith("coding") for table in stats.tables)
    # real rollouts: 2 adds and 2 multiplies ran; two malformed calls became parse errors
    assert rows(stats, "tools") == [["add", 2, 0, 0.0, 2, None], ["multiply", 2, 0, 0.0, 2, None]]
    assert rows(stats, "parse_errors") == [["invalid_json", 1, 1], ["unknown_tool", 1, 1]]
    assert stats.summary["unscored"] == 1 and stats.summary["scored"] == 5


def test_stats_command_prints_and_writes_markdown_and_json(tmp_path, capsys):
    path = tmp_path / "results.jsonl"
    with ResultStore(path) as store:
        for result in coding_fixture():
            store.write(result)
    out = tmp_path / "report" / "stats"
    assert main(["stats", str(path), "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    markdown = (tmp_path / "report" / "stats.md").read_text()
    assert markdown in printed
    assert "| submitted after testing | 2 | 0.400 | 1.000 | 1.000 |" in markdown
    assert "| engine_error | 1 | 0.167 | n/a | n/a |" in markdown
    data = json.loads((tmp_path / "report" / "stats.json").read_text())
    assert data["tables"]["coding_test_calls"]["rows"][0] == ["passed", 2, 2 / 6]
    assert data["summary"]["unscored"] == 1


def test_stats_plots_reward_by_step_from_several_files(qwen_tokenizer, tmp_path):
    import matplotlib.image

    first = scripted_results(qwen_tokenizer, tmp_path / "step_000001.jsonl")
    second = tmp_path / "step_000002.jsonl"
    with ResultStore(second) as store:
        for result in coding_fixture():
            store.write(result)
    out = tmp_path / "plots"
    assert main(["stats", str(first), str(second), "-o", str(tmp_path / "s"), "--plot", str(out)]) == 0
    data = json.loads((tmp_path / "s.json").read_text())
    assert data["summary"]["rollouts"] == 12  # both files pooled
    for name in ("reward_by_step.png", "tool_calls_per_rollout.png", "terminations.png"):
        image = matplotlib.image.imread(out / name)
        assert image.shape[0] > 100 and image.shape[1] > 100


def test_an_environment_supplies_its_own_report_tables():
    """The extension point: stats, eval and view add the tables the results' environment makes."""
    from agentboost.envs.base import Environment
    from agentboost.eval.stats import Table

    class Colours(Environment):
        name = "colours-for-stats"

        @classmethod
        def report_tables(cls, results, *, threshold, summary, test_tool=None):
            summary["colours"] = {"rollouts": len(results)}
            rows = [[result.task_id, result.reward] for result in results]
            return [Table("colour_rewards", "Reward per task", ["task", "reward"], rows, section="Colours")]

    results = coding_fixture()
    for result in results[:2]:
        result.trajectory.info = {"environment": Colours.name}
    stats = tool_usage_stats(results)
    assert rows(stats, "colour_rewards") == [[r.task_id, r.reward] for r in results[:2]]
    assert stats.summary["colours"] == {"rollouts": 2}
    assert sum(row[1] for row in rows(stats, "coding_submissions")) == 3  # the coding rollouts left
    markdown = stats.to_markdown()
    assert markdown.index("## Coding") < markdown.index("## Colours") < markdown.index("### Reward per task")


@pytest.mark.parametrize("xs", [[1], [7]])
def test_a_one_point_reward_curve_shows_the_point_on_a_whole_step_axis(xs):
    """One step (or one rollout) drew an x axis from -0.04 to 0.04 and no visible point."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from agentboost.eval.plots import draw_reward_curve

    figure, axes = plt.subplots()
    try:
        draw_reward_curve(axes, xs, [0.0])
        assert axes.get_xlim() == (xs[0] - 1, xs[0] + 1)
        assert axes.get_ylim() == pytest.approx((-0.05, 1.05))  # the reward range, not a zoom on 0
        assert [line.get_marker() for line in axes.get_lines()] == ["o"]  # a lone point is drawn
        figure.canvas.draw()
        ticks = [tick for tick in axes.get_xticks() if xs[0] - 1 <= tick <= xs[0] + 1]
        assert xs[0] in ticks and all(float(tick).is_integer() for tick in ticks)
    finally:
        plt.close(figure)


def test_a_curve_of_several_points_keeps_its_own_x_range():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from agentboost.eval.plots import draw_reward_curve

    figure, axes = plt.subplots()
    try:
        draw_reward_curve(axes, [2, 4, 6], [0.1, 0.5, 0.9])
        low, high = axes.get_xlim()
        assert low < 2 and high > 6 and high - low < 6  # matplotlib's margins, not one unit each side
    finally:
        plt.close(figure)
