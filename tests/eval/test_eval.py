"""agentboost eval end to end: the runner, resume, unscored samples, the CLI on a real model, compare."""

from __future__ import annotations

import json

import pytest
from conftest import run, tiny_qwen3
from results_support import GOOD, ToolEnvironment

from agentboost.cli import main
from agentboost.engines.base import SamplingParams
from agentboost.engines.scripted import ScriptedEngine
from agentboost.errors import UnscorableError
from agentboost.eval.evaluate import evaluate, load_report, summary_text


class FlakyGrader(ToolEnvironment):
    """The reward crashes on task test-1's wrong answers: a bug in the environment, so those rollouts
    are failed (``reward_error``), counted and reported, neither wrong nor quietly left out."""

    def reward(self, trajectory, episode):
        if episode.task.id == "test-1" and "Answer: 80" in trajectory.final_text:
            raise RuntimeError("grader crashed on this answer")
        return super().reward(trajectory, episode)


class JudgeDown(FlakyGrader):
    """The judge is down for task test-0's wrong answers: unscorable (not the policy's doing)."""

    def reward(self, trajectory, episode):
        if episode.task.id == "test-0" and "Answer: 80" in trajectory.final_text:
            raise UnscorableError("the judge service answered 503")
        return super().reward(trajectory, episode)


def _engine(say):
    # concurrency 1 runs jobs in order: right (3 calls), wrong (1 call), right, wrong, ...
    return ScriptedEngine([say(text) for text in [*GOOD, "Answer: 80"]], cycle=True)


def test_eval_reports_pass_at_k_and_resumes(qwen_tokenizer, say, tmp_path):
    environment = ToolEnvironment()
    tasks = environment.tasks(split="test")
    out = tmp_path / "eval.jsonl"
    common = dict(out=out, samples=3, concurrency=1, progress=False, sampling=SamplingParams(temperature=0))
    report, summary = run(evaluate(environment, _engine(say), qwen_tokenizer, tasks, **common))
    # test-0: right, wrong, right (c=2); test-1: wrong, right, wrong (c=1)
    assert summary.completed == 6 and summary.skipped == 0
    assert report["pass@k"]["1"] == pytest.approx((2 / 3 + 1 / 3) / 2)
    assert report["pass@k"]["2"] == pytest.approx((1 + 2 / 3) / 2)
    assert report["pass@k"]["3"] == pytest.approx(1.0)
    assert report["pass^k"]["2"] == pytest.approx((1 / 3 + 0) / 2)
    assert report["pass^k"]["3"] == 0.0
    assert report["mean_reward"] == pytest.approx(0.5)
    assert report["tools"]["add"]["calls"] == 3 and report["tools"]["multiply"]["calls"] == 3
    assert report["tokens"]["generated_total"] > 0 and report["latency_s"]["mean"] > 0
    # resumed: nothing runs again, the report is the same
    again, summary = run(evaluate(environment, ScriptedEngine([]), qwen_tokenizer, tasks, **common))
    assert summary.skipped == 6 and summary.completed == 0
    assert again["pass@k"] == report["pass@k"]
    # one more sample per task: only the two new rollouts run
    more, summary = run(
        evaluate(environment, _engine(say), qwen_tokenizer, tasks, **{**common, "samples": 4})
    )
    assert summary.skipped == 6 and summary.completed == 2
    assert set(more["pass@k"]) == {"1", "2", "3", "4"}


def test_unscored_samples_are_reported_not_counted_wrong(qwen_tokenizer, say, tmp_path):
    environment = FlakyGrader()
    tasks = environment.tasks(split="test")
    report, _ = run(
        evaluate(
            environment,
            _engine(say),
            qwen_tokenizer,
            tasks,
            out=tmp_path / "e.jsonl",
            samples=3,
            concurrency=1,
            progress=False,
        )
    )
    # test-1's two wrong samples crashed the grader: 1 scored sample, which was right
    assert report["unscored"] == 2 and report["scored"] == 4
    assert (report["failed"], report["unscorable"], report["failures"]) == (2, 0, {"reward_error": 2})
    assert report["coverage"] == pytest.approx(4 / 6)
    assert report["pass@k"]["1"] == pytest.approx((2 / 3 + 1.0) / 2)
    assert report["tasks_per_k"] == {"1": 2, "2": 1, "3": 1}
    assert report["mean_reward"] == pytest.approx(3 / 4)
    text = summary_text(report)  # every rate over fewer than all rollouts is marked, coverage beside it
    assert "2 failed (reward_error 2)" in text and "coverage 4/6 = 66.7%" in text
    assert "mean reward 0.750* | success rate 0.750*" in text
    assert "k=2: 1.000* (1/2 tasks)" in text and "* over 4 of 6 rollouts only" in text


def test_resume_runs_unscorable_and_failed_rollouts_again(qwen_tokenizer, say, tmp_path):
    tasks = ToolEnvironment().tasks(split="test")
    common = dict(out=tmp_path / "e.jsonl", samples=3, concurrency=1, progress=False)
    first, _ = run(evaluate(JudgeDown(), _engine(say), qwen_tokenizer, tasks, **common))
    # test-0 sample 1 was unscorable (judge down); test-1 samples 0 and 2 failed (reward_error)
    assert (first["scored"], first["unscorable"], first["failed"]) == (3, 1, 2)
    assert "*" in summary_text(first)
    again, summary = run(evaluate(ToolEnvironment(), _engine(say), qwen_tokenizer, tasks, **common))
    assert (summary.skipped, summary.completed) == (3, 3)  # exactly the three unscored ones ran again
    assert (again["scored"], again["unscorable"], again["failed"], again["coverage"]) == (6, 0, 0, 1.0)
    assert "*" not in summary_text(again)


class FirstTokenEven(ToolEnvironment):
    """Reward 1 when the model's first generated token id is even: a random model earns it about half
    the time, so pass@k and pass^k of real sampled rollouts are neither all 0 nor all 1."""

    def reward(self, trajectory, episode):
        first = next((t for t, m in zip(trajectory.token_ids, trajectory.loss_mask, strict=True) if m), None)
        return float(first is not None and first % 2 == 0)


@pytest.fixture(scope="module")
def checkpoints(qwen_tokenizer, tmp_path_factory):
    """Two tiny random Qwen3 checkpoints (saved with the tokenizer) standing in for base and trained."""
    models = {}
    for name, seed in (("base", 0), ("trained", 3)):
        directory = tmp_path_factory.mktemp(name)
        tiny_qwen3(seed=seed, hidden=32).save_pretrained(directory)
        qwen_tokenizer.save_pretrained(directory)
        models[name] = directory
    return models


def test_eval_command_on_the_embedded_engine_and_compare(checkpoints, tmp_path, capsys):
    from agentboost.eval.passk import pass_at_k, pass_hat_k
    from agentboost.rollout.results import read_results

    reports = {}
    for name, model in checkpoints.items():
        out = tmp_path / f"{name}.jsonl"
        args = ["eval", "--env", "test_eval:FirstTokenEven", "--model", str(model), "--samples", "3"]
        args += ["--temperature", "1.0", "--out", str(out), "--quiet", "--max-new-tokens", "6"]
        assert main(args) == 0
        printed = capsys.readouterr().out
        assert "pass@k  k=1:" in printed and "report ->" in printed
        report = reports[name] = load_report(tmp_path / f"{name}.json")
        # the report agrees with the estimators applied by hand to the rollouts on disk
        results = list(read_results(out))
        assert len(results) == 6 and report["rollouts"] == 6
        assert all(r.trajectory.generated_tokens > 0 for r in results)
        per_task = {}
        for result in results:
            per_task.setdefault(result.task_id, []).append(result.reward)
        for k in (1, 2, 3):
            expected = [pass_at_k(3, int(sum(rs)), k) for rs in per_task.values()]
            assert report["pass@k"][str(k)] == pytest.approx(sum(expected) / 2)
            expected = [pass_hat_k(3, int(sum(rs)), k) for rs in per_task.values()]
            assert report["pass^k"][str(k)] == pytest.approx(sum(expected) / 2)
        assert report["tokens"]["generated_total"] == sum(r.trajectory.generated_tokens for r in results)
        assert report["run"]["model"] == str(model) and report["run"]["engine"] == "local"
    # resuming the finished evaluation runs nothing and reports the same numbers
    out = tmp_path / "base.jsonl"
    args = [
        "eval",
        "--env",
        "test_eval:FirstTokenEven",
        "--model",
        str(checkpoints["base"]),
        "--samples",
        "3",
    ]
    assert main([*args, "--temperature", "1.0", "--out", str(out), "--quiet", "--max-new-tokens", "6"]) == 0
    assert "(6 rollouts resumed" in capsys.readouterr().out
    assert load_report(tmp_path / "base.json")["pass@k"] == reports["base"]["pass@k"]
    assert main(["eval", "--compare", str(tmp_path / "base.json"), str(tmp_path / "trained.json")]) == 0
    table = capsys.readouterr().out
    base, trained = reports["base"]["pass@k"]["1"], reports["trained"]["pass@k"]["1"]
    assert f"| pass@1 | {base:.3f} | {trained:.3f} | {trained - base:+.3f} |" in table
    assert "| mean reward |" in table and "| termination max_tokens (share) |" in table

    # every inspection command reads these embedded-engine results
    results_path = tmp_path / "trained.jsonl"
    assert (
        main(["stats", str(results_path), "-o", str(tmp_path / "stats"), "--plot", str(tmp_path / "png")])
        == 0
    )
    stats = json.loads((tmp_path / "stats.json").read_text())
    assert stats["summary"]["rollouts"] == 6
    assert stats["tables"]["terminations"]["rows"][0][:2] == ["max_tokens", 6]
    assert sorted(p.name for p in (tmp_path / "png").iterdir()) == [
        "reward_by_step.png",
        "terminations.png",
        "tool_calls_per_rollout.png",
    ]
    assert (
        main(
            [
                "view",
                str(results_path),
                "-o",
                str(tmp_path / "v.html"),
                "--tokenizer",
                str(checkpoints["base"]),
            ]
        )
        == 0
    )
    assert (tmp_path / "v.html").stat().st_size > 10_000
    assert main(["export", str(results_path), "-o", str(tmp_path / "t.parquet"), "--format", "parquet"]) == 0
    import pyarrow.parquet as pq

    rows = pq.read_table(tmp_path / "t.parquet").to_pylist()
    on_disk = list(read_results(results_path))
    assert [row["input_ids"] for row in rows] == [r.trajectory.token_ids for r in on_disk]
    assert [row["logprobs"] for row in rows] == [r.trajectory.logprobs for r in on_disk]


def test_compare_refuses_a_file_that_is_not_a_report(tmp_path, capsys):
    bogus = tmp_path / "x.json"
    bogus.write_text("{}")
    assert main(["eval", "--compare", str(bogus), str(bogus)]) == 2
    assert "not an agentboost eval report" in capsys.readouterr().err


def test_resuming_an_evaluation_with_other_settings_is_refused_and_leaves_the_file(
    checkpoints, tmp_path, capsys
):
    out = tmp_path / "e.jsonl"
    args = ["eval", "--env", "test_eval:FirstTokenEven", "--model", str(checkpoints["base"]), "-n", "1"]
    args += ["--out", str(out), "--quiet", "--max-new-tokens", "4"]
    assert main([*args, "--temperature", "1.0"]) == 0
    header = json.loads(out.read_text().splitlines()[0])
    assert header["run"]["sampling"]["temperature"] == 1.0
    assert header["run"]["model"] == str(checkpoints["base"]) and header["run"]["split"] == "test"
    before = out.read_bytes()
    capsys.readouterr()

    assert main([*args, "--temperature", "0.5"]) == 2  # not a silent mix of two sampling settings
    assert "temperature" in capsys.readouterr().err
    assert out.read_bytes() == before
    other_model = ["--model", str(checkpoints["trained"])]
    assert main([*args, *other_model, "--temperature", "1.0"]) == 2
    assert out.read_bytes() == before

    # more tasks or samples continue the same run; --allow-different-settings resumes knowingly
    assert main([*args, "--temperature", "1.0", "--samples", "2"]) == 0
    assert len(out.read_text().splitlines()) == 1 + 2
    assert main([*args, "--temperature", "0.5", "--allow-different-settings"]) == 0


@pytest.mark.parametrize(
    "bad",
    [["--concurrency", "0"], ["--samples", "0"], ["-n", "0"], ["--top-p", "0"], ["--temperature", "-1"]],
)
def test_eval_refuses_the_values_rollout_refuses(bad, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["eval", "--env", "arithmetic", *bad])
    assert exit_.value.code == 2
    assert bad[0] in capsys.readouterr().err
